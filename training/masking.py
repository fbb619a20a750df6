"""Dynamic MLM masking and the optional sentence-pair objectives (NSP / SOP).

Masking is applied per batch with a seeded generator, so every epoch sees new masks and a run is
reproducible (and identical across processes, which mask the same global batch).
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal, Sequence

import torch

IGNORE_INDEX = -100
PairObjective = Literal["none", "nsp", "sop"]


@dataclass
class MaskingConfig:
    """BERT's recipe: select 15% of the maskable tokens; of those 80% [MASK], 10% random, 10% kept."""

    mlm_probability: float = 0.15
    mask_fraction: float = 0.8
    random_fraction: float = 0.1

    def __post_init__(self) -> None:
        if not 0.0 < self.mlm_probability < 1.0:
            raise ValueError(f"mlm_probability: must be in (0, 1), got {self.mlm_probability}")
        if self.mask_fraction < 0 or self.random_fraction < 0 or self.mask_fraction + self.random_fraction > 1:
            raise ValueError("mask_fraction/random_fraction: must be >= 0 and sum to at most 1")


def mask_tokens(input_ids: torch.Tensor, maskable: torch.Tensor, mask_id: int, random_ids: torch.Tensor,
                config: MaskingConfig, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (masked input_ids, labels); labels are IGNORE_INDEX except at selected positions.

    maskable: bool tensor, False at special tokens and padding (never selected).
    random_ids: 1-D tensor of ids a "random" replacement is drawn from (the non-special vocab).
    """
    shape = input_ids.shape
    probs = torch.full(shape, config.mlm_probability)
    selected = torch.bernoulli(probs, generator=generator).bool() & maskable
    labels = torch.where(selected, input_ids, torch.full_like(input_ids, IGNORE_INDEX))
    # One uniform draw per position splits the selected ones 80/10/10.
    u = torch.rand(shape, generator=generator)
    to_mask = selected & (u < config.mask_fraction)
    to_random = selected & (u >= config.mask_fraction) & (u < config.mask_fraction + config.random_fraction)
    picks = torch.randint(len(random_ids), shape, generator=generator)
    out = input_ids.clone()
    out[to_mask] = mask_id
    out[to_random] = random_ids[picks[to_random]]
    return out, labels


def non_special_ids(vocab_size: int, special_ids: Sequence[int]) -> torch.Tensor:
    """All ids except the special ones: where random replacements come from."""
    keep = torch.ones(vocab_size, dtype=torch.bool)
    keep[list(special_ids)] = False
    return torch.nonzero(keep).flatten()


@dataclass(frozen=True)
class PairExample:
    """Two segments and the pair label (NSP: 1 = B is a random segment; SOP: 1 = A and B swapped)."""

    a: list[int]
    b: list[int]
    label: int


def build_pairs(documents: Sequence[Sequence[list[int]]], objective: PairObjective, max_tokens: int,
                seed: int) -> list[PairExample]:
    """Cut each document (a list of tokenised lines) into chunks of whole lines of at most
    `max_tokens` ids and split each chunk at a random line boundary into A / B.

    NSP (BERT): half the B segments are replaced by a chunk half from another document.
    SOP (ALBERT): half the pairs are swapped (B then A), both from the same document.
    """
    if objective not in ("nsp", "sop"):
        raise ValueError(f"pair_objective: expected 'nsp' or 'sop', got {objective!r}")
    rng = random.Random(seed)
    chunks: list[tuple[int, list[list[int]]]] = []  # (document index, lines)
    for d, lines in enumerate(documents):
        cur: list[list[int]] = []
        n = 0
        for ln in lines:
            ln = ln[:max_tokens]
            if cur and n + len(ln) > max_tokens:
                chunks.append((d, cur))
                cur, n = [], 0
            cur.append(ln)
            n += len(ln)
        if cur:
            chunks.append((d, cur))
    chunks = [c for c in chunks if len(c[1]) >= 2]
    if not chunks:
        raise ValueError("corpus: no chunk has two lines to build sentence pairs from")
    pairs = []
    for d, lines in chunks:
        cut = rng.randint(1, len(lines) - 1)
        a = [t for ln in lines[:cut] for t in ln]
        b = [t for ln in lines[cut:] for t in ln]
        label = int(rng.random() < 0.5)
        if label and objective == "sop":
            a, b = b, a
        elif label:  # nsp: B from another document (keep A's length budget)
            others = [c for c in (chunks[rng.randrange(len(chunks))] for _ in range(10)) if c[0] != d]
            if not others:
                label = 0
            else:
                other = others[0][1]
                start = rng.randrange(len(other))
                b = [t for ln in other[start:] for t in ln][: max(1, max_tokens - len(a))]
        pairs.append(PairExample(a, b, label))
    return pairs
