"""POST /v1/token-classify: token-classification models (task "token-classify").

Body: {"model": str, "inputs": str | [str], "aggregation_strategy": "none" | "simple" | "first" | "average" |
"max" (default "none"), "ignore_labels": [str] (default ["O"]; [] keeps every label), "truncate": bool}.
Answer: {"model", "version", "aggregation_strategy", "labels", "results": one list per input of the entities
transformers' token-classification pipeline returns, under its keys: "entity" (or "entity_group" when grouped),
"score", "word", "start", "end" (character offsets into the input, end exclusive) and "index" (token position,
"none" only)}. Errors in the OpenAI error shape, like every /v1/ route.
"""
from __future__ import annotations

import asyncio
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from server.protocol.errors import ServingError
from server.http.body import deadline_from_headers
from server.http.decode import typed_body
from server.http.guard import OPENAI, Door, route
from server.http.openai.answers import encode
from server.protocol.types import TokenClassifyResult
from server.encoders.token_aggregation import INLINE_ENTITIES, as_pipeline_dict

PATH = "/v1/token-classify"


class TokenClassifyBody(msgspec.Struct, kw_only=True):
    model: str
    inputs: str | list[Any]
    aggregation_strategy: str | None = None
    ignore_labels: list[str] | None = None
    truncate: bool | None = None


def _texts(given: str | list[Any]) -> list[str]:
    texts = [given] if isinstance(given, str) else given
    if not texts:
        raise ServingError.invalid("inputs", "must not be an empty list")
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise ServingError.invalid(f"inputs[{i}]", "must be a string")
    return texts


@route("TokenClassify", OPENAI)
async def token_classify(door: Door, request: Request) -> Response:
    body = await typed_body(request, door.max_body_bytes, TokenClassifyBody)
    result = await door.plane.token_classify(body.model, 0, _texts(body.inputs), body.aggregation_strategy or "none",
                                             body.ignore_labels, bool(body.truncate), deadline_from_headers(request))
    if sum(len(entities) for entities in result.results) <= INLINE_ENTITIES:
        return Response(_answer(result), media_type="application/json")
    # Up to one entity per token of 1,024 texts: seconds of Python to build and encode, in a worker thread.
    return Response(await asyncio.to_thread(_answer, result), media_type="application/json")


def _answer(result: TokenClassifyResult) -> bytes:
    """The JSON answer, a text at a time: no encode holds the GIL for the whole answer, and each text's entities
    are released as soon as they are encoded (in the worker thread). Empties result.results."""
    strategy, rows = result.aggregation_strategy, result.results
    head = encode({"model": result.model, "version": result.version, "aggregation_strategy": strategy,
                   "labels": result.labels})
    parts = []
    for i, entities in enumerate(rows):
        parts.append(encode([as_pipeline_dict(e, strategy) for e in entities]))
        rows[i] = []
    return b"".join([head[:-1], b',"results":[', b",".join(parts), b"]}"])


def routes() -> list[Route]:
    return [Route(PATH, token_classify, methods=["POST"])]
