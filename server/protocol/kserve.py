"""KServe v2 as both front doors speak it (gRPC server/grpc/inference_service.py, REST server/http/inference_rest.py): the
version-string rule, the extensions served, and ModelInfer's "text mode": a request decoded into a task call's
arguments (text_request) and the call's answer encoded (text_outputs).

DataPlane.model_infer leases the model version once, then: a request whose inputs are all BYTES tensors named as
below (for that version's task) runs the task instead of the graph, the data plane making the call; anything else
goes to the graph. Request parameters: `truncate` (bool); for generate the GenerationParameters by name, and
`stop` as a JSON list of strings.

    classify   text [, text_pair]  ->  label (BYTES), score (FP32), probabilities (FP32 [n, labels]: every label's
                                       score under the package's activation, or parameter function_to_apply:
                                       "softmax" | "sigmoid" | "none")
    fill-mask  text                ->  sequence (BYTES: every mask filled with its best candidate)
    generate   prompt              ->  text, finish_reason (BYTES)
    embed      text                ->  embedding (FP32 [n, dimension])
    token-classify  text           ->  entities (BYTES: per text a JSON list of the transformers pipeline's
                                       entities: entity / entity_group, score, word, start, end [, index]);
                                       parameters aggregation_strategy (string), ignore_labels (JSON list)
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np

import modelpkg
from server.protocol import jsontext
from server.protocol.errors import Code, ServingError
from server.generation import GenerationParams
from server.encoders.activation import check_function
from server.encoders.token_aggregation import as_pipeline_dict
from server.protocol.types import FillMaskResult, MaskPrediction

EXTENSIONS = ["model_repository", "statistics", "parameters"]
TEXT_INPUTS = {"classify": {"text", "text_pair"}, "fill-mask": {"text"}, "generate": {"prompt"}, "embed": {"text"},
               "token-classify": {"text"}}
# A text request's data-plane operation (its span, dataplane.<operation>, when tracing): the task call it makes.
_OPERATIONS = {"classify": "classify", "fill-mask": "fill_mask", "generate": "generate_many", "embed": "embed",
               "token-classify": "token_classify"}
_PARAM_KEYS = ("max_new_tokens", "temperature", "top_k", "top_p", "min_p", "min_tokens", "repetition_penalty",
               "presence_penalty", "frequency_penalty", "seed", "truncate_prompt", "ignore_eos", "num_beams",
               "length_penalty", "early_stopping", "target_language", "source_language")


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


def infer_operation(task: str, inputs: dict[str, np.ndarray]) -> str:
    """The operation a ModelInfer of `inputs` to a model of `task` is: its task call's name in text mode, else
    "infer" (the graph)."""
    return _OPERATIONS[task] if is_text_request(task, inputs) else "infer"


def select_outputs(result: dict[str, np.ndarray], outputs: list[str] | None) -> dict[str, np.ndarray]:
    """The requested outputs, in the requested order; INVALID_ARGUMENT naming one that does not exist."""
    if not outputs:
        return result
    for i, name in enumerate(outputs):
        if name not in result:
            raise ServingError.invalid(f"outputs[{i}].name", f"{name!r} is not an output (outputs: {sorted(result)})")
    return {name: result[name] for name in outputs}


@dataclass(frozen=True)
class TextRequest:
    """A text-mode ModelInfer decoded for its model's task: the arguments of the task call the data plane makes
    on the version it leased (DataPlane.model_infer)."""

    task: str
    texts: list[str]                          # text, or generate's prompts
    truncate: bool = False
    pairs: list[str | None] | None = None     # classify: text_pair, one a text
    aggregation_strategy: str = "none"        # token-classify
    ignore_labels: list[str] | None = None    # token-classify
    params: GenerationParams | None = None    # generate
    function_to_apply: str | None = None      # classify: None = the package's activation

    @property
    def classify_inputs(self) -> list[tuple[str, str | None]]:
        return list(zip(self.texts, self.pairs or [None] * len(self.texts)))


def text_request(task: str, inputs: dict[str, np.ndarray], parameters: dict[str, Any]) -> TextRequest:
    """The text request of `inputs` (is_text_request) for a model of `task`; INVALID_ARGUMENT naming the input
    or parameter that is wrong."""
    truncate = bool(parameters.get("truncate", False))
    if task == "generate":
        params = params_from(parameters)
        prompts = _texts(inputs, "prompt")
        if not prompts:
            raise ServingError.invalid("inputs['prompt']", "at least one prompt is required")
        return TextRequest(task, prompts, params=params)
    if task == "token-classify":
        strategy, ignore = _aggregation(parameters)
        return TextRequest(task, _texts(inputs, "text"), truncate, aggregation_strategy=strategy, ignore_labels=ignore)
    if "text" not in inputs:
        raise ServingError.invalid("inputs", "missing input 'text'")
    texts = _texts(inputs, "text")
    if task != "classify":
        return TextRequest(task, texts, truncate)
    pairs: list[str | None] = list(_texts(inputs, "text_pair")) if "text_pair" in inputs else [None] * len(texts)
    if len(pairs) != len(texts):
        raise ServingError.invalid("inputs['text_pair'].shape", "must have as many elements as 'text'")
    function = parameters.get("function_to_apply")
    if function is not None and not isinstance(function, str):
        raise ServingError.invalid("parameters.function_to_apply", "must be a string")
    return TextRequest(task, texts, truncate, pairs=pairs,
                       function_to_apply=check_function(function, "parameters.function_to_apply"))


def text_outputs(task: str, result: Any) -> dict[str, np.ndarray]:
    """The output tensors of a text request's task result (generate: the list of GenerationResults)."""
    if task == "generate":
        return {"text": _bytes_array([r.text for r in result]),
                "finish_reason": _bytes_array([r.finish_reason for r in result])}
    if task == "classify":
        probs = np.array([[next(s.score for s in r.scores if s.label == label) for label in result.labels]
                          for r in result.results], dtype=np.float32)
        return {"label": _bytes_array([r.label for r in result.results]),
                "score": np.array([r.score for r in result.results], dtype=np.float32), "probabilities": probs}
    if task == "embed":
        return {"embedding": result.embeddings}
    if task == "token-classify":
        return {"entities": _bytes_array([json.dumps([as_pipeline_dict(e, result.aggregation_strategy)
                                                      for e in entities], ensure_ascii=False)
                                          for entities in result.results])}
    return {"sequence": _bytes_array([_fill_all(result, masks) for masks in result.results])}


