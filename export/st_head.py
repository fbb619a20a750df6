"""What follows the encoder in an embedding graph: pooling (each sentence-transformers mode, concatenated in the
configured order), then the Dense and Normalize modules in order (export/st_modules.py reads them).

The maths is sentence-transformers' Pooling._forward_padded for right-padded rows (the only padding the gate and
the server feed): the first token is [CLS], the last real token is at length - 1, weights of weightedmean count
from 1 at the first token.
"""
from __future__ import annotations

import torch
from torch import nn

from .st_modules import DenseLayer

_ACTIVATIONS = {"tanh": nn.Tanh, "identity": nn.Identity, "relu": nn.ReLU, "sigmoid": nn.Sigmoid, "gelu": nn.GELU}


def pool(mode: str, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """One mode's [batch, hidden] vector over the rows' real tokens (mask: [batch, sequence] of 0/1)."""
    m = mask.unsqueeze(-1).to(hidden.dtype)
    if mode == "cls":
        return hidden[:, 0]
    if mode == "max":
        return hidden.masked_fill(m == 0, float("-inf")).max(dim=1).values
    if mode in ("mean", "mean_sqrt_len_tokens"):
        count = m.sum(dim=1).clamp(min=1e-9)
        return (hidden * m).sum(dim=1) / (count if mode == "mean" else torch.sqrt(count))
    if mode == "weightedmean":
        positions = torch.cumsum(torch.ones_like(mask), dim=1).to(hidden.dtype).unsqueeze(-1)
        weights = m * positions
        return (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)
    if mode == "lasttoken":
        last = (mask.sum(dim=1) - 1).clamp(min=0).long()
        index = last.view(-1, 1, 1).expand(-1, 1, hidden.shape[-1])
        return torch.gather(hidden * m, 1, index).squeeze(1)
    raise ValueError(f"pooling mode {mode!r}")


class StHead(nn.Module):
    """pool -> (Dense | Normalize)* as the checkpoint's modules say."""

    def __init__(self, modes: tuple[str, ...], steps: tuple[DenseLayer | str, ...] = ()) -> None:
        super().__init__()
        self.modes = modes
        self.layers = nn.ModuleList()
        self.plan: list[str] = []
        for step in steps:
            if isinstance(step, DenseLayer):
                linear = nn.Linear(step.weight.shape[1], step.weight.shape[0], bias=step.bias is not None)
                with torch.no_grad():
                    linear.weight.copy_(step.weight)
                    if step.bias is not None:
                        linear.bias.copy_(step.bias)
                self.layers.append(nn.Sequential(linear, _ACTIVATIONS[step.activation]()))
                self.plan.append("dense")
            else:
                self.plan.append("normalize")

    def forward(self, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = torch.cat([pool(mode, hidden, mask) for mode in self.modes], dim=-1)
        dense = iter(self.layers)
        for step in self.plan:
            x = next(dense)(x) if step == "dense" else nn.functional.normalize(x, p=2.0, dim=-1)
        return x
