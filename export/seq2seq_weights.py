"""An encoder-decoder checkpoint's weights as numpy arrays in MatMul orientation ([in, out]), one layout for the
families (training/marian.py, bart.py, t5.py, m2m100.py, mbart.py), so export/seq2seq_graph.py writes one graph per
side.

What differs between the families is carried as data, not as code paths in the graph:
  - Marian: post-LayerNorm blocks, fixed sinusoidal positions, embeddings scaled by sqrt(d_model) when the config
    says so, biases everywhere, `final_logits_bias`;
  - BART: Marian's blocks, learned positions (the stored table has 2 leading rows that position 0 skips), a
    LayerNorm over token + position embeddings (`layernorm_embedding`) on both sides;
  - T5: pre-norm RMS blocks, a final norm per stack, no biases, no absolute positions but a learned bias per head
    and relative position added to the self-attention scores (kept here per relative offset, so the graph only
    gathers: the bucket arithmetic stays torch's), scores not scaled, decoder output scaled by d_model^-0.5 when
    the head is tied;
  - mBART: BART's embeddings with pre-LayerNorm blocks and a final LayerNorm per stack;
  - M2M100 / NLLB: pre-norm blocks and final norms, fairseq's sinusoidal positions counted from the non-pad tokens
    (`position_pad`), no embedding norm, no logits bias.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

SEQ2SEQ_FAMILIES = ("marian", "bart", "t5", "m2m_100", "mbart")
# T5 has no position table: the longest source / target a package takes unless the config names one (n_positions).
T5_DEFAULT_MAX_LENGTH = 512


@dataclass
class Norm:
    weight: np.ndarray
    bias: np.ndarray | None          # None: T5's RMS norm


@dataclass
class Attention:
    """Projections [d_model, heads * d] (q, k, v) and [heads * d, d_model] (out), biases [out] or None."""

    q_w: np.ndarray
    q_b: np.ndarray | None
    k_w: np.ndarray
    k_b: np.ndarray | None
    v_w: np.ndarray
    v_b: np.ndarray | None
    o_w: np.ndarray
    o_b: np.ndarray | None


@dataclass
class FeedForward:
    """up [d_model, ffn] (gated: the gate's columns then the linear part's, [d_model, 2 ffn]), down [ffn, d_model]."""

    up_w: np.ndarray
    up_b: np.ndarray | None
    down_w: np.ndarray
    down_b: np.ndarray | None


@dataclass
class EncoderLayer:
    attn: Attention
    attn_norm: Norm
    ff: FeedForward
    ff_norm: Norm


@dataclass
class DecoderLayer:
    self_attn: Attention
    self_norm: Norm
    cross_attn: Attention             # k/v projections run in the encoder graph, q/out in the decoder graph
    cross_norm: Norm
    ff: FeedForward
    ff_norm: Norm


@dataclass
class Seq2SeqWeights:
    family: str                       # marian | bart | t5 | m2m_100 | mbart
    d_model: int
    encoder_heads: int
    decoder_heads: int
    head_dim: int                     # the decoder's head size (d_model / heads, or T5's d_kv)
    encoder_head_dim: int             # the encoder's (Marian may give the encoder other heads)
    pre_norm: bool                    # T5: norm before each sublayer, a final norm per stack
    norm_eps: float
    activation: str                   # relu | gelu | gelu_tanh | silu
    gated: bool                       # T5 v1.1: act(x W0) * (x W1)
    attention_scale: float            # decoder: 1/sqrt(head_dim), 1.0 for T5
    encoder_attention_scale: float
    embed_scale: float                # sqrt(d_model) when scale_embedding, else 1
    source_embed: np.ndarray          # [source vocab, d_model]
    target_embed: np.ndarray          # [target vocab, d_model]
    lm_head: np.ndarray               # [target vocab, d_model] (the target table itself when tied)
    logits_bias: np.ndarray | None    # [target vocab]
    output_scale: float               # T5 tied head: d_model^-0.5 on the decoder output; else 1
    max_source_length: int
    max_target_length: int
    source_positions: np.ndarray | None = None    # [max_source_length, d_model] row = position
    target_positions: np.ndarray | None = None
    source_embed_norm: Norm | None = None         # BART layernorm_embedding
    target_embed_norm: Norm | None = None
    # M2M100: positions counted from the non-pad tokens; the tables then hold every row from 0 (row pad is zeros) and
    # a token reads row (past + real tokens up to it) + pad, a pad token row pad (training/m2m100.py)
    position_pad: int | None = None
    source_final_norm: Norm | None = None         # T5, M2M100, mBART
    target_final_norm: Norm | None = None
    # T5: bias per relative offset (key - query) + span - 1 and head: [2 span - 1, heads]
    source_relative_bias: np.ndarray | None = None
    target_relative_bias: np.ndarray | None = None
    encoder_layers: list[EncoderLayer] = field(default_factory=list)
    decoder_layers: list[DecoderLayer] = field(default_factory=list)

    @property
    def source_vocab(self) -> int:
        return int(self.source_embed.shape[0])

    @property
    def target_vocab(self) -> int:
        return int(self.lm_head.shape[0])


def _np(t: torch.Tensor | None) -> np.ndarray | None:
    return None if t is None else t.detach().to("cpu").float().numpy().copy()


def _linear_t(lin) -> tuple[np.ndarray, np.ndarray | None]:
    return _np(lin.weight).T.copy(), _np(lin.bias)


def _norm(mod) -> Norm:
    return Norm(_np(mod.weight), _np(getattr(mod, "bias", None)))


def _activation(name: str) -> str:
    acts = {"relu": "relu", "gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
            "silu": "silu", "swish": "silu"}
    if name not in acts:
        raise ValueError(f"activation_function: {name!r} has no graph here (one of {sorted(acts)})")
    return acts[name]


def _bart_like_attention(at) -> Attention:
    (qw, qb), (kw, kb), (vw, vb), (ow, ob) = (_linear_t(m) for m in (at.q_proj, at.k_proj, at.v_proj, at.out_proj))
    return Attention(qw, qb, kw, kb, vw, vb, ow, ob)


def _positions(model, family: str, max_len: int) -> tuple[np.ndarray, np.ndarray, int | None]:
    """(source table, target table, position_pad): row = position for Marian / BART / mBART; M2M100's tables keep
    every row from 0 (the pad row zeros) and are read at (past + real tokens so far) + pad."""
    enc, dec = model.model.encoder, model.model.decoder
    if family == "m2m_100":
        from training.m2m100 import sinusoidal_table

        pad = int(model.config.pad_token_id)
        table = sinusoidal_table(pad + 1 + max_len, model.config.d_model, pad).numpy()
        return table, table, pad
    offset = 2 if family in ("bart", "mbart") else 0   # BART's rows 0 and 1 are fairseq's padding rows
    return (_np(enc.embed_positions.weight)[offset:offset + max_len],
            _np(dec.embed_positions.weight)[offset:offset + max_len], None)


def _bart_like(model, family: str) -> Seq2SeqWeights:
    """Marian, BART and the pre-norm mBART / M2M100: the same layer parameters under the same names."""
    c = model.config
    enc, dec = model.model.encoder, model.model.decoder
    heads = c.decoder_attention_heads
    max_len = int(c.max_position_embeddings)
    pre_norm = family in ("m2m_100", "mbart")
    src_pos, tgt_pos, position_pad = _positions(model, family, max_len)
    enc_layers = [EncoderLayer(_bart_like_attention(l.self_attn), _norm(l.self_attn_layer_norm),
                               FeedForward(*_linear_t(l.fc1), *_linear_t(l.fc2)), _norm(l.final_layer_norm))
                  for l in enc.layers]
    dec_layers = [DecoderLayer(_bart_like_attention(l.self_attn), _norm(l.self_attn_layer_norm),
                               _bart_like_attention(l.encoder_attn), _norm(l.encoder_attn_layer_norm),
                               FeedForward(*_linear_t(l.fc1), *_linear_t(l.fc2)), _norm(l.final_layer_norm))
                  for l in dec.layers]
    head_dim = c.d_model // heads
    bias = _np(getattr(model, "final_logits_bias", torch.zeros(1))).reshape(-1)
    embed_norm = family in ("bart", "mbart")
    return Seq2SeqWeights(
        family=family, d_model=c.d_model, encoder_heads=c.encoder_attention_heads, decoder_heads=heads,
        head_dim=head_dim, encoder_head_dim=c.d_model // c.encoder_attention_heads, pre_norm=pre_norm,
        norm_eps=float(enc.layers[0].self_attn_layer_norm.eps) if enc.layers else 1e-5,
        activation=_activation(c.activation_function), gated=False, attention_scale=float(head_dim ** -0.5),
        encoder_attention_scale=float((c.d_model // c.encoder_attention_heads) ** -0.5),
        embed_scale=float(enc.embed_scale), source_embed=_np(enc.embed_tokens.weight),
        target_embed=_np(dec.embed_tokens.weight), lm_head=_np(model.lm_head.weight),
        logits_bias=bias if np.any(bias) else None, output_scale=1.0,
        max_source_length=max_len, max_target_length=max_len, source_positions=src_pos, target_positions=tgt_pos,
        position_pad=position_pad,
        source_embed_norm=_norm(enc.layernorm_embedding) if embed_norm else None,
        target_embed_norm=_norm(dec.layernorm_embedding) if embed_norm else None,
        source_final_norm=_norm(enc.layer_norm) if pre_norm else None,
        target_final_norm=_norm(dec.layer_norm) if pre_norm else None,
        encoder_layers=enc_layers, decoder_layers=dec_layers)


def _t5_relative_table(attn, span: int) -> np.ndarray:
    """[2 span - 1, heads]: row r is the bias of relative offset (key - query) r - (span - 1), bucketed by the
    model's own code (training/t5.py), so the graph reproduces its buckets exactly."""
    from training.t5 import relative_position_bucket

    rel = torch.arange(-(span - 1), span)
    buckets = relative_position_bucket(rel, attn.bidirectional, attn.num_buckets, attn.max_distance)
    return _np(attn.relative_attention_bias.weight)[buckets.numpy()]


