"""POST /embed: text-embeddings-inference's embedding route, for embedding models (task "embed").

Body (TEI's names): {"model": str (TEI serves one model; this server serves many: name it), "inputs": str | [str],
"normalize": bool (default true), "truncate": bool, "prompt_name": str (one of the model's prompts; else its
default, server/encoders/prompts.py), "dimensions": int (Matryoshka models), "truncation_direction": "Right"}.
Answer: one list of floats per input, in order. Errors as {"error": message}, like TEI's /rerank here.

normalize: true L2-normalizes vectors the model leaves unnormalized; false is refused naming `normalize` for a
model whose graph normalizes (its vectors before that step are not in the package).
"""
from __future__ import annotations

from typing import Any, ClassVar

import msgspec
import numpy as np
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from server.protocol.errors import ServingError
from server.http.body import deadline_from_headers
from server.http.decode import typed_body
from server.http.guard import KSERVE, Door, route
from server.http.openai.answers import json_answer
from server.http.openai.protocol import refuse_unsupported

PATH = "/embed"


class TeiEmbedRequest(msgspec.Struct, kw_only=True):
    model: str
    inputs: str | list[Any]
    # what TEI's /embed takes besides (None: TEI's default)
    normalize: bool | None = None
    truncate: bool | None = None
    truncation_direction: Any = msgspec.UNSET
    # sentence-transformers' prompts and Matryoshka length
    prompt_name: str | None = None
    dimensions: int | None = None

    UNSUPPORTED: ClassVar[dict[str, tuple[Any, ...]]] = {"truncation_direction": ("Right", "right")}


def _texts(given: str | list[Any]) -> list[str]:
    """TEI's `inputs`: one string or a non-empty list of strings."""
    texts = [given] if isinstance(given, str) else list(given)
    wrong = [i for i, t in enumerate(texts) if not isinstance(t, str)]
    if wrong:
        raise ServingError.invalid(f"inputs[{wrong[0]}]", "must be a string (token-id inputs are not supported)")
    if not texts:
        raise ServingError.invalid("inputs", "must not be an empty list")
    return texts


@route("TeiEmbed", KSERVE)
async def tei_embed(door: Door, request: Request) -> Response:
    body = await typed_body(request, door.max_body_bytes, TeiEmbedRequest)
    refuse_unsupported(body)
    result = await door.plane.embed(body.model, 0, _texts(body.inputs), bool(body.truncate),
                                    deadline_from_headers(request), body.dimensions, body.prompt_name)
    vectors = np.asarray(result.embeddings, dtype=np.float32)
    if body.normalize is False and result.normalized:
        raise ServingError.invalid("normalize", f"{body.model!r} normalizes inside its graph: false cannot be "
                                                "answered")
    if body.normalize is not False and not result.normalized:
        norms = np.linalg.norm(vectors.astype(np.float64), axis=1, keepdims=True)
        vectors = (vectors / np.where(norms > 0, norms, 1.0)).astype(np.float32)
    return json_answer(vectors.tolist())


def routes() -> list[Route]:
    return [Route(PATH, tei_embed, methods=["POST"])]
