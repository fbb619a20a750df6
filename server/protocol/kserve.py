"""KServe v2 as both front doors speak it (gRPC server/grpc/inference_service.py, REST server/http/inference_rest.py): the
version-string rule, the extensions served, and ModelInfer's "text mode" over the data plane's task calls.

A request whose inputs are all BYTES tensors named as below (for the model's task) runs the task instead of
the graph; anything else goes to the graph (DataPlane.infer). Request parameters: `truncate` (bool);
for generate the GenerationParameters by name, and `stop` as a JSON list of strings.

    classify   text [, text_pair]  ->  label (BYTES), score (FP32), probabilities (FP32 [n, labels])
    fill-mask  text                ->  sequence (BYTES: every mask filled with its best candidate)
    generate   prompt              ->  text, finish_reason (BYTES)
    embed      text                ->  embedding (FP32 [n, dimension])
    token-classify  text           ->  entities (BYTES: per text a JSON list of the transformers pipeline's
                                       entities: entity / entity_group, score, word, start, end [, index]);
                                       parameters aggregation_strategy (string), ignore_labels (JSON list)
"""
from __future__ import annotations

import json
from typing import Any

import numpy as np

import modelpkg
from server.protocol import jsontext
from server.dataplane import DataPlane, select_outputs
from server.protocol.errors import Code, ServingError
from server.generation import GenerationParams
from server.encoders.token_aggregation import as_pipeline_dict
from server.protocol.types import FillMaskResult, InferResult, MaskPrediction

EXTENSIONS = ["model_repository", "statistics", "parameters"]
TEXT_INPUTS = {"classify": {"text", "text_pair"}, "fill-mask": {"text"}, "generate": {"prompt"}, "embed": {"text"},
               "token-classify": {"text"}}
_PARAM_KEYS = ("max_new_tokens", "temperature", "top_k", "top_p", "min_p", "min_tokens", "repetition_penalty",
               "presence_penalty", "frequency_penalty", "seed", "truncate_prompt", "ignore_eos", "num_beams",
               "length_penalty", "early_stopping")


def parse_version(text: str, field: str = "version") -> int:
    """KServe versions are strings; "" = the latest; otherwise the repository's one version rule (modelpkg)."""
    if not text:
        return 0
    version = modelpkg.parse_version(text)
    if version is None:
        raise ServingError.invalid(field, f"must be a positive integer (no leading zero) or empty, got {text!r}")
    return version


def is_text_request(task: str, inputs: dict[str, np.ndarray]) -> bool:
    return bool(inputs) and set(inputs) <= TEXT_INPUTS.get(task, set()) and all(
        a.dtype == object for a in inputs.values())


async def model_infer(plane: DataPlane, model: str, version: int, inputs: dict[str, np.ndarray],
                outputs: list[str] | None, parameters: dict[str, Any], deadline: float | None) -> InferResult:
    """ModelInfer over the data plane: text mode when the request is one, the graph otherwise."""
    task = plane.task_of(model, version) if inputs else ""
    if not is_text_request(task, inputs):
        return await plane.infer(model, version, inputs, outputs, deadline)
    if task == "generate":
        result = await _generate(plane, model, version, inputs, parameters, deadline)
    elif task == "classify":
        result = await _classify(plane, model, version, inputs, parameters, deadline)
    elif task == "embed":
        result = await _embed(plane, model, version, inputs, parameters, deadline)
    elif task == "token-classify":
        result = await _token_classify(plane, model, version, inputs, parameters, deadline)
    else:
        result = await _fill_mask(plane, model, version, inputs, parameters, deadline)
    return InferResult(model=result.model, version=result.version, outputs=select_outputs(result.outputs, outputs))


def _texts(inputs: dict[str, np.ndarray], name: str) -> list[str]:
    try:
        return [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in inputs[name].reshape(-1)]
    except UnicodeDecodeError:
        raise ServingError.invalid(f"inputs[{name!r}]", "BYTES elements must be UTF-8 text") from None


def _bytes_array(values: list[str]) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    out[:] = [v.encode("utf-8") for v in values]
    return out


async def _classify(plane: DataPlane, model: str, version: int, inputs: dict[str, np.ndarray],
                    parameters: dict[str, Any], deadline: float | None) -> InferResult:
    if "text" not in inputs:
        raise ServingError.invalid("inputs", "missing input 'text'")
    main = _texts(inputs, "text")
    pairs: list[str | None] = list(_texts(inputs, "text_pair")) if "text_pair" in inputs else [None] * len(main)
    if len(pairs) != len(main):
        raise ServingError.invalid("inputs['text_pair'].shape", "must have as many elements as 'text'")
    result = await plane.classify(model, version, list(zip(main, pairs)), 0, bool(parameters.get("truncate", False)),
                                  deadline)
    probs = np.array([[next(s.score for s in r.scores if s.label == label) for label in result.labels]
                      for r in result.results], dtype=np.float32)
    return InferResult(model=result.model, version=result.version, outputs={
        "label": _bytes_array([r.label for r in result.results]),
        "score": np.array([r.score for r in result.results], dtype=np.float32), "probabilities": probs})


