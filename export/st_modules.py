"""A sentence-transformers model directory read as sentence-transformers 2 to 6 save it: modules.json in order
(Transformer, Pooling, then Dense / Normalize), each module's folder, and config_sentence_transformers.json's
prompts. What the embedding graph must compute after the encoder, so that nothing the model does is left out;
anything else is refused by name (ExportError naming the module type and its path, or the config key).

Pooling configs come in two layouts: v2-5 write booleans (`pooling_mode_mean_tokens: true`, ...; several true
means the modes' vectors concatenated, in sentence-transformers' fixed order), v6 writes `pooling_mode` (a name
or a list of names) and `include_prompt`.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .errors import ExportError

POOLING_MODES = ("cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken")
# v2-5 boolean keys, in the order sentence-transformers concatenates the active modes.
LEGACY_POOLING_KEYS = {"pooling_mode_cls_token": "cls", "pooling_mode_max_tokens": "max",
                       "pooling_mode_mean_tokens": "mean", "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
                       "pooling_mode_weightedmean_tokens": "weightedmean", "pooling_mode_lasttoken": "lasttoken"}
# Dense activations by the class path sentence-transformers writes (only torch's own classes: nothing is imported
# from a name in a file).
ACTIVATIONS = {"torch.nn.modules.activation.Tanh": "tanh", "torch.nn.modules.linear.Identity": "identity",
               "torch.nn.modules.activation.ReLU": "relu", "torch.nn.modules.activation.Sigmoid": "sigmoid",
               "torch.nn.modules.activation.GELU": "gelu"}
MODULE_TYPES = ("Transformer", "Pooling", "Dense", "Normalize")
FEATURE = "sentence_embedding"   # the feature every module after pooling reads and writes


@dataclass(frozen=True, eq=False)   # compared by identity: its tensors have no single truth value
class DenseLayer:
    path: str
    weight: torch.Tensor            # [out_features, in_features]
    bias: torch.Tensor | None
    activation: str                 # a value of ACTIVATIONS

    @property
    def out_features(self) -> int:
        return int(self.weight.shape[0])


@dataclass(frozen=True)
class StModules:
    """The modules after the encoder, in order, and the model's prompts."""

    pooling_modes: tuple[str, ...]
    include_prompt: bool = True
    steps: tuple[DenseLayer | str, ...] = ()     # after pooling, in order: a DenseLayer or "normalize"
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None
    module_types: tuple[str, ...] = ("Transformer", "Pooling")

    @property
    def normalize(self) -> bool:
        """The vectors leave the graph with unit L2 norm (a Normalize after the last Dense)."""
        return bool(self.steps) and self.steps[-1] == "normalize"

    def dimension(self, hidden_size: int) -> int:
        """The last module's output: the last Dense's out_features, else the pooled (concatenated) width."""
        dense = [s for s in self.steps if isinstance(s, DenseLayer)]
        return dense[-1].out_features if dense else len(self.pooling_modes) * hidden_size


def _json(path: Path, what: str) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ExportError(f"checkpoint: {what} {path} unreadable ({exc})") from None


def module_kind(entry: Any, index: int) -> tuple[str, str]:
    """(type name, path) of a modules.json entry; a type that is not sentence-transformers' own is refused."""
    if not isinstance(entry, dict) or not isinstance(entry.get("type"), str):
        raise ExportError(f"checkpoint: modules.json entry {index} has no module type")
    full, path = entry["type"], str(entry.get("path", ""))
    kind = full.rsplit(".", 1)[-1]
    if not full.startswith("sentence_transformers.") or kind not in MODULE_TYPES:
        raise ExportError(f"checkpoint: modules.json module type {full} at path {path!r} is not supported "
                          f"(exported: {', '.join(MODULE_TYPES)})")
    return kind, path


def read_pooling_config(cfg: dict[str, Any], where: Path, hidden_size: int) -> tuple[tuple[str, ...], bool]:
    """(modes, include_prompt) from either layout; as sentence-transformers reads them (`pooling_mode` wins over
    the booleans; no mode set at all means mean)."""
    if "pooling_mode" in cfg:
        given = cfg["pooling_mode"]
        modes = (given,) if isinstance(given, str) else tuple(given) if isinstance(given, list) else ()
        bad = [m for m in modes if m not in POOLING_MODES] or ([] if modes else [given])
        if bad:
            raise ExportError(f"checkpoint: {where} pooling_mode {bad[0]!r} is not a sentence-transformers pooling "
                              f"mode ({', '.join(POOLING_MODES)})")
    else:
        modes = tuple(mode for key, mode in LEGACY_POOLING_KEYS.items() if cfg.get(key)) or ("mean",)
    width = cfg.get("embedding_dimension", cfg.get("word_embedding_dimension", hidden_size))
    if width != hidden_size:
        raise ExportError(f"checkpoint: {where} embedding_dimension {width!r} is not the encoder's hidden_size "
                          f"{hidden_size}")
    include = cfg.get("include_prompt", True)
    if not isinstance(include, bool):
        raise ExportError(f"checkpoint: {where} include_prompt must be true or false, got {include!r}")
    return modes, include


