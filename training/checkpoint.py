"""Read and write checkpoints in the Hugging Face directory layout (docs/checkpoint-format.md).

Real HF BERT / GPT-2 / Llama / Marian / BART / T5 / M2M100 / mBART ... checkpoints load into our models and ours load
into `transformers`.
Weights are read from model.safetensors, or from pytorch_model.bin only through
`torch.load(weights_only=True)`: nothing is ever unpickled.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import nn

from training.families import (ARCH_ALIASES, ARCH_TO_KIND, BUFFERS, CONV1D, DECODER_KINDS, DEFAULT_KIND, FAMILY_CONFIG,
                               HEADS, KEY_RULES, KIND_TYPES, KINDS, PREFIX, SEQ2SEQ, TIED)


log = logging.getLogger(__name__)

CONFIG_NAME = "config.json"
SAFETENSORS_NAME = "model.safetensors"
BIN_NAME = "pytorch_model.bin"



def kind_model_types(kind: str) -> tuple[str, ...]:
    """The config.json model_type values a kind accepts."""
    return KIND_TYPES.get(kind, (KINDS[kind][2],))


def architecture_of(model: nn.Module) -> str:
    """The HF architecture name to write for our model (Llama family: by its model_type)."""
    kind = _kind_of(model)
    if kind in DECODER_KINDS:
        return model.config.architecture
    return KINDS[kind][1]


def family_of_kind(kind: str) -> str:
    """"bert-mlm" -> "bert", "llama" -> "llama", "gpt" -> "gpt2"."""
    return KINDS[kind][2]


class CheckpointError(ValueError):
    """A checkpoint that cannot be read or does not fit the requested model."""


def read_config(path: str | os.PathLike) -> dict[str, Any]:
    """The checkpoint's config.json as a dict."""
    f = Path(path) / CONFIG_NAME
    if not f.is_file():
        raise CheckpointError(f"{f}: missing (not a checkpoint directory)")
    try:
        d = json.loads(f.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{f}: unreadable JSON ({e})") from None
    if not isinstance(d, dict):
        raise CheckpointError(f"{f}: expected a JSON object")
    return d


def checkpoint_kind(path: str | os.PathLike) -> str:
    """The kind ("bert", "bert-mlm", ...) named by config.json's architectures."""
    return _kind_from_config(read_config(path), Path(path))




def _kind_from_config(cfg: dict[str, Any], path: Path) -> str:
    model_type = cfg.get("model_type")
    if model_type not in FAMILY_CONFIG:
        raise CheckpointError(f"{path / CONFIG_NAME}: model_type: unsupported {model_type!r} "
                              f"(one of {', '.join(FAMILY_CONFIG)})")
    archs = cfg.get("architectures") or []
    for arch in archs:
        kind = ARCH_TO_KIND.get(arch) or ARCH_ALIASES.get(arch)
        if kind is not None and model_type in kind_model_types(kind):
            return kind
    if not archs:
        return DEFAULT_KIND[model_type]
    raise CheckpointError(f"{path / CONFIG_NAME}: architectures: unsupported {archs!r} "
                          f"(one of {sorted(ARCH_TO_KIND)})")


def read_state_dict(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The raw tensors of a checkpoint directory (safetensors first, else weights-only .bin)."""
    path = Path(path)
    st, binf = path / SAFETENSORS_NAME, path / BIN_NAME
    if st.is_file():
        from safetensors import SafetensorError
        from safetensors.torch import load_file
        try:
            return load_file(str(st))
        except (SafetensorError, OSError, ValueError) as e:
            raise CheckpointError(f"{st}: unreadable safetensors ({e})") from None
    if binf.is_file():
        try:
            sd = torch.load(str(binf), map_location="cpu", weights_only=True)
        except Exception as e:  # torch raises several types (UnpicklingError, RuntimeError, EOFError)
            raise CheckpointError(f"{binf}: unreadable weights-only checkpoint ({type(e).__name__}: {e})") from None
        if not isinstance(sd, dict) or not all(isinstance(v, torch.Tensor) for v in sd.values()):
            raise CheckpointError(f"{binf}: expected a flat dict of tensors")
        return sd
    raise CheckpointError(f"{path}: no {SAFETENSORS_NAME} or {BIN_NAME}")


def _config_for(kind: str, cfg: dict[str, Any], overrides: dict[str, Any]) -> Any:
    cls = FAMILY_CONFIG[cfg.get("model_type", family_of_kind(kind))]
    d = dict(cfg)
    if "id2label" in overrides and "label2id" not in overrides:
        d.pop("label2id", None)
    if "num_labels" in overrides and "id2label" not in overrides:
        d.pop("id2label", None)
        d.pop("label2id", None)
    d.update(overrides)
    try:
        return cls.from_hf_dict(d)
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"config: {e}") from None


def _normalise_keys(sd: dict[str, torch.Tensor], kind: str) -> dict[str, torch.Tensor]:
    """HF key variants -> our model's keys: legacy gamma/beta, `bert.` / `transformer.` / `model.` prefixes."""
    out: dict[str, torch.Tensor] = {}
    for k, v in sd.items():
        if BUFFERS.search(k):
            continue
        k = re.sub(r"LayerNorm\.gamma$", "LayerNorm.weight", k)
        k = re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", k)
        out[k] = v
    family = family_of_kind(kind)
    if kind in SEQ2SEQ:
        return out  # the family's own rules need its config: load_hf_state_dict applies them
    if kind == "gpt":
        if not any(k.startswith("transformer.") for k in out):  # a GPT2Model checkpoint
            out = {(k if k.startswith("lm_head.") else "transformer." + k): v for k, v in out.items()}
    elif kind in DECODER_KINDS:
        if not any(k.startswith("model.") for k in out):  # a LlamaModel checkpoint
            out = {(k if k.startswith("lm_head.") else "model." + k): v for k, v in out.items()}
    elif kind == "bert":
        if any(k.startswith("bert.") for k in out):  # encoder of a headed checkpoint: drop the heads
            out = {k[len("bert."):]: v for k, v in out.items() if k.startswith("bert.")}
    else:
        prefix = PREFIX[family]
        if not any(k.startswith(prefix) for k in out):  # a base-model checkpoint under a head
            out = {(k if k.startswith(HEADS[family]) and not k.startswith("pooler.") else prefix + k): v
                   for k, v in out.items()}
    return out


def _tied_keys(model: nn.Module, kind: str) -> set[str]:
    if kind in SEQ2SEQ:
        return SEQ2SEQ[kind].tied_keys(model.config)
    if kind in DECODER_KINDS:
        return {"lm_head.weight"} if model.config.tie_word_embeddings else set()
    if hasattr(model, "tied_hf_keys"):   # a family whose tying follows its config (ModernBERT)
        return model.tied_hf_keys()
    return set(TIED.get(kind, ()))


def hf_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """Our model's weights as HF writes them: tied keys left out, GPT-2 Conv1D weights as [in, out]."""
    kind = _kind_of(model)
    tied = _tied_keys(model, kind)
    out: dict[str, torch.Tensor] = {}
    for k, v in model.state_dict().items():
        if k in tied:
            continue
        if kind == "gpt" and CONV1D.match(k):
            v = v.t()
        out[k] = v.detach().contiguous().clone()
    return out


def load_hf_state_dict(model: nn.Module, sd: dict[str, torch.Tensor], source: str = "state dict") -> None:
    """Load HF-named weights into our model (strict except for heads absent from `sd`, which keep
    their fresh init). Raises CheckpointError on a missing encoder weight, a foreign key or a shape mismatch."""
    kind = _kind_of(model)
    sd = _normalise_keys(sd, kind)
    if family_of_kind(kind) in KEY_RULES:
        try:
            sd = KEY_RULES[family_of_kind(kind)](sd, model)
        except ValueError as e:
            raise CheckpointError(f"{source}: {e}") from None
    if kind == "gpt":
        sd = {k: (v.t() if CONV1D.match(k) else v) for k, v in sd.items()}
    own = model.state_dict()
    tied = _tied_keys(model, kind)
    # Heads that may be missing from the source start from init (fine-tuning from an encoder); heads the
    # target lacks are dropped (e.g. an MLM checkpoint used as a classifier's encoder). Decoders: none.
    fresh_ok = drop_ok = HEADS.get(family_of_kind(kind), ())
    if kind in SEQ2SEQ:
        # The family's key rules; the file's copies of tied tables are views we fill in ourselves. A base
        # checkpoint (MarianModel, BartModel) has no final_logits_bias: zeros, as transformers does.
        sd = SEQ2SEQ[kind].normalise_hf_keys(sd, model.config)
        sd = {k: v for k, v in sd.items() if k not in tied}
        fresh_ok = ("final_logits_bias",)
    if kind in DECODER_KINDS and tied and "lm_head.weight" in sd:
        sd = {k: v for k, v in sd.items() if k != "lm_head.weight"}  # a file that also carries the tied copy
    unexpected = [k for k in sd if k not in own]
    foreign = [k for k in unexpected if not k.startswith(drop_ok)]
    if foreign:
        raise CheckpointError(f"{source}: unexpected weights for {kind}: {foreign[:5]}"
                              f"{' ...' if len(foreign) > 5 else ''}")
    if unexpected:
        log.info("%s: ignoring head weights not in %s: %s", source, kind, unexpected)
    missing = [k for k in own if k not in sd and k not in tied]
    hard = [k for k in missing if not k.startswith(fresh_ok)]
    if hard:
        raise CheckpointError(f"{source}: missing weights for {kind}: {hard[:5]}{' ...' if len(hard) > 5 else ''}")
    if missing:
        log.warning("%s: newly initialised (not in checkpoint): %s", source, missing)
    for k, v in sd.items():
        if k in own and own[k].shape != v.shape:
            raise CheckpointError(f"{source}: shape mismatch for {k}: checkpoint {tuple(v.shape)}, "
                                  f"model {tuple(own[k].shape)}")
    model.load_state_dict({k: v for k, v in sd.items() if k in own}, strict=False)
    if hasattr(model, "tie_weights"):
        model.tie_weights()


def _kind_of(model: nn.Module) -> str:
    for kind, (cls, _, _) in KINDS.items():
        if type(model) is cls:
            return kind
    raise CheckpointError(f"model: unsupported type {type(model).__name__}")


def load_model(path: str | os.PathLike, kind: str | None = None, **config_overrides: Any
               ) -> tuple[nn.Module, Any]:
    """Load a checkpoint directory as `kind` (None: from config.json's architectures).

    config_overrides replace config.json fields, e.g. num_labels / id2label / label2id when a
    BertModel checkpoint is loaded as "bert-classifier" to be fine-tuned (the head is initialised).
    The model is returned in eval mode."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"{path}: not a directory")
    cfg = read_config(path)
    stored = _kind_from_config(cfg, path)
    if kind is None:
        kind = stored
    if kind not in KINDS:
        raise CheckpointError(f"kind: unsupported {kind!r} (one of {sorted(KINDS)})")
    if cfg.get("model_type") not in kind_model_types(kind):
        raise CheckpointError(f"kind: {kind!r} does not fit model_type {cfg.get('model_type')!r} of {path}")
    if (kind.endswith("-classifier") and stored != kind
            and not {"num_labels", "id2label"} & config_overrides.keys()):
        raise CheckpointError(f"num_labels: loading a {stored} checkpoint as {kind} needs "
                              f"num_labels or id2label")
    config = _config_for(kind, cfg, config_overrides)
    sd = read_state_dict(path)
    if kind.endswith("-classifier") and stored != kind:
        # Another kind's classifier (a sequence head under a token head, or the reverse) is not this one's:
        # it starts fresh instead of lending weights of another meaning (or shape).
        sd = {k: v for k, v in sd.items() if not k.startswith(("classifier.", "pre_classifier."))}
    if kind in SEQ2SEQ:
        _untie_if_distinct(kind, config, sd, path)
    model = KINDS[kind][0](config)
    load_hf_state_dict(model, sd, source=str(path))
    model.eval()
    return model, config


def _untie_if_distinct(kind: str, config: Any, sd: dict[str, torch.Tensor], path: Path) -> None:
    """A head the config calls tied but the file stores with other values is the file's own (transformers
    unties it the same way; its T5 configs always say tied); tables a family shares by tying are checked
    the same way (the family's resolve_sharing)."""
    fam = SEQ2SEQ[kind]
    resolve = getattr(fam, "resolve_sharing", None)
    if resolve is not None:
        try:
            note = resolve(config, _normalise_keys(sd, kind))
        except ValueError as e:
            raise CheckpointError(f"{path}: {e}") from None
        if note:
            log.info("%s: %s", path, note)
    if not config.tie_word_embeddings:
        return
    keys = fam.normalise_hf_keys(_normalise_keys(sd, kind), config)
    head, table = keys.get("lm_head.weight"), keys.get(fam.head_source_key(config))
    if head is not None and table is not None and (head.shape != table.shape or not torch.equal(head, table)):
        log.info("%s: lm_head.weight differs from %s: loaded untied", path, fam.head_source_key(config))
        config.tie_word_embeddings = False


def save_model(model: nn.Module, out_dir: str | os.PathLike, tokenizer_files: dict[str, Path] | None = None,
               extra_files: dict[str, bytes] | None = None) -> Path:
    """Write an HF-layout checkpoint atomically: built in a temp dir beside out_dir, then renamed
    over it (an existing out_dir is replaced). tokenizer_files maps destination name -> source file."""
    from safetensors.torch import save_file

    kind = _kind_of(model)
    out_dir = Path(out_dir)
    cfg = model.config.to_hf_dict()
    cfg["architectures"] = [architecture_of(model)]
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        (tmp / CONFIG_NAME).write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        save_file(hf_state_dict(model), str(tmp / SAFETENSORS_NAME), metadata={"format": "pt"})
        for name, src in (tokenizer_files or {}).items():
            _check_name(name)
            shutil.copyfile(src, tmp / name)
        for name, data in (extra_files or {}).items():
            _check_name(name)
            (tmp / name).write_bytes(data)
        _replace_dir(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info("saved %s checkpoint to %s", kind, out_dir)
    return out_dir


def _check_name(name: str) -> None:
    if not name or Path(name).name != name or name in (".", ".."):
        raise CheckpointError(f"file name: {name!r} must be a plain file name")


def _replace_dir(tmp: Path, out_dir: Path) -> None:
    """Rename tmp to out_dir; an existing out_dir is moved aside first and removed after."""
    if not out_dir.exists():
        os.replace(tmp, out_dir)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old-", dir=out_dir.parent))
    os.rmdir(old)
    os.replace(out_dir, old)
    try:
        os.replace(tmp, out_dir)
    except BaseException:
        os.replace(old, out_dir)
        raise
    shutil.rmtree(old, ignore_errors=True)