async def _embed(plane: DataPlane, model: str, version: int, inputs: dict[str, np.ndarray],
                 parameters: dict[str, Any], deadline: float | None) -> InferResult:
    result = await plane.embed(model, version, _texts(inputs, "text"), bool(parameters.get("truncate", False)),
                               deadline)
    return InferResult(model=result.model, version=result.version, outputs={"embedding": result.embeddings})


async def _token_classify(plane: DataPlane, model: str, version: int, inputs: dict[str, np.ndarray],
                          parameters: dict[str, Any], deadline: float | None) -> InferResult:
    strategy = parameters.get("aggregation_strategy", "none")
    if not isinstance(strategy, str):
        raise ServingError.invalid("parameters.aggregation_strategy", "must be a string")
    ignore = None
    if "ignore_labels" in parameters:
        ignore = _json_parameter(parameters, "ignore_labels", list, "a JSON list of strings")
        if not all(isinstance(x, str) for x in ignore):
            raise ServingError.invalid("parameters.ignore_labels", "must be a JSON list of strings")
    result = await plane.token_classify(model, version, _texts(inputs, "text"), strategy, ignore,
                                        bool(parameters.get("truncate", False)), deadline)
    answers = [json.dumps([as_pipeline_dict(e, result.aggregation_strategy) for e in entities], ensure_ascii=False)
               for entities in result.results]
    return InferResult(model=result.model, version=result.version, outputs={"entities": _bytes_array(answers)})


async def _fill_mask(plane: DataPlane, model: str, version: int, inputs: dict[str, np.ndarray],
                     parameters: dict[str, Any], deadline: float | None) -> InferResult:
    if "text" not in inputs:
        raise ServingError.invalid("inputs", "missing input 'text'")
    result = await plane.fill_mask(model, version, _texts(inputs, "text"), 1, bool(parameters.get("truncate", False)),
                                   deadline)
    return InferResult(model=result.model, version=result.version,
                       outputs={"sequence": _bytes_array([_fill_all(result, masks) for masks in result.results])})


def _fill_all(result: FillMaskResult, masks: list[MaskPrediction]) -> str:
    """The text with every mask replaced by its best candidate (each candidate's sequence fills only its own
    mask: the others are filled left to right with their best token)."""
    text = masks[0].candidates[0].sequence
    for m in masks[1:]:
        text = text.replace(result.mask_token, m.candidates[0].token, 1)
    return text


async def _generate(plane: DataPlane, model: str, version: int, inputs: dict[str, np.ndarray],
                    parameters: dict[str, Any], deadline: float | None) -> InferResult:
    params = params_from(parameters)
    prompts = _texts(inputs, "prompt")
    if not prompts:
        raise ServingError.invalid("inputs['prompt']", "at least one prompt is required")
    # One request: its prompts admitted together, and cancelled together when one fails or the caller leaves.
    results = await plane.generate_many(model, version, [(p, params) for p in prompts], deadline,
                                        field="inputs['prompt']")
    return InferResult(model=results[0].model, version=results[0].version, outputs={
        "text": _bytes_array([r.output.text for r in results]),
        "finish_reason": _bytes_array([r.output.finish_reason for r in results])})


def _json_parameter(parameters: dict[str, Any], name: str, kind: type, what: str) -> Any:
    """A parameter that carries JSON text (gRPC parameters are scalars): parsed bounded, refusals naming it
    (server/protocol/jsontext.py: malformed, too deep, integers beyond Python's digit limit, lone surrogates)."""
    field = f"parameters.{name}"
    text = parameters[name]
    if not isinstance(text, str):
        raise ServingError.invalid(field, f"must be {what} (as JSON text)")
    value = jsontext.loads(text, where=field)
    if not isinstance(value, kind):   # '5' or 'Infinity' are JSON too
        raise ServingError.invalid(field, f"must be {what}")
    return value


def params_from(parameters: dict[str, Any]) -> GenerationParams:
    """KServe request parameters -> GenerationParams (stop sequences as a JSON list in "stop", the logit bias as
    a JSON object of token id to bias in "logit_bias")."""
    fields = {k: parameters[k] for k in _PARAM_KEYS if k in parameters}
    for key in ("temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty",
                "length_penalty"):
        if isinstance(fields.get(key), int) and not isinstance(fields.get(key), bool):
            fields[key] = float(fields[key])
    if "stop" in parameters:
        fields["stop"] = _json_parameter(parameters, "stop", list, "a JSON list of strings")
    if "logit_bias" in parameters:
        # GenerationParams reads the keys as token ids and checks the values.
        fields["logit_bias"] = _json_parameter(parameters, "logit_bias", dict, "a JSON object of token id to bias")
    try:
        return GenerationParams.validate(**fields)
    except ValueError as exc:
        raise ServingError(Code.INVALID_ARGUMENT, str(exc)) from None