def read_dense(folder: Path, width: int) -> DenseLayer:
    from training.checkpoint import CheckpointError, read_state_dict

    cfg_file = folder / "config.json"
    cfg = _json(cfg_file, "Dense config")
    for key, default in (("module_input_name", FEATURE), ("module_output_name", FEATURE), ("use_residual", False)):
        if cfg.get(key, default) != default:
            raise ExportError(f"checkpoint: {cfg_file} {key} {cfg[key]!r} is not supported (only {default!r})")
    name = cfg.get("activation_function", "torch.nn.modules.activation.Tanh")
    if name not in ACTIVATIONS:
        raise ExportError(f"checkpoint: {cfg_file} activation_function {name!r} is not supported "
                          f"({', '.join(ACTIVATIONS)})")
    try:
        state = read_state_dict(folder)   # model.safetensors, else pytorch_model.bin with weights_only
    except CheckpointError as exc:
        raise ExportError(f"checkpoint: Dense weights: {exc}") from None
    weight, bias = state.get("linear.weight"), state.get("linear.bias")
    shape = (cfg.get("out_features"), cfg.get("in_features"))
    if weight is None or tuple(weight.shape) != shape or shape[1] != width:
        raise ExportError(f"checkpoint: {folder} linear.weight must be [out_features, in_features] = {list(shape)} "
                          f"over the {width} values before it, got "
                          f"{None if weight is None else list(weight.shape)}")
    if bool(cfg.get("bias", True)) != (bias is not None):
        raise ExportError(f"checkpoint: {cfg_file} bias is {cfg.get('bias', True)} but the weights "
                          f"{'lack' if bias is None else 'hold'} linear.bias")
    return DenseLayer(folder.name, weight.float(), None if bias is None else bias.float(), ACTIVATIONS[name])


def read_prompts(checkpoint: Path) -> tuple[dict[str, str], str | None]:
    file = checkpoint / "config_sentence_transformers.json"
    cfg = _json(file, "config") if file.is_file() else {}
    prompts = cfg.get("prompts") or {}
    if not isinstance(prompts, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                for k, v in prompts.items()):
        raise ExportError(f"checkpoint: {file} prompts must map names to texts")
    default = cfg.get("default_prompt_name")
    if default is not None and default not in prompts:
        raise ExportError(f"checkpoint: {file} default_prompt_name {default!r} is not one of the prompts "
                          f"{sorted(prompts)}")
    return dict(prompts), default


def read_st_modules(checkpoint: Path, hidden_size: int) -> StModules | None:
    """The checkpoint's sentence-transformers modules; None when it has no modules.json (a plain encoder)."""
    modules_file = checkpoint / "modules.json"
    if not modules_file.is_file():
        return None
    modules = _json(modules_file, "modules.json")
    if not isinstance(modules, list):
        raise ExportError(f"checkpoint: {modules_file} must be a list of modules")
    kinds = [module_kind(m, i) for i, m in enumerate(modules)]
    if len(kinds) < 2 or kinds[0][0] != "Transformer" or kinds[1][0] != "Pooling":
        raise ExportError(f"checkpoint: modules.json must start with Transformer then Pooling, got "
                          f"{[k for k, _ in kinds]}")
    if kinds[0][1] not in ("", "."):
        raise ExportError(f"checkpoint: modules.json Transformer at path {kinds[0][1]!r}: export needs the encoder "
                          f"in the model directory itself (path \"\"), as sentence-transformers 2+ saves it")
    st_config = checkpoint / "sentence_bert_config.json"
    if st_config.is_file() and _json(st_config, "config").get("do_lower_case"):
        raise ExportError(f"checkpoint: {st_config} do_lower_case: true is not supported (the packaged tokenizer "
                          f"would see other text than sentence-transformers does)")
    pool_dir = checkpoint / kinds[1][1]
    modes, include = read_pooling_config(_json(pool_dir / "config.json", "pooling config"), pool_dir / "config.json",
                                         hidden_size)
    steps: list[DenseLayer | str] = []
    width = len(modes) * hidden_size
    for kind, path in kinds[2:]:
        if kind == "Dense":
            steps.append(read_dense(checkpoint / path, width))
            width = steps[-1].out_features
        elif kind == "Normalize":
            cfg_file = checkpoint / path / "config.json"
            cfg = _json(cfg_file, "Normalize config") if path and cfg_file.is_file() else {}
            if cfg.get("module_input_name", FEATURE) != FEATURE or cfg.get("module_output_name", FEATURE) != FEATURE:
                raise ExportError(f"checkpoint: {cfg_file} module_input_name/module_output_name: only "
                                  f"{FEATURE!r} is supported")
            steps.append("normalize")
        else:
            raise ExportError(f"checkpoint: modules.json module type {kind} at path {path!r} is only supported "
                              f"second (Transformer, Pooling, then Dense / Normalize)")
    prompts, default = read_prompts(checkpoint)
    if not include and any(prompts.values()):
        # sentence-transformers then drops the prompt's tokens from pooling only; the graph pools every token.
        raise ExportError(f"checkpoint: {pool_dir / 'config.json'} include_prompt: false with prompts "
                          f"{sorted(k for k, v in prompts.items() if v)} is not supported")
    return StModules(modes, include, tuple(steps), prompts, default, tuple(k for k, _ in kinds))
