"""GET /v1/models and /v1/models/{model}: the models with a SERVING version."""
from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from server.errors import Code, ServingError
from server.http.guard import OPENAI, Door, route
from server.http.openai.answers import json_answer
from server.types import ModelState


def _serving(door: Door) -> dict[str, str]:
    """name -> task of every model with a SERVING version."""
    return {s.name: s.task for s in door.plane.list_models() if s.state is ModelState.SERVING}


def _model_json(name: str, task: str) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": 0, "owned_by": "ortserve", "task": task}


@route("ListModels", OPENAI)
async def list_models(door: Door, request: Request) -> Response:
    return json_answer({"object": "list", "data": [_model_json(n, t) for n, t in sorted(_serving(door).items())]})


@route("ModelInfo", OPENAI)
async def get_model(door: Door, request: Request) -> Response:
    name = request.path_params["model"]
    task = _serving(door).get(name)
    if task is None:
        raise ServingError(Code.NOT_FOUND, f"model: no SERVING model {name!r}")
    return json_answer(_model_json(name, task))
