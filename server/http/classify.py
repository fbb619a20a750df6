"""POST /v1/classify (ours) and /predict (text-embeddings-inference's shape): sequence classification of texts or
text pairs, one data-plane call each.

/v1/classify  {"model", "inputs": str | [str | [text, text_pair]], "top_k": int (0 = every label),
              "truncate": bool, "function_to_apply": "softmax" | "sigmoid" | "none"} ->
              {"model", "version", "labels", "results": one list per input of {"label", "score"}, best first}.
              Errors in the OpenAI error shape, like every /v1/ route.
/predict      TEI's: {"model" (TEI serves one model; this server many: name it), "inputs": str | [text, text_pair] |
              [[text] | [text, text_pair], ...], "raw_scores": bool, "truncate": bool, and our
              "function_to_apply"} -> [{"score", "label"}] best first for one input, a list of those for a batch;
              errors as {"error": message}. raw_scores is function_to_apply "none" (both given must agree).

Scores take the package's recorded head activation unless the request names another (server/encoders/activation.py).
"""
from __future__ import annotations

from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from server.http.body import deadline_from_headers
from server.http.decode import typed_body
from server.http.guard import KSERVE, OPENAI, Door, route
from server.http.openai.answers import json_answer
from server.protocol.errors import ServingError
from server.protocol.types import ClassifyResult

PATH, TEI_PATH = "/v1/classify", "/predict"


class _Body(msgspec.Struct, kw_only=True):
    model: str
    inputs: str | list[Any]
    truncate: bool | None = None
    function_to_apply: str | None = None


class ClassifyBody(_Body, kw_only=True):
    top_k: int | None = None


class PredictBody(_Body, kw_only=True):
    raw_scores: bool | None = None


def _input(item: Any, field: str) -> tuple[str, str | None]:
    """A text, or a [text, text_pair] list."""
    if isinstance(item, str):
        return item, None
    if isinstance(item, list) and len(item) in (1, 2) and all(isinstance(x, str) for x in item):
        return item[0], item[1] if len(item) == 2 else None
    raise ServingError.invalid(field, "must be a string or a [text, text_pair] list of strings")


def _inputs(given: str | list[Any]) -> list[tuple[str, str | None]]:
    items = [given] if isinstance(given, str) else given
    if not items:
        raise ServingError.invalid("inputs", "must not be an empty list")
    return [_input(item, f"inputs[{i}]") for i, item in enumerate(items)]


def _label_scores(result: ClassifyResult) -> list[list[dict[str, Any]]]:
    return [[{"label": s.label, "score": s.score} for s in r.scores] for r in result.results]


@route("Classify", OPENAI)
async def classify(door: Door, request: Request) -> Response:
    body = await typed_body(request, door.max_body_bytes, ClassifyBody)
    result = await door.plane.classify(body.model, 0, _inputs(body.inputs), body.top_k or 0, bool(body.truncate),
                                       deadline_from_headers(request), body.function_to_apply)
    return json_answer({"model": result.model, "version": result.version, "labels": result.labels,
                        "results": _label_scores(result)})


def _predict_inputs(given: str | list[Any]) -> tuple[list[tuple[str, str | None]], bool]:
    """TEI's input forms: one text, one [text, text_pair], or a batch of [text] / [text, text_pair] lists (True)."""
    if isinstance(given, str) or (given and all(isinstance(x, str) for x in given)):
        return [_input(given, "inputs")], False
    if not given:
        raise ServingError.invalid("inputs", "must not be an empty list")
    return [_input(item, f"inputs[{i}]") for i, item in enumerate(given)], True


@route("Predict", KSERVE)
async def predict(door: Door, request: Request) -> Response:
    body = await typed_body(request, door.max_body_bytes, PredictBody)
    function = body.function_to_apply
    if body.raw_scores and function not in (None, "", "none"):
        raise ServingError.invalid("raw_scores", f"asks for the logits and function_to_apply for {function!r}: "
                                                 "give one")
    inputs, batch = _predict_inputs(body.inputs)
    result = await door.plane.classify(body.model, 0, inputs, 0, bool(body.truncate), deadline_from_headers(request),
                                       "none" if body.raw_scores else function)
    answers = [[{"score": s["score"], "label": s["label"]} for s in row] for row in _label_scores(result)]
    return json_answer(answers if batch else answers[0])


def routes() -> list[Route]:
    return [Route(PATH, classify, methods=["POST"]), Route(TEI_PATH, predict, methods=["POST"])]
