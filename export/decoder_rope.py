"""The in-place decoder's rotary tables and what the attention op can take of a Llama-family model's rotary, q/k
norm and NoPE settings (export/decoder_graph.py writes them; training/rope.py computes the frequencies).

The cos/sin tables are computed once in float64 for every position up to the package's max length and stored
fp32; a static table is exact where the rope type's frequencies do not depend on the call (training/rope.py:
longrope and dynamic only up to a length, refused beyond it). onnxruntime's CPU GroupQueryAttention takes the
rotary width from the tables (2 x their width, which must be a multiple of 8): partial rotary is the op's own.
"""
from __future__ import annotations

import numpy as np

from modelpkg import padded_head_dim

from .errors import ExportError

ROPE_TABLE_MULTIPLE = 8   # GroupQueryAttention (CPU): "cos_cache dimension 1 must be ... a multiple of 8"


def rope_settings(config, max_length: int) -> tuple[np.ndarray, float, tuple[bool, ...] | None]:
    """(inverse frequencies [rotary_dim / 2] in float64, the factor on cos/sin, per-layer rotary on/off or None)
    of training.llama.LlamaConfig `config` for a package of `max_length` positions; ExportError naming the setting
    the graph would get wrong."""
    import torch

    rope, d = config.rope, config.head_dim
    limit = rope.exact_up_to(config.max_position_embeddings)
    if limit is not None and max_length > limit:
        raise ExportError(f"rope_parameters.rope_type: {rope.rope_type} switches frequencies past {limit} positions "
                          f"in transformers (per call); a static table for {max_length} positions would differ: "
                          f"export with a max length of at most {limit}")
    rot = rope.rotary_dim(d)
    padded = padded_head_dim(d) != d
    if rot != d and (padded or (rot // 2) % ROPE_TABLE_MULTIPLE):
        raise ExportError(f"partial_rotary_factor: rotary dim {rot} of head {d}: the attention op needs a "
                          f"multiple of {2 * ROPE_TABLE_MULTIPLE} in an unpadded head")
    if config.qk_norm and padded:
        # zero channels would enter the per-head RMS mean
        raise ExportError(f"head_dim: {d} with q/k norm (qwen3) would need padding to {padded_head_dim(d)}, which "
                          "changes the per-head RMS; not supported")
    inv, scale = rope.inv_freq(d, config.max_position_embeddings, seq_len=max_length, dtype=torch.float64)
    layers = None
    if config.no_rope_layers is not None:
        layers = tuple(config.rotary_layer(i) for i in range(config.num_hidden_layers))
    return inv.numpy(), float(scale), layers


def rope_tables(inv_freq: np.ndarray, scale: float, max_length: int, head_dim: int, partial: bool
                ) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin [max_length, width] for HF's rotate-half rotary, times `scale`. Width: the rotary half-width when
    partial, else head_dim / 2, a padded head's extra pairs getting the identity rotation (cos 1, sin 0: they hold
    zeros either way)."""
    half = len(inv_freq) if partial else head_dim // 2
    angles = np.arange(max_length, dtype=np.float64)[:, None] * inv_freq[None, :]
    cos, sin = np.ones((max_length, half)), np.zeros((max_length, half))
    cos[:, :len(inv_freq)], sin[:, :len(inv_freq)] = np.cos(angles) * scale, np.sin(angles) * scale
    return cos.astype(np.float32), sin.astype(np.float32)
