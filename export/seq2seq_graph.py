"""The encoder-decoder package's two graphs, written directly from weights (export/seq2seq_weights.py), no tracing.

encoder.onnx — once per request (docs/model-package.md, "Encoder-decoder packages"):
    input_ids, attention_mask int64 [batch, source]
    -> cross.{i}.key, cross.{i}.value float32 [batch, heads, source, head_dim] for every decoder layer i
The encoder stack runs, then every decoder layer's cross-attention key/value projection: the decoder never
recomputes them. Self-attention is com.microsoft.MultiHeadAttention with an additive bias built from the mask
(and T5's relative bias).

decoder.onnx — every step:
    input_ids int64 [batch, sequence], attention_mask int64 [batch, total_sequence] (over the self cache),
    encoder_attention_mask int64 [batch, source] (1 on the row's source tokens),
    cross.{i}.key/value float32 [batch, heads, source, head_dim] (the encoder's outputs, kept in a slot buffer),
    past_key_values.{i}.key/value float32 [batch, heads, max_target, head_dim] (shared in place with present.*)
    -> logits float32 [batch, sequence, target_vocab], present.{i}.key/value (the same buffers)
Self-attention is com.microsoft.GroupQueryAttention over a buffer shared by past and present, as in
export/decoder_graph.py: row b's new tokens are written at [len_b - sequence, len_b), len_b = sum(mask[b]);
a call whose mask is exactly `sequence` wide is every row's first (past 0, right padding allowed). Positions
(Marian's sinusoids, BART's learned table, T5's relative offsets) come from the same lengths:
position of new token t = max(len_b - sequence, 0) + t; M2M100 counts the real (non-pad) tokens instead, as
transformers does, from the same past length. Cross-attention is com.microsoft.MultiHeadAttention
with the precomputed keys/values (BNSH) and an additive bias from encoder_attention_mask, so rows with sources
of different lengths share one call. T5's decoder self-attention bias goes into GroupQueryAttention's
`attention_bias` input (onnxruntime 1.32's CPU kernel applies it: checked against numpy to 3e-7, scale=1.0).

Head sizes that are not a multiple of 16 (GroupQueryAttention's CPU kernel refuses them) are zero-padded as in
decoder_weights.pad_heads, self cache and cross keys/values alike: one head_dim for every buffer of a package.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import onnx
from onnx import TensorProto, helper

from modelpkg import cross_name, past_name, present_name, padded_head_dim

from .decoder_weights import spread
from .graph_writer import MS, GraphWriter
from .seq2seq_weights import Attention, FeedForward, Norm, Seq2SeqWeights

if TYPE_CHECKING:
    from .graphs import GraphSpec

ENCODER_FILE = "encoder.onnx"
DECODER_FILE = "decoder.onnx"
# Added to the scores of masked keys. Not -inf: a row with no key left (a padding row) stays finite.
MASKED = -1e9
F32, I64, I32 = TensorProto.FLOAT, TensorProto.INT64, TensorProto.INT32


class _Builder(GraphWriter):
    """GraphWriter plus the blocks both sides use."""

    def __init__(self, w: Seq2SeqWeights) -> None:
        super().__init__()
        self._consts: set[str] = set()
        self.w = w

    def linear(self, x: str, wt: np.ndarray, b: np.ndarray | None, name: str) -> str:
        y = self.one("MatMul", [x, self.const(f"{name}.weight", wt)])
        return self.one("Add", [y, self.const(f"{name}.bias", b)]) if b is not None else y

    def norm(self, x: str, n: Norm, name: str) -> str:
        if n.bias is not None:
            return self.one("LayerNormalization", [x, self.const(f"{name}.weight", n.weight),
                                                   self.const(f"{name}.bias", n.bias)],
                            axis=-1, epsilon=self.w.norm_eps)
        # T5's RMS norm from standard ops (the contrib SimplifiedLayerNormalization sits in the default domain,
        # where onnx's checker rejects it); it runs once per stack, on the embeddings.
        mean_sq = self.one("ReduceMean", [self.one("Mul", [x, x]), self.scalar("axes_last", [-1], np.int64)],
                           keepdims=1)
        eps = self.const(f"{name}.eps", np.array(self.w.norm_eps, np.float32))
        return self.one("Mul", [self.one("Div", [x, self.one("Sqrt", [self.one("Add", [mean_sq, eps])])]),
                                self.const(f"{name}.weight", n.weight)])

    def add_norm(self, x: str, residual: str, bias: np.ndarray | None, n: Norm, name: str) -> tuple[str, str]:
        """(norm(x + bias + residual), x + bias + residual). RMSNorm (T5) as one fused op; LayerNorm as Add +
        LayerNormalization: onnxruntime's SkipLayerNormalization ran several times slower than the two on CPU
        (export/decoder_graph.py, "Residual norms"; measured: bench/FINDINGS.md, "Residual norms")."""
        if bias is not None:
            x = self.one("Add", [x, self.const(f"{name}.residual_bias", bias)])
        if n.bias is not None:
            total = self.one("Add", [x, residual])
            return self.one("LayerNormalization", [total, self.const(f"{name}.weight", n.weight),
                                                   self.const(f"{name}.bias", n.bias)],
                            axis=-1, epsilon=self.w.norm_eps), total
        outs = self.op("SkipSimplifiedLayerNormalization", [x, residual, self.const(f"{name}.weight", n.weight)],
                       n_out=4, domain=MS, epsilon=self.w.norm_eps)
        return outs[0], outs[3]

    def feed_forward(self, x: str, ff: FeedForward, name: str) -> str:
        """act(x W1 + b1) W2, or the gated form act(x W0) * (x W1) W2; without the output bias (add_norm adds it)."""
        w = self.w
        up = self.one("MatMul", [x, self.const(f"{name}.up.weight", ff.up_w)])
        if w.gated:
            width = ff.down_w.shape[0]
            gate, lin = self.op("Split", [up, self.const(f"{name}.split", np.array([width, width], np.int64))],
                                n_out=2, axis=-1)
            return self.one("MatMul", [self.one("Mul", [self.activation(gate, None, name), lin]),
                                       self.const(f"{name}.down.weight", ff.down_w)])
        act = self.activation(up, ff.up_b, name)
        return self.one("MatMul", [act, self.const(f"{name}.down.weight", ff.down_w)])

    def activation(self, x: str, bias: np.ndarray | None, name: str) -> str:
        kind = self.w.activation
        b = self.const(f"{name}.up.bias", bias) if bias is not None else ""
        if kind == "gelu_tanh":
            return self.one("FastGelu", [x, b] if b else [x], domain=MS)
        if kind == "gelu":
            return self.one("BiasGelu", [x, b], domain=MS) if b else self.one("Gelu", [x], domain=MS)
        if b:
            x = self.one("Add", [x, b])
        if kind == "relu":
            return self.one("Relu", [x])
        return self.one("Mul", [x, self.one("Sigmoid", [x])])   # silu

    def to_3d(self, x: str, bs: str, width: int) -> str:
        """[rows, width] -> [batch, sequence, width], bs = the [batch, sequence] shape tensor (built once per width)."""
        key = f"shape3_{bs}_{width}"
        if not any(key in n.output for n in self.nodes):
            self.op("Concat", [bs, self.const(f"width_{bs}_{width}", np.array([width], np.int64))], axis=0,
                    outputs=[key])
        return self.one("Reshape", [x, key])

    def flat(self, x: str, width: int) -> str:
        """[batch, sequence, width] -> [rows, width]."""
        return self.one("Reshape", [x, self.scalar(f"flat_{width}", [-1, width], np.int64)])

    def scalar(self, name: str, value, dtype) -> str:
        return name if name in self._consts else self.const(name, np.array(value, dtype))

    def const(self, name: str, arr: np.ndarray) -> str:
        self._consts.add(name)
        return super().const(name, arr)


def _padded_attention(a: Attention, heads: int, d: int, padded: int) -> Attention:
    """Each head's q/k/v columns widened with zero channels to `padded`, the output projection's rows likewise."""
    if padded == d:
        return a

    def cols(x: np.ndarray | None) -> np.ndarray | None:
        return None if x is None else spread(x, heads, d, padded)

    return Attention(cols(a.q_w), cols(a.q_b), cols(a.k_w), cols(a.k_b), cols(a.v_w), cols(a.v_b),
                     spread(a.o_w.T, heads, d, padded).T.copy(), a.o_b)


def _embed(g: _Builder, ids: str, table: np.ndarray, name: str) -> str:
    x = g.one("Gather", [g.const(f"{name}.embed.weight", table), ids], axis=0)
    if g.w.embed_scale != 1.0:
        x = g.one("Mul", [x, g.const(f"{name}.embed_scale", np.array(g.w.embed_scale, np.float32))])
    return x


def _model(g: GraphWriter, name: str, inputs: list, outputs: list, opset: int) -> onnx.ModelProto:
    graph = helper.make_graph(g.nodes, name, inputs, outputs, g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(MS, 1)],
                              producer_name="ortserve.export")
    model.ir_version = 9
    return model


# ------------------------------------------------------------------------------------------- shared pieces


def _shape_bs(g: _Builder, ids: str, prefix: str) -> tuple[str, str, str]:
    """(the [batch, sequence] shape tensor, batch [1], sequence [1]) of an int64 [B, S] input."""
    shape = g.one("Shape", [ids])
    s0, s1, s2 = (g.scalar(f"idx_{i}", [i], np.int64) for i in (0, 1, 2))
    return (g.one("Slice", [shape, s0, s2], name=f"{prefix}.bs"), g.one("Slice", [shape, s0, s1]),
            g.one("Slice", [shape, s1, s2]))


def _keys_bias(g: _Builder, mask: str) -> str:
    """int64 [B, K] mask -> additive float [B, 1, 1, K]: 0 on real keys, MASKED on padding."""
    maskf = g.one("Cast", [mask], to=F32)
    bias = g.one("Mul", [g.one("Sub", [g.scalar("one_f", 1.0, np.float32), maskf]),
                         g.scalar("masked", MASKED, np.float32)])
    return g.one("Unsqueeze", [bias, g.scalar("axes_1_2", [1, 2], np.int64)])


def _relative_bias(g: _Builder, table: np.ndarray, name: str, keys: str, queries: str) -> str:
    """T5's bias gathered per (query, key): table row (key - query) + span - 1, clamped to the table (offsets past
    the table share its edge bucket: export/seq2seq_weights.py sizes it so). keys int64 [K]; queries int64 [..., Q]
    -> [..., Q, K, heads]."""
    span = (table.shape[0] + 1) // 2
    tab = g.const(f"{name}.relative_bias", table.astype(np.float32))
    rel = g.one("Sub", [keys, g.one("Unsqueeze", [queries, g.scalar("axes_last", [-1], np.int64)])])  # [..., Q, K]
    idx = g.one("Clip", [g.one("Add", [rel, g.scalar(f"{name}.rel_shift", span - 1, np.int64)]),
                         g.scalar("zero_i64", 0, np.int64), g.scalar(f"{name}.rel_hi", 2 * span - 2, np.int64)])
    return g.one("Gather", [tab, idx], axis=0)


def _pad_positions(g: _Builder, ids: str, table: np.ndarray, name: str, past: str | None) -> str:
    """M2M100's position embeddings [B, T, d] of int64 ids [B, T]: row (past + real tokens up to t) + pad for a real
    token, row pad (zeros) for a pad token, as transformers counts them (training/m2m100.py); clipped to the table."""
    pad = g.w.position_pad
    real = g.one("Cast", [g.one("Not", [g.one("Equal", [ids, g.scalar(f"{name}.pad_id", pad, np.int64)])])], to=I64)
    count = g.one("CumSum", [real, g.scalar("axis_1", 1, np.int64)])
    if past is not None:   # [B] tokens already in the cache
        count = g.one("Add", [count, g.one("Unsqueeze", [past, "idx_1"])])
    rows = g.one("Add", [g.one("Mul", [count, real]), g.scalar(f"{name}.pad_id", pad, np.int64)])
    rows = g.one("Min", [rows, g.scalar(f"{name}.last_row", table.shape[0] - 1, np.int64)])
    return g.one("Gather", [g.const(f"{name}.positions", table.astype(np.float32)), rows], axis=0)


def _ffn_block(g: _Builder, h: str, residual: str, ff: FeedForward, next_norm: Norm, next_name: str,
               own_norm: Norm, name: str) -> tuple[str, str]:
    """The feed-forward sublayer and the norm after it (post-norm: its own; pre-norm: the next sublayer's)."""
    f = g.feed_forward(h, ff, name)
    if g.w.pre_norm:
        return g.add_norm(f, residual, ff.down_b, next_norm, next_name)
    out, _ = g.add_norm(f, h, ff.down_b, own_norm, f"{name}.norm")
    return out, out


# ----------------------------------------------------------------------------------------------- encoder


def build_encoder_graph(w: Seq2SeqWeights, opset: int = 18) -> onnx.ModelProto:
    """input_ids, attention_mask [B, S] -> cross.{i}.key/value [B, heads, S, head_dim (padded)]."""
    g = _Builder(w)
    n_dec = len(w.decoder_layers)
    hd, heads, padded = w.head_dim, w.decoder_heads, padded_head_dim(w.head_dim)
    inputs = [helper.make_tensor_value_info("input_ids", I64, ["batch", "source"]),
              helper.make_tensor_value_info("attention_mask", I64, ["batch", "source"])]
    outputs = [helper.make_tensor_value_info(cross_name(i, k), F32, ["batch", heads, "source", padded])
               for i in range(n_dec) for k in ("key", "value")]

    bs, batch, length = _shape_bs(g, "input_ids", "source")
    x = _embed(g, "input_ids", w.source_embed, "source")
    if w.position_pad is not None:       # M2M100: rows counted from the source's real tokens
        x = g.one("Add", [x, _pad_positions(g, "input_ids", w.source_positions, "source", None)])
    elif w.source_positions is not None:   # rows 0 .. S-1 of the table (every row's source starts at 0)
        x = g.one("Add", [x, g.one("Slice", [g.const("source.positions", w.source_positions), "idx_0", length])])
    if w.source_embed_norm is not None:
        x = g.norm(x, w.source_embed_norm, "source.embed_norm")
    x = g.flat(x, w.d_model)

    # Additive attention bias: [B, 1, S, S] from the mask; T5: + the relative bias, [B, heads, S, S].
    keys_bias = _keys_bias(g, "attention_mask")
    if w.source_relative_bias is not None:
        pos = g.one("Range", [g.scalar("zero_i64", 0, np.int64), g.one("Squeeze", [length, "idx_0"]),
                              g.scalar("one_i64", 1, np.int64)])
        rel = g.one("Transpose", [_relative_bias(g, w.source_relative_bias, "source", pos, pos)], perm=[2, 0, 1])
        attn_bias = g.one("Add", [g.one("Unsqueeze", [rel, "idx_0"]), keys_bias])
    else:
        attn_bias = g.one("Expand", [keys_bias, g.one("Concat", [batch, "idx_1", length, length], axis=0)])

    e_heads, e_width = w.encoder_heads, w.encoder_heads * w.encoder_head_dim
    layers = w.encoder_layers
    residual = x
    h = g.norm(x, layers[0].attn_norm, "encoder.0.attn_norm") if w.pre_norm else x
    for i, layer in enumerate(layers):
        p, a = f"encoder.{i}", layer.attn
        qkv_b = None if a.q_b is None else np.concatenate([a.q_b, a.k_b, a.v_b])
        qkv = g.linear(h, np.concatenate([a.q_w, a.k_w, a.v_w], axis=1), qkv_b, f"{p}.qkv")
        q, k, v = g.op("Split", [qkv, g.const(f"{p}.split", np.array([e_width] * 3, np.int64))], n_out=3, axis=-1)
        att = g.one("MultiHeadAttention", [g.to_3d(q, bs, e_width), g.to_3d(k, bs, e_width), g.to_3d(v, bs, e_width),
                                           "", "", attn_bias], domain=MS, num_heads=e_heads,
                    scale=w.encoder_attention_scale)
        att = g.one("MatMul", [g.flat(att, e_width), g.const(f"{p}.attn.out.weight", a.o_w)])
        if w.pre_norm:
            h, residual = g.add_norm(att, residual, a.o_b, layer.ff_norm, f"{p}.ff_norm")
        else:
            h, _ = g.add_norm(att, h, a.o_b, layer.attn_norm, f"{p}.attn_norm")
        last = i + 1 == len(layers)
        nxt, nxt_name = ((w.source_final_norm, "encoder.final_norm") if last
                         else (layers[i + 1].attn_norm, f"encoder.{i + 1}.attn_norm"))
        h, residual = _ffn_block(g, h, residual, layer.ff, nxt, nxt_name, layer.ff_norm, f"{p}.ff")
    # h: the encoder states [rows, d_model]. Every decoder layer's cross keys/values in one MatMul.
    kv_w: list[np.ndarray] = []
    kv_b: list[np.ndarray | None] = []
    for layer in w.decoder_layers:
        pa = _padded_attention(layer.cross_attn, heads, hd, padded)
        kv_w += [pa.k_w, pa.v_w]
        kv_b += [pa.k_b, pa.v_b]
    width = heads * padded
    kv = g.linear(h, np.concatenate(kv_w, axis=1), None if kv_b[0] is None else np.concatenate(kv_b), "cross.kv")
    parts = g.op("Split", [kv, g.const("cross.split", np.array([width] * 2 * n_dec, np.int64))], n_out=2 * n_dec,
                 axis=-1)
    bshd = g.one("Concat", [bs, g.const("heads_dims", np.array([heads, padded], np.int64))], axis=0)
    for j, part in enumerate(parts):
        g.op("Transpose", [g.one("Reshape", [part, bshd])], perm=[0, 2, 1, 3],
             outputs=[cross_name(j // 2, ("key", "value")[j % 2])])
    return _model(g, f"{w.family}-encoder", inputs, outputs, opset)


# ----------------------------------------------------------------------------------------------- decoder


def build_decoder_graph(w: Seq2SeqWeights, opset: int = 18) -> onnx.ModelProto:
    """One decode call: new tokens [B, T] over the in-place self cache and the bound cross keys/values."""
    g = _Builder(w)
    n_dec = len(w.decoder_layers)
    hd, heads, padded = w.head_dim, w.decoder_heads, padded_head_dim(w.head_dim)
    width = heads * padded
    cross_shape = ["batch", heads, "source", padded]
    cache_shape = ["batch", heads, "max_target", padded]
    inputs = [helper.make_tensor_value_info("input_ids", I64, ["batch", "sequence"]),
              helper.make_tensor_value_info("attention_mask", I64, ["batch", "total_sequence"]),
              helper.make_tensor_value_info("encoder_attention_mask", I64, ["batch", "source"])]
    outputs = [helper.make_tensor_value_info("logits", F32, ["batch", "sequence", w.target_vocab])]
    for i in range(n_dec):
        inputs += [helper.make_tensor_value_info(cross_name(i, k), F32, cross_shape) for k in ("key", "value")]
    for i in range(n_dec):
        for k in ("key", "value"):
            inputs.append(helper.make_tensor_value_info(past_name(i, k), F32, cache_shape))
            outputs.append(helper.make_tensor_value_info(present_name(i, k), F32, cache_shape))

    bs, batch, seq = _shape_bs(g, "input_ids", "target")
    # GroupQueryAttention's bookkeeping: seqlens_k = tokens per row - 1 (int32 [B]), total = mask width (scalar).
    lens = g.one("ReduceSum", ["attention_mask", "idx_1"], keepdims=0)
    seqlens = g.one("Cast", [g.one("Sub", [lens, g.scalar("one_i64", 1, np.int64)])], to=I32)
    total64 = g.one("Gather", [g.one("Shape", ["attention_mask"]), g.scalar("one_i64", 1, np.int64)], axis=0)
    total = g.one("Cast", [total64], to=I32)
    # Position of new token t of row b: max(len_b - T, 0) + t (a first call, mask width = T, starts every row at 0).
    first = g.one("Max", [g.one("Sub", [lens, seq]), g.scalar("zero_i64", 0, np.int64)])
    steps = g.one("Range", [g.scalar("zero_i64", 0, np.int64), g.one("Squeeze", [seq, "idx_0"]),
                            g.scalar("one_i64", 1, np.int64)])
    positions = g.one("Add", [g.one("Unsqueeze", [first, "idx_1"]), steps])                      # [B, T]

    x = _embed(g, "input_ids", w.target_embed, "target")
    if w.position_pad is not None:
        x = g.one("Add", [x, _pad_positions(g, "input_ids", w.target_positions, "target", first)])
    elif w.target_positions is not None:
        clipped = g.one("Min", [positions, g.scalar("target.last_position", w.max_target_length - 1, np.int64)])
        x = g.one("Add", [x, g.one("Gather", [g.const("target.positions", w.target_positions), clipped], axis=0)])
    if w.target_embed_norm is not None:
        x = g.norm(x, w.target_embed_norm, "target.embed_norm")
    x = g.flat(x, w.d_model)

    self_tail: list[str] = []
    if w.target_relative_bias is not None:   # [B, T, K, H] -> GroupQueryAttention's attention_bias [B, H, T, K]
        keys = g.one("Range", [g.scalar("zero_i64", 0, np.int64), total64, g.scalar("one_i64", 1, np.int64)])
        rel = _relative_bias(g, w.target_relative_bias, "target", keys, positions)
        self_tail = ["", "", "", g.one("Transpose", [rel], perm=[0, 3, 1, 2])]
    cross_bias = g.one("Expand", [_keys_bias(g, "encoder_attention_mask"),
                                  g.one("Concat", [batch, "idx_1", seq,
                                                   g.one("Slice", [g.one("Shape", ["encoder_attention_mask"]),
                                                                   "idx_1", "idx_2"])], axis=0)])

    layers = w.decoder_layers
    residual = x
    h = g.norm(x, layers[0].self_norm, "decoder.0.self_norm") if w.pre_norm else x
    for i, layer in enumerate(layers):
        p = f"decoder.{i}"
        sa = _padded_attention(layer.self_attn, heads, hd, padded)
        qkv_b = None if sa.q_b is None else np.concatenate([sa.q_b, sa.k_b, sa.v_b])
        qkv = g.linear(h, np.concatenate([sa.q_w, sa.k_w, sa.v_w], axis=1), qkv_b, f"{p}.self.qkv")
        att = g.op("GroupQueryAttention",
                   [g.to_3d(qkv, bs, 3 * width), "", "", past_name(i, "key"), past_name(i, "value"), seqlens, total,
                    *self_tail], domain=MS, name=f"{p}.self.attention",
                   outputs=[f"{p}.self.out", present_name(i, "key"), present_name(i, "value")],
                   num_heads=heads, kv_num_heads=heads, scale=w.attention_scale)[0]
        att = g.one("MatMul", [g.flat(att, width), g.const(f"{p}.self.out.weight", sa.o_w)])
        if w.pre_norm:
            h, residual = g.add_norm(att, residual, sa.o_b, layer.cross_norm, f"{p}.cross_norm")
        else:
            h, _ = g.add_norm(att, h, sa.o_b, layer.self_norm, f"{p}.self_norm")
            residual = h
        ca = _padded_attention(layer.cross_attn, heads, hd, padded)
        q = g.linear(h, ca.q_w, ca.q_b, f"{p}.cross.q")
        att = g.one("MultiHeadAttention", [g.to_3d(q, bs, width), cross_name(i, "key"), cross_name(i, "value"), "", "",
                                           cross_bias], domain=MS, num_heads=heads, scale=w.attention_scale)
        att = g.one("MatMul", [g.flat(att, width), g.const(f"{p}.cross.out.weight", ca.o_w)])
        if w.pre_norm:
            h, residual = g.add_norm(att, residual, ca.o_b, layer.ff_norm, f"{p}.ff_norm")
        else:
            h, _ = g.add_norm(att, h, ca.o_b, layer.cross_norm, f"{p}.cross_norm")
        last = i + 1 == len(layers)
        nxt, nxt_name = ((w.target_final_norm, "decoder.final_norm") if last
                         else (layers[i + 1].self_norm, f"decoder.{i + 1}.self_norm"))
        h, residual = _ffn_block(g, h, residual, layer.ff, nxt, nxt_name, layer.ff_norm, f"{p}.ff")
    # The head: FusedMatMul(transB) on the target table itself when tied (stored once), T5's output scale as alpha,
    # over [batch, sequence, width] so that it writes `logits` itself. A Gemm over the flat rows needed a Reshape
    # after it, and with `logits` bound to the caller's buffer that Reshape is a copy of the whole [rows, vocab]
    # block, a visible share of a wide-vocabulary step (measured: bench/FINDINGS.md, "Encoder-decoder int8 and the
    # head's Reshape").
    tied = w.lm_head.shape == w.target_embed.shape and np.array_equal(w.lm_head, w.target_embed)
    head = "target.embed.weight" if tied else g.const("lm_head.weight", w.lm_head)
    hidden = g.to_3d(h, bs, w.d_model)
    if w.logits_bias is None:
        g.op("FusedMatMul", [hidden, head], outputs=["logits"], domain=MS, transB=1, alpha=float(w.output_scale))
    else:
        logits = g.one("FusedMatMul", [hidden, head], domain=MS, transB=1, alpha=float(w.output_scale))
        g.op("Add", [logits, g.const("final_logits_bias", w.logits_bias)], outputs=["logits"])
    return _model(g, f"{w.family}-decoder-inplace", inputs, outputs, opset)


# ------------------------------------------------------------------------------------------- files and specs


def graph_specs(w: Seq2SeqWeights) -> tuple["GraphSpec", "GraphSpec"]:
    """(encoder, decoder) I/O as model.json lists them (axis names as in the graphs)."""
    from .graphs import GraphSpec, TensorSpec

    n = len(w.decoder_layers)
    cross = ("batch", "heads", "source", "head_dim")     # sizes: model.json encoder_decoder
    cache = ("batch", "heads", "max_target", "head_dim")
    crosses = tuple(TensorSpec(cross_name(i, k), "float32", cross) for i in range(n) for k in ("key", "value"))
    encoder = GraphSpec((TensorSpec("input_ids", "int64", ("batch", "source")),
                         TensorSpec("attention_mask", "int64", ("batch", "source"))), crosses)
    pasts = tuple(TensorSpec(past_name(i, k), "float32", cache) for i in range(n) for k in ("key", "value"))
    presents = tuple(TensorSpec(present_name(i, k), "float32", cache) for i in range(n) for k in ("key", "value"))
    decoder = GraphSpec((TensorSpec("input_ids", "int64", ("batch", "sequence")),
                         TensorSpec("attention_mask", "int64", ("batch", "total_sequence")),
                         TensorSpec("encoder_attention_mask", "int64", ("batch", "source")), *crosses, *pasts),
                        (TensorSpec("logits", "float32", ("batch", "sequence", "target_vocab")), *presents))
    return encoder, decoder


def write_graphs(w: Seq2SeqWeights, out_dir, encoder_file: str = ENCODER_FILE,
                 decoder_file: str = DECODER_FILE) -> None:
    """Build, check and save both graphs into out_dir."""
    from pathlib import Path

    for build, name in ((build_encoder_graph, encoder_file), (build_decoder_graph, decoder_file)):
        model = build(w)
        onnx.checker.check_model(model)
        onnx.save(model, str(Path(out_dir) / name))
