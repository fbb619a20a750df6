"""Configuration dataclasses of the export stage, one per concern."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

TASKS = ("classify", "fill-mask", "generate", "embed", "token-classify")
# w8 / w4: weight-quantized in-place decoders (MatMulNBits); w8kv8 / w4kv8 the same over the int8 cache
WEIGHT_VARIANTS = ("w8", "w4", "w8kv8", "w4kv8")
VARIANTS = ("fp32", "optimized", "int8", "fp16", "kv8", *WEIGHT_VARIANTS)
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
    # Weight-quantized decoders (w8, w4 and their kv8 twins), judged by what they change against PyTorch fp32:
    # the perplexity ratio on the next true token, teacher-forced through the graph's cache on held-out sentences
    # (156 positions), and greedy agreement = how many leading ids of each held-out prompt's 32-token greedy
    # continuation equal PyTorch's, averaged over the 24 prompts (fp32 gives 32). Measured on the trained
    # defaults (GPT-2 / Llama small, bench/quantized.py, 2026-11-26): w8 1.0008 / 1.0004 and 29.0 / 30.7; w4
    # 1.0022 / 0.9968 and 29.8 / 28.2 (a 4-bit LM head: 22.5 / 27.2). Greedy ids of these high-entropy models
    # flip on near ties (their corpus perplexity ~300), hence the room; a broken graph scores 0-4.
    w8_max_perplexity_ratio: float = 1.01
    w8_min_greedy_tokens: float = 24.0
    w4_max_perplexity_ratio: float = 1.03
    w4_min_greedy_tokens: float = 20.0
    # A quantized mixed twin vs its plain graph making the same calls (decode rows, then the chunk, apart), absolute.
    # MatMulNBits at accuracy level 4 is not bit-equal across call shapes: a row's result depends on the rows it is
    # computed with, and 12 layers deep that reached 7.0e-3 (w8) and 1.2e-2 (w4) in the cache of the 124M Llama
    # trained for the benchmarks (1e-6 on the 4-layer defaults). A wiring fault moves logits by whole units.
    weights_mixed_atol: float = 3e-2
    # ... over an int8 cache (w8kv8, w4kv8): MatMulNBits rows differ across call shapes by ~1e-6, so a cache value
    # on a rounding boundary may take the next int8 step, and the logits move with it: measured on the trained
    # Llama's w4kv8, one value one step away and the logits 7.7e-3 (absolute; w8kv8 equal to 2e-6)
    weights_kv8_mixed_cache_steps: float = 1.0
    weights_kv8_mixed_atol: float = 3e-2
    greedy_agreement_tokens: int = 32

    # Weight-quantized encoder-decoders (w8, w4: encoder and decoder graphs, export/seq2seq_quantized.py), judged
    # against PyTorch fp32 on 72 held-out sources (48 words, 24 five-word phrases of the held-out sentences): the
    # share of greedy outputs (up to 24 new tokens) identical to PyTorch's, and the perplexity ratio teacher-forced
    # along PyTorch's greedy outputs. Measured 2026-11-26 on the trained g2p model (block 128, 8-bit head): w8
    # 0.861 identical (every miss on a multi-word phrase or a long word, the outputs it was never trained for),
    # ratio 1.0007, mean KL 4e-4 nats; w4 0.667, 1.041, 0.026 nats. On CMUdict's 3,731 test words the same w8
    # gives 98.9% of fp32's outputs and WER +0.1 point, w4 91.3% and +0.6 (docs/MODELS.md). The random OPUS-MT-shaped
    # Marian of the benchmarks: w8 1.0 identical, ratio 0.998; w4 1.0, 1.027. Random test models
    # (testing/seq2seq_checkpoints.py: flat distributions, many near ties) scored w8 0.51-1.0 identical, ratio <=
    # 1.008; w4 0.01-0.90, ratio <= 1.17. A perturbed graph scores a ratio of several units. The identical-output
    # floor is far under g2p's (greedy ids flip on near ties and one flip changes the rest of an output); the
    # ratio is the tight limit.
    seq2seq_w8_min_identical: float = 0.5
    seq2seq_w8_max_perplexity_ratio: float = 1.01
    seq2seq_w4_min_identical: float = 0.5
    seq2seq_w4_max_perplexity_ratio: float = 1.06

    def weight_limits(self, bits: int) -> tuple[float, float]:
        """(max perplexity ratio, min mean identical greedy tokens) of a `bits`-bit weight variant."""
        if bits == 8:
            return self.w8_max_perplexity_ratio, self.w8_min_greedy_tokens
        return self.w4_max_perplexity_ratio, self.w4_min_greedy_tokens

    def seq2seq_weight_limits(self, bits: int) -> tuple[float, float]:
        """(min share of identical greedy outputs, max perplexity ratio) of a `bits`-bit encoder-decoder variant."""
        if bits == 8:
            return self.seq2seq_w8_min_identical, self.seq2seq_w8_max_perplexity_ratio
        return self.seq2seq_w4_min_identical, self.seq2seq_w4_max_perplexity_ratio


@dataclass(frozen=True)
class WeightQuantConfig:
    """How the weight-quantized variants are made (export/weights.py); recorded per variant in model.json
    `quantization`. Chosen by measurement (bench/quantized.py --grid, docs/BENCHMARKS.md), 2026-11-26, 2 cores:
    - accuracy_level 4 (int8 activations): at level 0 (fp32 compute) 8-bit weights ran 4-13 ms a step instead
      of 0.5 (a dequantizing path), 4-bit 1.5-1.8x slower;
    - block 128: vs block 32 the 124M Llama shape's batch-1 step 3.28 vs 4.04 ms and batch 8 10.4 vs 12.3; on
      the small defaults batch 8 8-10% faster, batch 1 within noise; 4-bit mean KL 3.7e-4 vs 1.9e-4 nats
      (Llama) and 0.9e-4 vs 1.7e-4 (GPT-2), held-out corpus perplexity within 0.05% either way; a weight
      narrower than the block takes the largest power of two that fits;
    - LM head (tied: a transposed copy of the embedding, which stays fp32 for the lookup) in 8 bits: vs fp32
      the 4-bit step 1.5x faster at batch 1 on the small defaults (the head is 40% of their weights) at the
      same KL; in 4 bits 10-20% faster still but KL 5x and greedy agreement 22.5 instead of 29.8 (GPT-2);
    - symmetric round-to-nearest: HQQ (float zero points) ran 8-13x slower through MatMulNBits; asymmetric
      RTN: KL 0.7-1.4e-4, corpus perplexity and speed the same within noise (block 32)."""

    block_size: int = 128
    accuracy_level: int = 4      # MatMulNBits: 0 = fp32 compute, 4 = int8 activations per block
    symmetric: bool = True
    algorithm: str = "rtn"       # "rtn" (round to nearest, DefaultWeightOnlyQuantConfig) or "hqq" (4 bits)
    lm_head_bits: int | None = 8  # the LM head's bits (a transposed copy when tied to the embedding); None = fp32

    def as_json(self, bits: int) -> dict:
        return {"bits": bits, "block_size": self.block_size, "accuracy_level": self.accuracy_level,
                "symmetric": self.symmetric, "algorithm": self.algorithm, "lm_head_bits": self.lm_head_bits}


# bits -> how that width is quantized
WEIGHT_QUANT: dict[int, WeightQuantConfig] = {8: WeightQuantConfig(), 4: WeightQuantConfig()}


@dataclass(frozen=True)
class GridConfig:
    """Decoding lengths the decoder's gate runs."""

    greedy_new_tokens: int = 64


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
    pooling: str = "auto"          # embed: auto (the checkpoint's sentence-transformers config, else mean), mean, cls
    normalize: str = "auto"        # embed: auto (a Normalize module in modules.json), on, off
    matryoshka: bool = False       # embed: the package declares Matryoshka vectors (served `dimensions` shortening)
    weight_quant: dict[int, WeightQuantConfig] = field(default_factory=lambda: dict(WEIGHT_QUANT))
    # Encoder-decoders: the longest source (the cross buffer's width) and target (the self cache's length); None:
    # the position table's length (Marian, BART), 512 for T5 (relative positions, no table) unless n_positions.
    max_source_length: int | None = None
    max_target_length: int | None = None
