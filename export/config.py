"""Configuration dataclasses of the export stage, one per concern."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

TASKS = ("classify", "fill-mask", "generate", "embed")
VARIANTS = ("fp32", "optimized", "int8", "fp16", "kv8")
CACHE_LAYOUTS = ("inplace", "concat")
# 18 is the opset both torch exporters and Optimum agree on, and every fusion/quantization tool here reads it.
OPSET = 18


@dataclass(frozen=True)
class Tolerances:
    """Parity thresholds per variant (see docs/model-package.md)."""

    fp32_atol: float = 1e-4
    fp32_rtol: float = 1e-4
    optimized_atol: float = 5e-4
    optimized_rtol: float = 5e-4
    int8_top1_agreement: float = 0.99
    int8_max_accuracy_drop: float = 0.01  # one point
    fp16_top1_agreement: float = 0.99
    # kv8 (int8 KV cache), teacher-forced decoding through the quantized cache vs PyTorch: mean KL divergence
    # of the next-token distributions (nats) and perplexity ratio on the next true token
    kv8_max_kl: float = 0.01
    kv8_max_perplexity_ratio: float = 1.02
    kv8_mixed_atol: float = 1e-4      # its mixed twin vs the plain kv8 graph (rtol the same; measured: equal)
    # fp16 in-place decoder (CUDA), judged like kv8: teacher-forced KL and perplexity ratio vs PyTorch fp32
    fp16_max_kl: float = 0.01
    fp16_max_perplexity_ratio: float = 1.02
    fp16_mixed_atol: float = 2e-2     # its mixed twin vs the plain fp16 graph: fp16 sums in other orders


@dataclass(frozen=True)
class GridConfig:
    """Input shapes the gate runs (docs: batch 1 and 3 with padding; past 0, 1, 2, 7 x new 1, 2, n)."""

    batches: tuple[int, ...] = (1, 3)
    past_lengths: tuple[int, ...] = (0, 1, 2, 7)
    new_lengths: tuple[int, ...] = (1, 2, 9)
    greedy_new_tokens: int = 64
    recompute_tokens: int = 12  # length of the cached-vs-recompute comparison


@dataclass(frozen=True)
class ExportConfig:
    """One `python -m export CHECKPOINT ...` run."""

    checkpoint: Path
    task: str
    repository: Path
    name: str
    version: int | None = None
    variants: tuple[str, ...] = ("fp32",)
    eval_data: Path | None = None
    tolerances: Tolerances = field(default_factory=Tolerances)
    grid: GridConfig = field(default_factory=GridConfig)
    threads: int = 1  # onnxruntime intra-op threads during the gate
    cache_layout: str = "inplace"  # generate: "inplace" (GroupQueryAttention, shared buffer) or "concat" (traced)
    pooling: str = "auto"          # embed: auto (the checkpoint's sentence-transformers config, else mean), mean, cls
    normalize: str = "auto"        # embed: auto (a Normalize module in modules.json), on, off
