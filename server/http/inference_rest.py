"""KServe v2 REST (the open inference protocol's HTTP side), converters over the data plane.

    GET  /v2                                       server metadata
    GET  /v2/health/live | /v2/health/ready        open (no token), like grpc.health.v1
    GET  /v2/models/{model}[/versions/{v}]         model metadata
    GET  /v2/models/{model}[/versions/{v}]/ready   200 ready, 503 not
    POST /v2/models/{model}[/versions/{v}]/infer   JSON tensors and/or Triton's binary extension; text mode
    GET  /v2/models[/{model}[/versions/{v}]]/stats statistics extension
    POST /v2/repository/index                      repository extension
    POST /v2/repository/models/{model}/load|unload

The same text mode as gRPC (server/protocol/kserve.py): BYTES `text` / `prompt` inputs run the task.
"""
from __future__ import annotations

import asyncio
import json
import time
import zlib
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

import server
from server.protocol.errors import Code, ServingError
from server.http.guard import KSERVE, Door, route
from server.http.body import deadline_from_headers, field, parse_json, read_body, require_content_type
from server.http.errors import HttpError
from server.http.tensors import HEADER_LENGTH, decode_request, encode_response, header_length, split_body
from server.protocol.jsontext import ValueCounter
from server.protocol.kserve import EXTENSIONS, parse_version
from server.protocol.types import ModelMetadata, ModelStatistics

INFER_TYPES = ("application/json", "application/octet-stream")


def _version(request: Request) -> int:
    return parse_version(request.path_params.get("version", ""), "version")


def _ok(body: Any = None, status: int = 200) -> Response:
    return JSONResponse(body if body is not None else {}, status_code=status)


# ---------------------------------------------------------------------- server


@route("ServerMetadata", KSERVE)
async def server_metadata(door: Door, request: Request) -> Response:
    return _ok({"name": "ortserve", "version": server.__version__, "extensions": EXTENSIONS})


@route("ServerLive", KSERVE, open_route=True)
async def live(door: Door, request: Request) -> Response:
    return _ok({"live": True})


@route("ServerReady", KSERVE, open_route=True)
async def ready(door: Door, request: Request) -> Response:
    ok = door.plane.ready
    return _ok({"ready": ok}, 200 if ok else 503)


# ---------------------------------------------------------------------- models


def metadata_json(m: ModelMetadata) -> dict[str, Any]:
    return {"name": m.name, "versions": [str(v) for v in m.versions], "platform": m.platform,
            "inputs": [{"name": t.name, "datatype": t.datatype, "shape": t.shape} for t in m.inputs],
            "outputs": [{"name": t.name, "datatype": t.datatype, "shape": t.shape} for t in m.outputs]}


@route("ModelMetadata", KSERVE)
async def model_metadata(door: Door, request: Request) -> Response:
    return _ok(metadata_json(door.plane.model_metadata(request.path_params["model"], _version(request), "model")))


@route("ModelReady", KSERVE)
async def model_ready(door: Door, request: Request) -> Response:
    name = request.path_params["model"]
    ok = door.plane.model_ready(name, _version(request), "model")
    if not ok and door.plane.model_health(name) is None:
        raise ServingError(Code.NOT_FOUND, f"model: unknown model {name!r}")
    return _ok({"name": name, "ready": ok}, 200 if ok else 503)


def _decompress(body: bytes, encoding: str | None, limit: int) -> bytes:
    """A gzip / deflate request body (tritonclient's request_compression_algorithm), bounded by `limit`."""
    if not encoding or encoding == "identity":
        return body
    if encoding not in ("gzip", "deflate"):
        raise HttpError(415, f"content-encoding: {encoding!r} is not supported (gzip, deflate)")
    inflater = zlib.decompressobj(wbits=31 if encoding == "gzip" else 15)
    try:
        data = inflater.decompress(body, limit + 1)
    except zlib.error as exc:
        raise HttpError(400, f"content-encoding: the body is not valid {encoding}: {exc}") from None
    if len(data) > limit or inflater.unconsumed_tail:
        raise HttpError(413, f"body: more than {limit} bytes once decompressed (--max-message-bytes)")
    return data


def _inflate(body: bytes, encoding: str, limit: int, length: int | None) -> bytes:
    """_decompress, then the JSON header's values bounded (counted in slices: this runs in a worker thread, and
    the event loop's thread takes the GIL back between them)."""
    data = _decompress(body, encoding, limit)
    header = memoryview(data)[:len(data) if length is None else length]
    counter = ValueCounter("inference header")
    for start in range(0, len(header), 1 << 20):
        counter.add(bytes(header[start:start + (1 << 20)]))
    return data


def _deadline(request: Request, parameters: dict[str, Any]) -> float | None:
    """The earlier of the timeout header and Triton's `timeout` request parameter (microseconds)."""
    deadline = deadline_from_headers(request)
    micros = field(parameters, "timeout", int, 0, prefix="parameters.")
    if micros < 0:
        raise ServingError.invalid("parameters.timeout", f"must be >= 0 microseconds, got {micros}")
    if micros:
        mine = time.monotonic() + micros / 1e6
        deadline = mine if deadline is None else min(deadline, mine)
    return deadline