def _texts(inputs: dict[str, np.ndarray], name: str) -> list[str]:
    try:
        return [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in inputs[name].reshape(-1)]
    except UnicodeDecodeError:
        raise ServingError.invalid(f"inputs[{name!r}]", "BYTES elements must be UTF-8 text") from None


def _bytes_array(values: list[str]) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    out[:] = [v.encode("utf-8") for v in values]
    return out


def _aggregation(parameters: dict[str, Any]) -> tuple[str, list[str] | None]:
    """token-classify's aggregation_strategy and ignore_labels parameters."""
    strategy = parameters.get("aggregation_strategy", "none")
    if not isinstance(strategy, str):
        raise ServingError.invalid("parameters.aggregation_strategy", "must be a string")
    ignore = None
    if "ignore_labels" in parameters:
        ignore = _json_parameter(parameters, "ignore_labels", list, "a JSON list of strings")
        if not all(isinstance(x, str) for x in ignore):
            raise ServingError.invalid("parameters.ignore_labels", "must be a JSON list of strings")
    return strategy, ignore


def _fill_all(result: FillMaskResult, masks: list[MaskPrediction]) -> str:
    """The text with every mask replaced by its best candidate (each candidate's sequence fills only its own
    mask: the others are filled left to right with their best token)."""
    text = masks[0].candidates[0].sequence
    for m in masks[1:]:
        text = text.replace(result.mask_token, m.candidates[0].token, 1)
    return text


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
