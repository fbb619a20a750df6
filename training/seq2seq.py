"""What the encoder-decoder families (training/marian.py, bart.py, t5.py) share: attention masks, the scaled
dot-product with a mask, and the greedy reference decoder.

Every seq2seq model here has the same call convention, so the greedy reference, the g2p task and (later) the
exporter drive any of them alike:

    encode(input_ids [B, S], attention_mask [B, S]) -> encoder states [B, S, C]
    cross_key_values(encoder states) -> per decoder layer (k, v) each [B, H, S, D]: computed once per source
    decode(decoder_input_ids [B, T], cross_key_values, encoder_attention_mask [B, S],
           decoder_attention_mask [B, P+T] | None, past_key_values | None)
        -> (logits [B, T, V], presents: per layer (k, v) each [B, H, P+T, D])
    forward(input_ids, attention_mask, decoder_input_ids, decoder_attention_mask=None) -> logits [B, T, V]

Targets are right-padded (as transformers feeds them): decoder position t of a row is P + t, whatever the
padding of other rows.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

KV = tuple[torch.Tensor, torch.Tensor]


def source_allowed(attention_mask: torch.Tensor | None, b: int, s: int, device: torch.device) -> torch.Tensor:
    """Keys a query may see in encoder self-attention and cross-attention: bool [B, 1, 1, S] (real tokens)."""
    if attention_mask is None:
        return torch.ones(b, 1, 1, s, dtype=torch.bool, device=device)
    return attention_mask[:, None, None, :].bool()


def target_allowed(decoder_attention_mask: torch.Tensor | None, b: int, t: int, p: int,
                   device: torch.device) -> torch.Tensor:
    """Decoder self-attention for T new tokens after a past of P: bool [B, 1, T, P+T], causal over absolute
    positions AND the decoder mask's real tokens when one is given."""
    q_pos = torch.arange(t, device=device) + p
    k_pos = torch.arange(p + t, device=device)
    causal = (k_pos[None, :] <= q_pos[:, None])[None, None]
    if decoder_attention_mask is None:
        return causal.expand(b, 1, t, p + t)
    return causal & decoder_attention_mask[:, None, None, :].bool()


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor, scale: float,
           bias: torch.Tensor | None = None, dropout: nn.Module | None = None) -> torch.Tensor:
    """softmax(q k^T * scale + bias, masked) v for q [B, H, T, D], k/v [B, H, K, D] -> [B, H, T, D].
    finfo.min rather than -inf: a query that sees nothing gets a finite uniform row, not NaN."""
    scores = torch.matmul(q, k.transpose(-1, -2))
    if scale != 1.0:
        scores = scores * scale
    if bias is not None:
        scores = scores + bias
    scores = torch.where(allowed, scores, torch.finfo(scores.dtype).min)
    probs = torch.softmax(scores, dim=-1)
    if dropout is not None:
        probs = dropout(probs)
    return torch.matmul(probs, v)


def split_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """[B, T, H*D] -> [B, H, T, D]."""
    b, t, _ = x.shape
    return x.view(b, t, heads, -1).transpose(1, 2)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """[B, H, T, D] -> [B, T, H*D]."""
    b, h, t, d = x.shape
    return x.transpose(1, 2).reshape(b, t, h * d)


@torch.no_grad()
def generate_greedy(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                    max_new_tokens: int) -> torch.Tensor:
    """Reference greedy decoding with the self-attention cache and cross keys/values computed once.
    Returns the new ids [B, N] (N <= max_new_tokens), as transformers' generate does after the start token:
    forced_bos_token_id on the first step, forced_eos_token_id on the last allowed one (when the config sets
    them), a finished row emits pad, and decoding stops once every row has produced eos."""
    c = model.config
    b = input_ids.shape[0]
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    cross = model.cross_key_values(model.encode(input_ids, attention_mask))
    nxt = torch.full((b,), c.decoder_start_token_id, dtype=torch.long, device=input_ids.device)
    finished = torch.zeros(b, dtype=torch.bool, device=input_ids.device)
    eos, pad = c.eos_token_id, c.pad_token_id
    forced_bos, forced_eos = getattr(c, "forced_bos_token_id", None), getattr(c, "forced_eos_token_id", None)
    past: list[KV] | None = None
    out: list[torch.Tensor] = []
    for step in range(max_new_tokens):
        logits, past = model.decode(nxt[:, None], cross, attention_mask, past_key_values=past)
        nxt = logits[:, -1].argmax(dim=-1)
        if step == 0 and forced_bos is not None:
            nxt = torch.full_like(nxt, forced_bos)
        if step == max_new_tokens - 1 and forced_eos is not None:
            nxt = torch.full_like(nxt, forced_eos)
        if eos is not None:
            nxt = torch.where(finished, torch.full_like(nxt, pad if pad is not None else eos), nxt)
            finished |= nxt == eos
        out.append(nxt)
        if eos is not None and bool(finished.all()):
            break
    if not out:
        return input_ids.new_zeros((b, 0))
    return torch.stack(out, dim=1)
