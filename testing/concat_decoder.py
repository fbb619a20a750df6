"""Reference: a concat-layout decoder package, as `python -m export --cache-layout concat` wrote them before the
in-place cache became the only layout (export no longer writes them; the server lists them NOT_SERVING, naming
the command that re-exports the checkpoint).

The graph is the PyTorch model traced by torch.onnx (`present = concat(past, new)`: the cache grows by one position
per step), with docs/model-package.md's names. Tests use it as a package the server must refuse, and as an
independent reference graph (testing/offline.py's greedy_generate runs it one sequence at a time). No parity gate
runs: parity.json says passed (fp32 too: the server asks each variant's own verdict) and hashes the files, as the
server requires of any package.

    pkg = concat_package(checkpoint_dir, repository, "gpt-concat")     # <repository>/gpt-concat/1
"""
from __future__ import annotations

import warnings
from pathlib import Path

import onnx
import torch
from tokenizers import Tokenizer
from torch import nn

from export import package
from export.checkpoint_tokens import special_tokens
from export.config import OPSET
from export.graphs import GraphSpec, TensorSpec
from export.package_manifest import new_manifest, tensors
from export.source import inspect_checkpoint, load_torch_model
from export.tokenizer_check import package_tokenizer
from modelpkg import LAYOUT_CONCAT, CacheSpec, past_name, present_name

GRAPH = "model.onnx"


def concat_spec(num_layers: int) -> GraphSpec:
    """The concat graph's I/O: past [batch, heads, past_sequence, head_dim] in, past + new out."""
    past = ("batch", "heads", "past_sequence", "head_dim")
    total = ("batch", "heads", "past_sequence+sequence", "head_dim")
    inputs = [TensorSpec("input_ids", "int64", ("batch", "sequence")),
              TensorSpec("attention_mask", "int64", ("batch", "past_sequence+sequence")),
              TensorSpec("position_ids", "int64", ("batch", "sequence"))]
    outputs = [TensorSpec("logits", "float32", ("batch", "sequence", "vocab"))]
    for i in range(num_layers):
        for kv in ("key", "value"):
            inputs.append(TensorSpec(past_name(i, kv), "float32", past))
            outputs.append(TensorSpec(present_name(i, kv), "float32", total))
    return GraphSpec(tuple(inputs), tuple(outputs))


class _FlatCache(nn.Module):
    """past_key_values / presents as named tensors: ONNX graphs have no nested inputs."""

    def __init__(self, model: nn.Module, num_layers: int) -> None:
        super().__init__()
        self.model = model
        self.num_layers = num_layers

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                *past_flat: torch.Tensor) -> tuple[torch.Tensor, ...]:
        past = [(past_flat[2 * i], past_flat[2 * i + 1]) for i in range(self.num_layers)]
        logits, presents = self.model(input_ids, attention_mask=attention_mask, position_ids=position_ids,
                                      past_key_values=past)
        return (logits, *(t for kv in presents for t in kv))


def _trace_inputs(vocab_size: int, num_layers: int, num_heads: int, head_dim: int) -> tuple[torch.Tensor, ...]:
    """Distinct sizes (batch 2, past 3, new 4) so no two axes get tied together; left padding in the last row."""
    g = torch.Generator().manual_seed(0)
    batch, past, seq = 2, 3, 4
    ids = torch.randint(0, vocab_size, (batch, seq), generator=g)
    mask = torch.ones(batch, past + seq, dtype=torch.long)
    mask[-1, :2] = 0
    positions = (mask.cumsum(-1) - 1).clamp(min=0)[:, past:]
    kv = [torch.randn(batch, num_heads, past, head_dim, generator=g) for _ in range(2 * num_layers)]
    return (ids, mask, positions, *kv)


def export_concat_graph(model: nn.Module, num_layers: int, num_heads: int, head_dim: int, vocab_size: int,
                        out: Path) -> GraphSpec:
    """Trace `model` (a GPT-2 of training/gpt.py) into the concat graph at `out`."""
    spec = concat_spec(num_layers)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")   # the legacy exporter is deprecated; it is the one the old export used
        torch.onnx.export(_FlatCache(model, num_layers).eval(), _trace_inputs(vocab_size, num_layers, num_heads, head_dim),
                          str(out), input_names=spec.input_names, output_names=spec.output_names,
                          dynamic_axes=spec.dynamic_axes(), opset_version=OPSET, do_constant_folding=True, dynamo=False)
    onnx.checker.check_model(str(out))
    return spec


def concat_package(checkpoint: Path, repository: Path, name: str, version: int = 1) -> Path:
    """Publish the concat-layout package of a GPT-2 checkpoint as <repository>/<name>/<version>; returns its path."""
    info = inspect_checkpoint(Path(checkpoint), "generate")
    if info.model_type != "gpt2":
        raise ValueError(f"checkpoint: concat packages were GPT-2 only, got {info.model_type!r}")
    model = load_torch_model(info, "generate")
    name_dir = Path(repository) / name
    staging = package.staging_dir(name_dir)
    spec = export_concat_graph(model, info.num_layers, info.num_heads, info.head_dim, int(info.config["vocab_size"]),
                               staging / GRAPH)
    package_tokenizer(info.path, staging, info.max_positions)
    ids, _ = special_tokens(info, Tokenizer.from_file(str(staging / "tokenizer.json")))
    cache = CacheSpec(info.num_layers, info.num_heads, info.head_dim, LAYOUT_CONCAT, num_kv_heads=info.num_kv_heads,
                      has_layout=True)
    manifest = new_manifest(name, "generate", info, max_length=info.max_positions, special_tokens=ids,
                            inputs=tensors(spec.inputs), outputs=tensors(spec.outputs), cache=cache,
                            variants={"fp32": GRAPH}, default_variant={"cpu": "fp32", "cuda": "fp32"})
    package.publish_package(staging, name_dir, version, False, manifest,
                            {"passed": True, "note": "testing/concat_decoder.py: a reference package, not gated",
                             "variants": {"fp32": {"passed": True, "status": "passed"}}})   # what the server asks
    return name_dir / str(version)
