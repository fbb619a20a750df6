"""Configuration dataclasses of the export stage, one per concern."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

TASKS = ("classify", "fill-mask", "generate", "embed")
# w8 / w4: weight-quantized in-place decoders (MatMulNBits); w8kv8 / w4kv8 the same over the int8 cache
WEIGHT_VARIANTS = ("w8", "w4", "w8kv8", "w4kv8")
VARIANTS = ("fp32", "optimized", "int8", "fp16", "kv8", *WEIGHT_VARIANTS)
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
    # Weight-quantized decoders (w8, w4 and their kv8 twins), judged by what they change against PyTorch fp32:
    # teacher-forced perplexity ratio on held-out sentences, and greedy agreement = identical leading ids of
    # 32-token greedy continuations of the held-out prompts, averaged over the prompts (PLACEHOLDER: measured).
    w8_max_perplexity_ratio: float = 1.01
    w8_min_greedy_tokens: float = 24.0
    w4_max_perplexity_ratio: float = 1.05
    w4_min_greedy_tokens: float = 12.0
    weights_mixed_atol: float = 1e-4  # a quantized mixed twin vs its plain graph on each sequence alone
    greedy_agreement_tokens: int = 32

    def weight_limits(self, bits: int) -> tuple[float, float]:
        """(max perplexity ratio, min mean identical greedy tokens) of a `bits`-bit weight variant."""
        if bits == 8:
            return self.w8_max_perplexity_ratio, self.w8_min_greedy_tokens
        return self.w4_max_perplexity_ratio, self.w4_min_greedy_tokens


@dataclass(frozen=True)
class WeightQuantConfig:
    """How the weight-quantized variants are made (export/weights.py); recorded per variant in the package.
    PLACEHOLDER values until measured (bench/quantized.py --grid)."""

    block_size: int = 32
    accuracy_level: int = 4      # MatMulNBits: 0 = fp32 compute, 4 = int8 activations per block
    symmetric: bool = True
    algorithm: str = "rtn"       # "rtn" (round to nearest, DefaultWeightOnlyQuantConfig) or "hqq" (4 bits)
    lm_head: bool = True         # the LM head too (a transposed copy when tied to the embedding)

    def as_json(self, bits: int) -> dict:
        return {"bits": bits, "block_size": self.block_size, "accuracy_level": self.accuracy_level,
                "symmetric": self.symmetric, "algorithm": self.algorithm, "lm_head": self.lm_head}


# bits -> how that width is quantized
WEIGHT_QUANT: dict[int, WeightQuantConfig] = {8: WeightQuantConfig(), 4: WeightQuantConfig()}


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
    weight_quant: dict[int, WeightQuantConfig] = field(default_factory=lambda: dict(WEIGHT_QUANT))
