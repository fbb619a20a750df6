"""The typed model.json every builder starts from: the fields all tasks fill alike from the checkpoint."""
from __future__ import annotations

from typing import Any, Iterable, Mapping

from modelpkg import CacheSpec, Manifest, TensorDecl

from . import package
from .config import OPSET
from .source import CheckpointInfo


def tensors(specs: Iterable[Any]) -> tuple[TensorDecl, ...]:
    """Graph specs (anything with as_json(): name, dtype, shape) as the manifest's declarations."""
    return tuple(TensorDecl.from_dict(s.as_json()) for s in specs)


def new_manifest(name: str, task: str, info: CheckpointInfo, *, max_length: int, special_tokens: dict[str, int | None],
                 inputs: tuple[TensorDecl, ...], outputs: tuple[TensorDecl, ...], variants: Mapping[str, str],
                 labels: Iterable[str] = (), mask_token: str | None = None, cache: CacheSpec | None = None,
                 default_variant: Mapping[str, str] | None = None, extra: Mapping[str, Any] | None = None) -> Manifest:
    """A version-less manifest (the version is set at publication)."""
    return Manifest(
        format=package.FORMAT, name=name, version=None, task=task, architecture=info.model_type,
        labels=tuple(labels), max_length=max_length, vocab_size=int(info.config["vocab_size"]),
        special_tokens=dict(special_tokens), mask_token=mask_token, inputs=inputs, outputs=outputs, cache=cache,
        variants=dict(variants), default_variant=default_variant, opset=OPSET,
        source={"checkpoint": str(info.path), "architecture": info.architecture,
                "config_sha256": info.config_sha256, "checkpoint_sha256": info.weights_sha256},
        created_at=package.utc_now(), extra=dict(extra or {}))
