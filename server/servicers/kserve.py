"""inference.GRPCInferenceService (KServe v2, protos/grpc_service.proto) over the data plane."""
from __future__ import annotations

from typing import Any

import grpc
import numpy as np

import server
from protos import grpc_service_pb2 as pb
from protos import grpc_service_pb2_grpc as pb_grpc
from server.codecs import decode_tensor, encode_tensor
from server.errors import Code, ServingError
from server.model import ServedModel
from server.servicers.common import Instrumented, deadline_of, unary
from server.stats import Duration
from server.types import ModelState

PLATFORM = "onnxruntime_onnx"
EXTENSIONS = ["model_repository", "statistics", "parameters"]


def parse_version(text: str, field: str = "version") -> int:
    """KServe versions are strings; "" = the latest."""
    if not text:
        return 0
    if not (text.isascii() and text.isdigit()) or int(text) < 1:  # str.isdigit() also accepts '²', which int() refuses
        raise ServingError.invalid(field, f"must be a positive integer or empty, got {text!r}")
    return int(text)


def parameter_value(p: pb.InferParameter) -> Any:
    kind = p.WhichOneof("parameter_choice")
    return None if kind is None else getattr(p, kind)


def _duration(d: Duration) -> pb.StatisticDuration:
    return pb.StatisticDuration(count=d.count, ns=d.ns)


class KServeServicer(Instrumented, pb_grpc.GRPCInferenceServiceServicer):
    # ------------------------------------------------------------------ health and metadata

    @unary("ServerLive", model_field="")
    async def ServerLive(self, request: pb.ServerLiveRequest, context: grpc.aio.ServicerContext) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    @unary("ServerReady", model_field="")
    async def ServerReady(self, request: pb.ServerReadyRequest,
                          context: grpc.aio.ServicerContext) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self.plane.ready)

    @unary("ModelReady", model_field="name")
    async def ModelReady(self, request: pb.ModelReadyRequest, context: grpc.aio.ServicerContext) -> pb.ModelReadyResponse:
        version = parse_version(request.version)
        self.plane.repository.model_dir(request.name, "name")
        model = self.plane.repository.find(request.name, version)
        return pb.ModelReadyResponse(ready=bool(model and model.serving and not self.plane.draining))

    @unary("ServerMetadata", model_field="")
    async def ServerMetadata(self, request: pb.ServerMetadataRequest,
                             context: grpc.aio.ServicerContext) -> pb.ServerMetadataResponse:
        return pb.ServerMetadataResponse(name="ortserve", version=server.__version__, extensions=EXTENSIONS)

    @unary("ModelMetadata", model_field="name")
    async def ModelMetadata(self, request: pb.ModelMetadataRequest,
                            context: grpc.aio.ServicerContext) -> pb.ModelMetadataResponse:
        version = parse_version(request.version)
        self.plane.repository.model_dir(request.name, "name")
        model = self.plane.repository.find(request.name, version)
        if model is None:
            raise ServingError(Code.NOT_FOUND, f"name: unknown model {request.name!r}"
                                               + (f" version {version}" if version else ""))
        if model.loaded is None:
            why = f": {model.reason}" if model.reason else ""
            raise ServingError(Code.UNAVAILABLE,
                               f"model {model.name!r} version {model.version} is {model.state.value}{why}")
        response = pb.ModelMetadataResponse(name=model.name, platform=PLATFORM,
                                            versions=[str(v) for v in self.plane.repository.versions(model.name)])
        for spec in model.loaded.inputs:
            response.inputs.add(name=spec.name, datatype=spec.datatype, shape=spec.metadata_shape)
        for spec in model.loaded.outputs:
            response.outputs.add(name=spec.name, datatype=spec.datatype, shape=spec.metadata_shape)
        return response

    # ------------------------------------------------------------------ inference

    @unary("ModelInfer", model_field="model_name")
    async def ModelInfer(self, request: pb.ModelInferRequest, context: grpc.aio.ServicerContext) -> pb.ModelInferResponse:
        version = parse_version(request.model_version, "model_version")
        raw = request.raw_input_contents
        if raw and len(raw) != len(request.inputs):
            raise ServingError.invalid("raw_input_contents",
                                       f"{len(raw)} entries for {len(request.inputs)} inputs (one per input)")
        arrays: dict[str, np.ndarray] = {}
        for i, tensor in enumerate(request.inputs):
            if tensor.name in arrays:
                raise ServingError.invalid(f"inputs[{i}].name", f"duplicate input {tensor.name!r}")
            arrays[tensor.name] = decode_tensor(tensor.name, tensor.datatype, list(tensor.shape),
                                                raw[i] if raw else None, tensor.contents, f"inputs[{i}]")
        outputs = [o.name for o in request.outputs] or None
        parameters = {k: parameter_value(v) for k, v in request.parameters.items()}
        served_version, result = await self.plane.infer_versioned(
            request.model_name, version, arrays, outputs, parameters, deadline_of(context))
        response = pb.ModelInferResponse(model_name=request.model_name, model_version=str(served_version),
                                         id=request.id)
        for name, array in result.items():
            datatype, shape, data = encode_tensor(array)
            response.outputs.add(name=name, datatype=datatype, shape=shape)
            response.raw_output_contents.append(data)
        return response

    # ------------------------------------------------------------------ statistics and repository

    @unary("ModelStatistics", model_field="name")
    async def ModelStatistics(self, request: pb.ModelStatisticsRequest,
                              context: grpc.aio.ServicerContext) -> pb.ModelStatisticsResponse:
        version = parse_version(request.version)
        models: list[ServedModel]
        if request.name:
            self.plane.repository.model_dir(request.name, "name")
            models = [m for m in self.plane.repository.models() if m.name == request.name
                      and (not version or m.version == version)]
            if not models:
                raise ServingError(Code.NOT_FOUND, f"name: unknown model {request.name!r}"
                                                   + (f" version {version}" if version else ""))
        else:
            models = [m for m in self.plane.repository.models() if m.state is not ModelState.UNLOADED]
        response = pb.ModelStatisticsResponse()
        for m in models:
            s = m.stats
            with s._lock:
                item = response.model_stats.add(
                    name=m.name, version=str(m.version), last_inference=s.last_inference_ms,
                    inference_count=s.inference_count, execution_count=s.execution_count)
                stats = item.inference_stats
                stats.success.CopyFrom(_duration(s.success))
                stats.fail.CopyFrom(_duration(s.fail))
                stats.queue.CopyFrom(_duration(s.queue))
                stats.compute_infer.CopyFrom(_duration(s.compute_infer))
                for size, d in sorted(s.batches.items()):
                    item.batch_stats.add(batch_size=size, compute_infer=_duration(d))
        return response

    @unary("RepositoryIndex", model_field="")
    async def RepositoryIndex(self, request: pb.RepositoryIndexRequest,
                              context: grpc.aio.ServicerContext) -> pb.RepositoryIndexResponse:
        response = pb.RepositoryIndexResponse()
        known = set()
        for s in self.plane.list_models():
            known.add(s.name)
            if request.ready and s.state is not ModelState.SERVING:
                continue
            response.models.add(name=s.name, version=str(s.version), state=s.state.value, reason=s.reason)
        if not request.ready:
            for name, versions in sorted(self.plane.repository.scan().items()):
                if name not in known:  # on disk, never loaded (e.g. appeared since the last poll)
                    response.models.add(name=name, version=str(versions[-1]) if versions else "",
                                        state=ModelState.UNLOADED.value, reason="not loaded")
        return response

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
