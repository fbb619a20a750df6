"""Hugging Face's weight init for the encoder families and GPT-2 (training/bert.py and the heads it shares),
and Marian's from-scratch variant (training/marian.py)."""
from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn


def init_weights(module: nn.Module, std: float,
                 linear_init: Callable[[torch.Tensor], Any] | None = None) -> None:
    """HF's BERT/GPT-2 init: normal(0, std) weights, zero biases, unit LayerNorm, zero padding row.

    linear_init: how Linear weights are drawn instead of normal(0, std) (Marian's Xavier-uniform)."""
    if isinstance(module, nn.Linear):
        if linear_init is None:
            nn.init.normal_(module.weight, mean=0.0, std=std)
        else:
            linear_init(module.weight)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, mean=0.0, std=std)
        if module.padding_idx is not None:
            with torch.no_grad():
                module.weight[module.padding_idx].zero_()
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)