def _t5(model, max_source: int | None, max_target: int | None) -> Seq2SeqWeights:
    c = model.config
    d = c.d_kv
    max_src = int(max_source or getattr(c, "n_positions", None) or T5_DEFAULT_MAX_LENGTH)
    max_tgt = int(max_target or getattr(c, "n_positions", None) or T5_DEFAULT_MAX_LENGTH)

    def attention(at) -> Attention:
        (qw, _), (kw, _), (vw, _), (ow, _) = (_linear_t(m) for m in (at.q, at.k, at.v, at.o))
        return Attention(qw, None, kw, None, vw, None, ow, None)

    def ff(block) -> FeedForward:
        dense = block.layer[-1].DenseReluDense
        if c.is_gated_act:
            up = np.concatenate([_linear_t(dense.wi_0)[0], _linear_t(dense.wi_1)[0]], axis=1)
        else:
            up = _linear_t(dense.wi)[0]
        return FeedForward(up, None, _linear_t(dense.wo)[0], None)

    enc, dec = model.encoder, model.decoder
    enc_layers = [EncoderLayer(attention(b.layer[0].SelfAttention), _norm(b.layer[0].layer_norm), ff(b),
                               _norm(b.layer[-1].layer_norm)) for b in enc.block]
    dec_layers = [DecoderLayer(attention(b.layer[0].SelfAttention), _norm(b.layer[0].layer_norm),
                               attention(b.layer[1].EncDecAttention), _norm(b.layer[1].layer_norm), ff(b),
                               _norm(b.layer[-1].layer_norm)) for b in dec.block]
    # Offsets beyond max_distance all fall in the last bucket: a table that covers max_distance + 1 offsets each
    # way gives every longer one by clamping, so the graph is exact at any length.
    enc_span = max(max_src, c.relative_attention_max_distance + 1)
    dec_span = max(max_tgt, c.relative_attention_max_distance + 1)
    act = c.dense_act_fn
    return Seq2SeqWeights(
        family="t5", d_model=c.d_model, encoder_heads=c.num_heads, decoder_heads=c.num_heads, head_dim=d,
        encoder_head_dim=d,
        pre_norm=True, norm_eps=float(c.layer_norm_epsilon), activation=_activation(act), gated=c.is_gated_act,
        attention_scale=1.0, encoder_attention_scale=1.0, embed_scale=1.0, source_embed=_np(model.shared.weight),
        target_embed=_np(model.shared.weight), lm_head=_np(model.lm_head.weight), logits_bias=None,
        output_scale=float(c.d_model ** -0.5) if c.scale_decoder_outputs else 1.0,
        max_source_length=max_src, max_target_length=max_tgt,
        source_final_norm=_norm(enc.final_layer_norm), target_final_norm=_norm(dec.final_layer_norm),
        source_relative_bias=_t5_relative_table(enc.block[0].layer[0].SelfAttention, enc_span),
        target_relative_bias=_t5_relative_table(dec.block[0].layer[0].SelfAttention, dec_span),
        encoder_layers=enc_layers, decoder_layers=dec_layers)


def seq2seq_weights(model, family: str, max_source: int | None = None,
                    max_target: int | None = None) -> Seq2SeqWeights:
    """Our PyTorch seq2seq model (training/marian.py, bart.py, t5.py) as arrays. max_source / max_target: T5's
    limits (its positions are relative); Marian and BART take their position tables' length."""
    if family in ("marian", "bart", "m2m_100", "mbart"):
        return _bart_like(model, family)
    if family == "t5":
        return _t5(model, max_source, max_target)
    raise ValueError(f"model_type: no encoder-decoder graph for {family!r} (one of {', '.join(SEQ2SEQ_FAMILIES)})")
