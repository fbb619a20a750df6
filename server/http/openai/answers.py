"""What every OpenAI answer shares: finish reasons, the usage object, JSON encoding (msgspec: C code, and a
non-finite float becomes null instead of failing the answer)."""
from __future__ import annotations

from typing import Any

import msgspec
from starlette.responses import Response

from server.generation import Usage

FINISH = {"eos": "stop", "stop": "stop", "length": "length", "cancelled": "stop"}
_encode = msgspec.json.Encoder().encode


def encode(payload: Any) -> bytes:
    return _encode(payload)


def json_answer(payload: Any) -> Response:
    return Response(_encode(payload), media_type="application/json")


def usage(usages: list[Usage], n: int = 1) -> dict[str, Any]:
    """OpenAI's usage object over a request's completions, in choice order, n per prompt: each prompt counts
    once (as OpenAI counts it), every completion's tokens count; cached_tokens = prompt tokens found in the
    cache."""
    firsts = usages[::n]
    prompt, completion = sum(u.prompt_tokens for u in firsts), sum(u.completion_tokens for u in usages)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": sum(u.cached_prompt_tokens for u in firsts)}}
