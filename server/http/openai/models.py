"""GET /v1/models and /v1/models/{model}: the models with a SERVING version."""
from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from server.protocol.errors import Code, ServingError
from server.http.guard import OPENAI, Door, route
from server.http.openai.answers import json_answer
from server.protocol.types import ModelState, ModelStatus


def _serving(door: Door) -> dict[str, ModelStatus]:
    """name -> the status of its latest SERVING version (the one a request without a version reaches), and of each
    name still being built (state BUILDING: its stage in `reason`)."""
    return {s.name: s for s in door.plane.list_models()    # ascending versions
            if s.state in (ModelState.SERVING, ModelState.BUILDING)}


def _model_json(s: ModelStatus) -> dict[str, Any]:
    # task, version, variant (fp32, w4, ...) and state are ortserve's additions to OpenAI's model object; a model
    # being built has version 0 and its stage ("training 42% (log: ...)")
    answer = {"id": s.name, "object": "model", "created": 0, "owned_by": "ortserve", "task": s.task,
              "version": s.version, "variant": s.variant, "state": s.state.value}
    if s.state is ModelState.BUILDING:
        answer["stage"] = s.reason
    return answer


@route("ListModels", OPENAI)
async def list_models(door: Door, request: Request) -> Response:
    return json_answer({"object": "list", "data": [_model_json(s) for _, s in sorted(_serving(door).items())]})


@route("ModelInfo", OPENAI)
async def get_model(door: Door, request: Request) -> Response:
    name = request.path_params["model"]
    status = _serving(door).get(name)
    if status is None:
        raise ServingError(Code.NOT_FOUND, f"model: no SERVING model {name!r}")
    return json_answer(_model_json(status))