@route("ModelInfer", KSERVE)
async def infer(door: Door, request: Request) -> Response:
    require_content_type(request, INFER_TYPES, missing_ok=True)
    length = header_length(request.headers.get(HEADER_LENGTH))
    encoding = request.headers.get("content-encoding")
    compressed = bool(encoding) and encoding != "identity"
    # The JSON header's values are bounded while it arrives (a compressed one once inflated).
    body = await read_body(request, door.max_body_bytes, json_prefix=0 if compressed else length)
    if compressed:   # (zlib releases the GIL: inflating up to the size limit off the event loop)
        body = await asyncio.get_running_loop().run_in_executor(None, _inflate, body, encoding, door.max_body_bytes,
                                                                length)
    header, binary = split_body(body, length)
    parsed = decode_request(parse_json(header, "inference header"), binary, door.plane.max_bytes_elements)
    model = request.path_params["model"]
    parameters = dict(parsed.parameters)
    # JSON carries the list / object itself; gRPC parameters carry it as text.
    if isinstance(parameters.get("stop"), list):
        parameters["stop"] = json.dumps(parameters["stop"])
    if isinstance(parameters.get("logit_bias"), dict):
        parameters["logit_bias"] = json.dumps(parameters["logit_bias"])
    result = await door.plane.model_infer(model, _version(request), parsed.inputs, parsed.outputs, parameters,
                                          _deadline(request, parameters))
    content, answer_header = encode_response(parsed, model, result.version, result.outputs)
    if answer_header is None:
        return Response(content, media_type="application/json")
    return Response(content, media_type="application/octet-stream",
                    headers={"Inference-Header-Content-Length": str(answer_header)})


# ---------------------------------------------------------------------- extensions


def _duration(d: Any) -> dict[str, int]:
    return {"count": d.count, "ns": d.ns}


def statistics_json(stats: list[ModelStatistics]) -> dict[str, Any]:
    return {"model_stats": [{
        "name": s.name, "version": str(s.version), "last_inference": s.last_inference_ms,
        "inference_count": s.inference_count, "execution_count": s.execution_count,
        "inference_stats": {"success": _duration(s.success), "fail": _duration(s.fail), "queue": _duration(s.queue),
                            "compute_infer": _duration(s.compute_infer)},
        "batch_stats": [{"batch_size": b.batch_size, "compute_infer": _duration(b.compute_infer)} for b in s.batches],
    } for s in stats]}


@route("ModelStatistics", KSERVE)
async def statistics(door: Door, request: Request) -> Response:
    name = request.path_params.get("model", "")
    return _ok(statistics_json(door.plane.statistics(name, _version(request), "model")))


async def _optional_object(request: Request, door: Door) -> dict[str, Any]:
    """A POST body that may be empty (tritonclient sends none for some calls)."""
    data = await read_body(request, door.max_body_bytes)
    if not data.strip():
        return {}
    body = parse_json(data)
    if not isinstance(body, dict):
        raise HttpError(400, f"body: must be a JSON object, got {type(body).__name__}")
    return body


@route("RepositoryIndex", KSERVE)
async def repository_index(door: Door, request: Request) -> Response:
    body = await _optional_object(request, door)
    entries = door.plane.repository_index(ready_only=field(body, "ready", bool, False))
    return _ok([{"name": e.name, "version": "" if e.version is None else str(e.version), "state": e.state.value,
                 "reason": e.reason} for e in entries])


@route("RepositoryModelLoad", KSERVE)
async def load(door: Door, request: Request) -> Response:
    await _optional_object(request, door)
    await door.plane.load_model(request.path_params["model"])
    return _ok()


@route("RepositoryModelUnload", KSERVE)
async def unload(door: Door, request: Request) -> Response:
    await _optional_object(request, door)
    await door.plane.unload_model(request.path_params["model"])
    return _ok()


def routes() -> list[Route]:
    m = "/v2/models/{model}"
    mv = "/v2/models/{model}/versions/{version}"
    return [
        Route("/v2", server_metadata, methods=["GET"]),
        Route("/v2/health/live", live, methods=["GET"]),
        Route("/v2/health/ready", ready, methods=["GET"]),
        Route("/v2/models/stats", statistics, methods=["GET"]),
        Route("/v2/repository/index", repository_index, methods=["POST"]),
        Route("/v2/repository/models/{model}/load", load, methods=["POST"]),
        Route("/v2/repository/models/{model}/unload", unload, methods=["POST"]),
        *(r for base in (m, mv) for r in (
            Route(base, model_metadata, methods=["GET"]),
            Route(base + "/ready", model_ready, methods=["GET"]),
            Route(base + "/infer", infer, methods=["POST"]),
            Route(base + "/stats", statistics, methods=["GET"]))),
    ]

