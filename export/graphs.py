"""torch.onnx export of the encoder graphs (classify, token-classify, fill-mask), with the names of
docs/model-package.md, and the I/O spec types every graph's model.json entry is made from. Decoders are written
by hand (export/decoder_graph.py, export/seq2seq_graph.py).

Exporter choice: the legacy TorchScript exporter (`dynamo=False`). For BERT it is the only one whose
graph onnxruntime's `optimize_model(model_type="bert")` fuses fully (Attention, SkipLayerNorm,
EmbedLayerNorm, BiasGelu).
"""
from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass
from pathlib import Path

import onnx
import torch
from torch import nn

from .config import OPSET

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str
    shape: tuple[str, ...]

    def as_json(self) -> dict:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}


@dataclass(frozen=True)
class GraphSpec:
    """Inputs and outputs of one exported graph (what model.json lists)."""

    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]

    @property
    def input_names(self) -> list[str]:
        return [t.name for t in self.inputs]

    @property
    def output_names(self) -> list[str]:
        return [t.name for t in self.outputs]

    def dynamic_axes(self) -> dict[str, dict[int, str]]:
        # Fixed axes (labels, vocab, heads, head_dim) are not dynamic.
        fixed = {"labels", "vocab", "heads", "head_dim"}
        return {t.name: {i: a for i, a in enumerate(t.shape) if a not in fixed} for t in (*self.inputs, *self.outputs)}


ENCODER_INPUTS = tuple(TensorSpec(n, "int64", ("batch", "sequence"))
                       for n in ("input_ids", "attention_mask", "token_type_ids"))


def encoder_spec(task: str, token_types: bool = True) -> GraphSpec:
    """token_types=False: no token_type_ids input (RoBERTa, DistilBERT); the manifest lists the inputs."""
    shape = {"classify": ("batch", "labels"), "token-classify": ("batch", "sequence", "labels")}.get(
        task, ("batch", "sequence", "vocab"))
    inputs = ENCODER_INPUTS if token_types else tuple(t for t in ENCODER_INPUTS if t.name != "token_type_ids")
    return GraphSpec(inputs, (TensorSpec("logits", "float32", shape),))


class EncoderAdapter(nn.Module):
    """Fixes the argument order and returns the logits tensor alone (BertForPreTraining: the MLM logits)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        out = self.model(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
        return out[0] if isinstance(out, (tuple, list)) else out


def encoder_example(vocab_size: int, batch: int = 2, seq: int = 5) -> tuple[torch.Tensor, ...]:
    """Trace inputs: batch and sequence >= 2 so no axis is specialised to 1; one padded row."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, vocab_size, (batch, seq), generator=g)
    mask = torch.ones(batch, seq, dtype=torch.long)
    mask[-1, -2:] = 0
    types = torch.zeros(batch, seq, dtype=torch.long)
    types[:, seq // 2:] = 1
    return ids, mask, types


def _export(module: nn.Module, args: tuple[torch.Tensor, ...], spec: GraphSpec, out: Path) -> None:
    with warnings.catch_warnings():
        # The legacy exporter is deprecated but is the one onnxruntime's fusions match (module docstring).
        warnings.simplefilter("ignore")
        torch.onnx.export(module, args, str(out), input_names=spec.input_names, output_names=spec.output_names,
                          dynamic_axes=spec.dynamic_axes(), opset_version=OPSET, do_constant_folding=True,
                          dynamo=False)
    model = onnx.load(str(out))
    external = [t.name for t in model.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    if external:
        raise RuntimeError(f"{out.name}: weights were written as external data ({external[:3]}...)")
    onnx.checker.check_model(model)


def export_encoder(model: nn.Module, task: str, vocab_size: int, out: Path, token_types: bool = True) -> GraphSpec:
    spec = encoder_spec(task, token_types)
    example = encoder_example(vocab_size)
    with torch.no_grad():
        _export(EncoderAdapter(model).eval(), example if token_types else example[:2], spec, out)
    log.info("exported %s graph to %s", task, out)
    return spec
