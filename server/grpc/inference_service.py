"""inference.GRPCInferenceService (KServe v2, protos/grpc_service.proto): protobuf <-> data-plane calls."""
from __future__ import annotations

from typing import Any

import grpc
import numpy as np

import server
from protos import grpc_service_pb2 as pb
from protos import grpc_service_pb2_grpc as pb_grpc
from server.protocol.codecs import decode_tensor, encode_tensor
from server.protocol.errors import ServingError
from server.grpc.common import Instrumented, deadline_of, unary
from server.protocol.kserve import EXTENSIONS, parse_version
from server.protocol.types import DurationStat, InferResult, ModelMetadata, ModelStatistics, RepositoryEntry

# ---------------------------------------------------------------------- protobuf -> arguments


def parameter_value(p: pb.InferParameter) -> Any:
    kind = p.WhichOneof("parameter_choice")
    return None if kind is None else getattr(p, kind)


def infer_inputs(request: pb.ModelInferRequest, max_bytes_elements: int) -> dict[str, np.ndarray]:
    raw = request.raw_input_contents
    if raw and len(raw) != len(request.inputs):
        raise ServingError.invalid("raw_input_contents",
                                   f"{len(raw)} entries for {len(request.inputs)} inputs (one per input)")
    arrays: dict[str, np.ndarray] = {}
    for i, tensor in enumerate(request.inputs):
        if tensor.name in arrays:
            raise ServingError.invalid(f"inputs[{i}].name", f"duplicate input {tensor.name!r}")
        arrays[tensor.name] = decode_tensor(tensor.name, tensor.datatype, list(tensor.shape),
                                            raw[i] if raw else None, tensor.contents, f"inputs[{i}]",
                                            max_bytes_elements)
    return arrays


# ---------------------------------------------------------------------- results -> protobuf


def infer_response(request: pb.ModelInferRequest, result: InferResult) -> pb.ModelInferResponse:
    response = pb.ModelInferResponse(model_name=request.model_name, model_version=str(result.version), id=request.id)
    for name, array in result.outputs.items():
        datatype, shape, data = encode_tensor(array)
        response.outputs.add(name=name, datatype=datatype, shape=shape)
        response.raw_output_contents.append(data)
    return response


def metadata_response(m: ModelMetadata) -> pb.ModelMetadataResponse:
    response = pb.ModelMetadataResponse(name=m.name, platform=m.platform, versions=[str(v) for v in m.versions])
    for t in m.inputs:
        response.inputs.add(name=t.name, datatype=t.datatype, shape=t.shape)
    for t in m.outputs:
        response.outputs.add(name=t.name, datatype=t.datatype, shape=t.shape)
    return response


def _duration(d: DurationStat) -> pb.StatisticDuration:
    return pb.StatisticDuration(count=d.count, ns=d.ns)


def statistics_response(stats: list[ModelStatistics]) -> pb.ModelStatisticsResponse:
    response = pb.ModelStatisticsResponse()
    for s in stats:
        item = response.model_stats.add(name=s.name, version=str(s.version), last_inference=s.last_inference_ms,
                                         inference_count=s.inference_count, execution_count=s.execution_count)
        item.inference_stats.success.CopyFrom(_duration(s.success))
        item.inference_stats.fail.CopyFrom(_duration(s.fail))
        item.inference_stats.queue.CopyFrom(_duration(s.queue))
        item.inference_stats.compute_infer.CopyFrom(_duration(s.compute_infer))
        for b in s.batches:
            item.batch_stats.add(batch_size=b.batch_size, compute_infer=_duration(b.compute_infer))
    return response


def index_response(entries: list[RepositoryEntry]) -> pb.RepositoryIndexResponse:
    response = pb.RepositoryIndexResponse()
    for e in entries:
        response.models.add(name=e.name, version="" if e.version is None else str(e.version), state=e.state.value,
                            reason=e.reason)
    return response


# ---------------------------------------------------------------------- the service


class KServeServicer(Instrumented, pb_grpc.GRPCInferenceServiceServicer):
    @unary("ServerLive", model_field="")
    async def ServerLive(self, request: pb.ServerLiveRequest, context: grpc.aio.ServicerContext) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    @unary("ServerReady", model_field="")
    async def ServerReady(self, request: pb.ServerReadyRequest,
                          context: grpc.aio.ServicerContext) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self.plane.ready)

    @unary("ModelReady", model_field="name")
    async def ModelReady(self, request: pb.ModelReadyRequest, context: grpc.aio.ServicerContext) -> pb.ModelReadyResponse:
        return pb.ModelReadyResponse(ready=self.plane.model_ready(request.name, parse_version(request.version)))

    @unary("ServerMetadata", model_field="")
    async def ServerMetadata(self, request: pb.ServerMetadataRequest,
                             context: grpc.aio.ServicerContext) -> pb.ServerMetadataResponse:
        return pb.ServerMetadataResponse(name="ortserve", version=server.__version__, extensions=EXTENSIONS)

    @unary("ModelMetadata", model_field="name")
    async def ModelMetadata(self, request: pb.ModelMetadataRequest,
                            context: grpc.aio.ServicerContext) -> pb.ModelMetadataResponse:
        return metadata_response(self.plane.model_metadata(request.name, parse_version(request.version)))

    @unary("ModelInfer", model_field="model_name")
    async def ModelInfer(self, request: pb.ModelInferRequest, context: grpc.aio.ServicerContext) -> pb.ModelInferResponse:
        version = parse_version(request.model_version, "model_version")
        parameters = {k: parameter_value(v) for k, v in request.parameters.items()}
        result = await self.plane.model_infer(request.model_name, version,
                                              infer_inputs(request, self.plane.max_bytes_elements),
                                              [o.name for o in request.outputs] or None, parameters,
                                              deadline_of(context))
        return infer_response(request, result)

    @unary("ModelStatistics", model_field="name")
    async def ModelStatistics(self, request: pb.ModelStatisticsRequest,
                              context: grpc.aio.ServicerContext) -> pb.ModelStatisticsResponse:
        return statistics_response(self.plane.statistics(request.name, parse_version(request.version)))

    @unary("RepositoryIndex", model_field="")
    async def RepositoryIndex(self, request: pb.RepositoryIndexRequest,
                              context: grpc.aio.ServicerContext) -> pb.RepositoryIndexResponse:
        return index_response(self.plane.repository_index(ready_only=request.ready))

    @unary("RepositoryModelLoad", model_field="model_name")
    async def RepositoryModelLoad(self, request: pb.RepositoryModelLoadRequest,
                                  context: grpc.aio.ServicerContext) -> pb.RepositoryModelLoadResponse:
        await self.plane.load_model(request.model_name)
        return pb.RepositoryModelLoadResponse()

    @unary("RepositoryModelUnload", model_field="model_name")
    async def RepositoryModelUnload(self, request: pb.RepositoryModelUnloadRequest,
                                    context: grpc.aio.ServicerContext) -> pb.RepositoryModelUnloadResponse:
        await self.plane.unload_model(request.model_name)
        return pb.RepositoryModelUnloadResponse()
