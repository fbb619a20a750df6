"""The activation a sequence classifier's scores take, decided once at export and recorded in model.json `head`.

A classifier's logits mean different things by how it was trained: softmax over labels (one label per text),
sigmoid per label (multi-label: go_emotions, toxic-comment heads), nothing (regression). The checkpoint says which:

1. a sentence-transformers CrossEncoder's own activation, where its config names one (the CrossEncoder applies it
   in `predict`): `config_sentence_transformers.json` `activation_fn` (v5+), else config.json
   `sentence_transformers.activation_fn` (v4), else config.json `sbert_ce_default_activation_function` (< v4),
   the order in which sentence-transformers itself reads them;
2. otherwise config.json `problem_type` and the number of labels, as transformers' text-classification pipeline
   decides its `function_to_apply` default: regression -> none; multi_label_classification or one label ->
   sigmoid; single_label_classification or several labels -> softmax.

An activation we cannot compute exactly (a CrossEncoder's Tanh, a class outside torch) is refused by name: a
package never serves scores the checkpoint's own library would not give.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from .errors import ExportError
from .source import optional_json

ACTIVATIONS = ("softmax", "sigmoid", "none")
PROBLEM_TYPES = ("regression", "single_label_classification", "multi_label_classification")
# The torch modules sentence-transformers saves by their dotted path, as the served function each is.
_TORCH_ACTIVATIONS = {
    "torch.nn.modules.activation.Sigmoid": "sigmoid",
    "torch.nn.modules.linear.Identity": "none",
    "torch.nn.modules.activation.Softmax": "softmax",   # Softmax() on [batch, labels] logits: over the labels
}


def _cross_encoder_activation(checkpoint: Path, config: dict[str, Any]) -> tuple[str, str] | None:
    """(dotted path, where it was read) of a CrossEncoder's saved activation, None when the checkpoint names none."""
    st_config = optional_json(checkpoint / "config_sentence_transformers.json")
    if st_config.get("activation_fn") is not None:
        return str(st_config["activation_fn"]), "config_sentence_transformers.json activation_fn"
    block = config.get("sentence_transformers")
    if isinstance(block, dict) and block.get("activation_fn") is not None:
        return str(block["activation_fn"]), "config.json sentence_transformers.activation_fn"
    if config.get("sbert_ce_default_activation_function") is not None:
        return str(config["sbert_ce_default_activation_function"]), "config.json sbert_ce_default_activation_function"
    return None


def head_activation(checkpoint: Path, config: dict[str, Any]) -> dict[str, str]:
    """model.json `head` of a sequence classifier: {"function_to_apply": softmax | sigmoid | none, "source": the
    checkpoint key it was decided from, and "problem_type" when config.json sets one}; ExportError naming the key
    whose value cannot be served exactly."""
    problem = config.get("problem_type")
    if problem is not None and problem not in PROBLEM_TYPES:
        raise ExportError(f"checkpoint: config.json problem_type {problem!r} is not one of {', '.join(PROBLEM_TYPES)}")
    extra = {"problem_type": problem} if problem is not None else {}
    found = _cross_encoder_activation(Path(checkpoint), config)
    if found is not None:
        path, key = found
        if path not in _TORCH_ACTIVATIONS:
            raise ExportError(f"checkpoint: {key} {path!r} is not served (supported: "
                              f"{', '.join(sorted(_TORCH_ACTIVATIONS))})")
        return {"function_to_apply": _TORCH_ACTIVATIONS[path], "source": key, **extra}
    id2label = config.get("id2label") or {}
    labels = len(id2label) if id2label else int(config.get("num_labels", 2))
    if problem == "single_label_classification" and labels == 1:   # transformers refuses this config too
        raise ExportError("checkpoint: config.json problem_type 'single_label_classification' needs more than one "
                          "label (id2label has 1)")
    if problem == "regression":
        function = "none"
    elif problem == "multi_label_classification" or labels == 1:
        function = "sigmoid"
    else:   # single_label_classification, or unset with several labels
        function = "softmax"
    source = "config.json problem_type" if problem is not None else "config.json id2label (number of labels)"
    return {"function_to_apply": function, "source": source, **extra}


__all__ = ["ACTIVATIONS", "PROBLEM_TYPES", "head_activation"]
