"""POST /v1/embeddings: embedding models (task "embed"); float or base64 vectors."""
from __future__ import annotations

import base64
from typing import Any

import numpy as np
from starlette.requests import Request
from starlette.responses import Response

from server.protocol.errors import ServingError
from server.http.body import deadline_from_headers
from server.http.decode import typed_body
from server.http.guard import OPENAI, Door, route
from server.http.openai.answers import json_answer
from server.http.openai.protocol import EmbeddingRequest, refuse_unsupported


def _inputs(given: str | list[Any]) -> list[str]:
    texts = [given] if isinstance(given, str) else given
    if not texts:
        raise ServingError.invalid("input", "must not be an empty list")
    if not all(isinstance(t, str) for t in texts):
        raise ServingError.invalid("input", "token-id inputs are not supported: send text (a string or a list of "
                                            "strings)")
    return texts


@route("Embeddings", OPENAI)
async def embeddings(door: Door, request: Request) -> Response:
    body = await typed_body(request, door.max_body_bytes, EmbeddingRequest)
    model, texts = body.model, _inputs(body.input)
    encoding = body.encoding_format or "float"
    if encoding not in ("float", "base64"):
        raise ServingError.invalid("encoding_format", f"must be float or base64, got {encoding!r}")
    refuse_unsupported(body)
    result = await door.plane.embed(model, 0, texts, bool(body.truncate), deadline_from_headers(request),
                                    body.dimensions, body.prompt_name)
    vectors = result.embeddings
    if encoding == "base64":
        rows: list[Any] = [base64.b64encode(np.ascontiguousarray(v, dtype="<f4").tobytes()).decode() for v in vectors]
    else:
        rows = vectors.tolist()
    tokens = sum(result.token_counts)
    return json_answer({"object": "list", "model": model,
                        "data": [{"object": "embedding", "index": i, "embedding": row} for i, row in enumerate(rows)],
                        "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})
