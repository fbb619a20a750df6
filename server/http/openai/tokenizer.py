"""POST /tokenize and /detokenize, as vLLM serves them: a generation model's tokenizer (prompt <-> token ids)."""
from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from server.http.decode import typed_body
from server.http.guard import OPENAI, Door, route
from server.http.openai.answers import json_answer
from server.http.openai.protocol import DetokenizeRequest, TokenizeRequest, refuse_unsupported


@route("Tokenize", OPENAI)
async def tokenize(door: Door, request: Request) -> Response:
    """{model, prompt} -> {count, max_model_len, tokens}: the ids generation would run."""
    body = await typed_body(request, door.max_body_bytes, TokenizeRequest)
    refuse_unsupported(body)
    tokens = await door.plane.tokenize(body.model, 0, body.prompt)
    return json_answer({"count": len(tokens), "max_model_len": door.plane.model_info(body.model).max_length,
                        "tokens": tokens})


@route("Detokenize", OPENAI)
async def detokenize(door: Door, request: Request) -> Response:
    """{model, tokens} -> {prompt}."""
    body = await typed_body(request, door.max_body_bytes, DetokenizeRequest)
    return json_answer({"prompt": await door.plane.detokenize(body.model, 0, body.tokens)})
