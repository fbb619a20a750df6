"""POST /tokenize and /detokenize, as vLLM serves them, for every model kind: an encoder's tokens (special tokens
included) or a generation model's prompt ids, and token ids back to text."""
from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from server.http.decode import typed_body
from server.http.guard import OPENAI, Door, route
from server.http.openai.answers import json_answer
from server.http.openai.protocol import DetokenizeRequest, TokenizeRequest, refuse_unsupported


@route("Tokenize", OPENAI)
async def tokenize(door: Door, request: Request) -> Response:
    """{model, prompt, return_token_strs?} -> {count, max_model_len, tokens, token_strs?} (vLLM's), and this
    server's `special` (a flag per token) and `offsets` ([start, stop) characters of the prompt per token)."""
    body = await typed_body(request, door.max_body_bytes, TokenizeRequest)
    refuse_unsupported(body)
    result = await door.plane.tokenize(body.model, 0, body.prompt)
    answer = {"count": len(result.tokens), "max_model_len": result.max_length, "tokens": result.ids}
    if body.return_token_strs:
        answer["token_strs"] = [t.text for t in result.tokens]
    answer["special"] = [t.special for t in result.tokens]
    answer["offsets"] = [[t.start, t.stop] for t in result.tokens]
    return json_answer(answer)


@route("Detokenize", OPENAI)
async def detokenize(door: Door, request: Request) -> Response:
    """{model, tokens} -> {prompt}."""
    body = await typed_body(request, door.max_body_bytes, DetokenizeRequest)
    return json_answer({"prompt": await door.plane.detokenize(body.model, 0, body.tokens)})
