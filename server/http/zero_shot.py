"""POST /v1/zero-shot-classification: candidate labels scored by an NLI classifier (server/encoders/zero_shot.py).

Body: {"model": str, "inputs": str | [str], "candidate_labels": [str] | "a, comma, separated, string",
"hypothesis_template": str (default "This example is {}."), "multi_label": bool, "truncate": bool}.
Answer: {"model", "version", "usage": {"total_tokens"}, "results": one per input of what transformers'
zero-shot-classification pipeline returns: {"sequence", "labels" (best first), "scores"}}. Errors in the OpenAI
error shape, like every /v1/ route.
"""
from __future__ import annotations

from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from server.http.body import deadline_from_headers
from server.http.decode import typed_body
from server.http.guard import OPENAI, Door, route
from server.http.openai.answers import json_answer
from server.protocol.zero_shot import ZeroShotRequest

PATH = "/v1/zero-shot-classification"


class ZeroShotBody(msgspec.Struct, kw_only=True):
    model: str
    inputs: str | list[Any]
    candidate_labels: str | list[Any]
    hypothesis_template: str | None = None
    multi_label: bool | None = None
    truncate: bool | None = None


@route("ZeroShotClassify", OPENAI)
async def zero_shot_classify(door: Door, request: Request) -> Response:
    body = await typed_body(request, door.max_body_bytes, ZeroShotBody)
    zero_shot = ZeroShotRequest.build(body.inputs, body.candidate_labels, body.hypothesis_template,
                                      bool(body.multi_label), bool(body.truncate), texts_field="inputs")
    result = await door.plane.zero_shot_classify(body.model, 0, zero_shot, deadline_from_headers(request))
    return json_answer({"model": result.model, "version": result.version, "usage": {"total_tokens": result.tokens},
                        "results": [{"sequence": r.sequence, "labels": r.labels, "scores": r.scores}
                                    for r in result.results]})


def routes() -> list[Route]:
    return [Route(PATH, zero_shot_classify, methods=["POST"])]
