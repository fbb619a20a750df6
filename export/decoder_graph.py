"""The in-place-cache decoder graph, written directly from a checkpoint's weights (no tracing; the weights come
from export/decoder_weights.py).

Attention is onnxruntime's `com.microsoft.GroupQueryAttention` with the past and present of each layer
sharing one buffer `[batch, kv_heads, max_length, head_dim]`: the caller binds the same memory as
`past_key_values.{i}.*` and `present.{i}.*` (IOBinding) and the op writes each row's new keys/values at
that row's own position. Nothing of the cache is copied per step.

Per-row positions come from the attention mask: row b's new tokens are written at
[sum(mask[b]) - sequence, sum(mask[b])) and attend causally to everything before them. That makes
right padding inside a call harmless: a padded tail is written past the row's real tokens (and later
overwritten) and no real query can see it. The mask's width is `total_sequence_length`; when it equals
`sequence`, the call is a first prompt (past 0 for every row).

The I/O names are those of onnxruntime-genai's "decoder" model type, so its runtime can run the very same
file (search.past_present_share_buffer = true).

Families: GPT-2 (LayerNorm, learned positions through `position_ids`, gelu_new, fused c_attn) and the
Llama family (RMSNorm, rotary inside the attention op, SwiGLU, grouped-query attention, optional q/k/v bias; Qwen3's
per-head q/k RMSNorm written before the op, SmolLM3's layers without rotary, Phi-3's sliding window as the op's
local window; the rotary tables of every rope type and partial rotary: export/decoder_rope.py).

The "kv8" variant keeps the cache in int8: the attention op quantizes each new key/value per channel with a
fixed scale (calibrate_kv_scales) and reads the cache dequantized: a quarter of the fp32 cache's memory. No fp16
cache is offered on CPU (docs/BENCHMARKS.md has the measurements behind both).

Padded heads (decoder_weights.pad_heads): the op's `scale` stays 1/sqrt(the model's head size), and the rotary
tables of the padded channels rotate zeros into zeros.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import onnx
from onnx import TensorProto, helper

from modelpkg import MIXED_PREFIX, past_name, present_name

from .decoder_rope import rope_tables
from .decoder_weights import DecoderWeights, KvScales, LayerWeights, calibrate_kv_scales, inplace_weights, spread
from .graph_file import save_checked
from .graph_writer import MS, GraphWriter

if TYPE_CHECKING:   # graphs.py imports torch; this module is imported without it (the graph is written by hand)
    from .graphs import GraphSpec

# Residual norms: the LayerNorm family's are written as Add + LayerNormalization, not the fused contrib op, which
# onnxruntime's CPU kernel runs slower than the pair (bench/FINDINGS.md, "Residual norms"; `python -m
# bench skip_norm`). SkipSimplifiedLayerNormalization (RMSNorm) is as fast as its parts and stays fused. The server
# turns onnxruntime's SkipLayerNormFusion off so the pair is not fused back (server/sessions.py).
LAYOUT = "inplace"   # model.json cache.layout of graphs made here

MIXED_FILE = "model.mixed.onnx"
KV8_MIXED_FILE = "model.kv8.mixed.onnx"    # the kv8 variant's mixed twin (cache.mixed_graphs in model.json)
FP16_MIXED_FILE = "model.fp16.mixed.onnx"  # the fp16 variant's mixed twin (for the CUDA provider)


def _rope_caches(w: DecoderWeights) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin for HF's rotate-half rotary (export/decoder_rope.py): the model's frequencies (the rope type's, or
    rope_theta's plain ones over the model's head size), a padded head's extra pairs left unrotated."""
    d = w.model_head_dim or w.head_dim
    inv = w.rope_inv_freq
    if inv is None:
        inv = 1.0 / (w.rope_theta ** (np.arange(0, d // 2, dtype=np.float64) * 2 / d))
    return rope_tables(inv, w.rope_scale, w.max_length, w.head_dim, partial=2 * len(inv) < d)


def _graph_io(w: DecoderWeights, groups: list[str], cache_type: int) -> tuple[list, list]:
    """The value infos of every group's inputs and outputs (the second group's names prefixed "chunk.")."""
    f32 = TensorProto.FLOAT
    cache_shape = ["batch", w.num_kv_heads, "max_sequence", w.head_dim]
    inputs, outputs = [], []
    for pre in groups:
        b, s = f"{pre}batch", f"{pre}sequence"
        inputs += [helper.make_tensor_value_info(f"{pre}input_ids", TensorProto.INT64, [b, s]),
                   helper.make_tensor_value_info(f"{pre}attention_mask", TensorProto.INT64, [b, f"{pre}total_sequence"])]
        if w.family == "gpt2":
            inputs.append(helper.make_tensor_value_info(f"{pre}position_ids", TensorProto.INT64, [b, s]))
        outputs.append(helper.make_tensor_value_info(f"{pre}logits", f32, [b, s, w.vocab_size]))
        for i in range(w.num_layers):
            for kind in ("key", "value"):
                inputs.append(helper.make_tensor_value_info(pre + past_name(i, kind), cache_type, cache_shape))
                outputs.append(helper.make_tensor_value_info(pre + present_name(i, kind), cache_type, cache_shape))
    return inputs, outputs


class _DecoderBuilder:
    """Writes the nodes of one in-place decoder graph into a GraphWriter, part by part (the order of the calls fixes
    the nodes' names)."""

    def __init__(self, w: DecoderWeights, mixed: bool, kv_scales: KvScales | None) -> None:
        self.w, self.g = w, GraphWriter()
        self.gpt2 = w.family == "gpt2"
        self.mixed = mixed
        self.kv_scales = kv_scales
        self.groups = ["", MIXED_PREFIX] if mixed else [""]
        self._shapes: dict[tuple[str, int], str] = {}

    # -- the groups' rows
    def embed_rows(self) -> str:
        """Per group: attention bookkeeping from its mask, its [batch, sequence] shape, its rows of hidden states;
        returns all rows of all groups as one [tokens, hidden] matrix (every weight is read once per run)."""
        g, w = self.g, self.w
        axis1 = g.const("axis_1", np.array([1], dtype=np.int64))
        one64 = g.const("one_i64", np.array(1, dtype=np.int64))
        idx1 = g.const("idx_1", np.array(1, dtype=np.int64))
        self.first2 = (g.const("s0", np.array([0], np.int64)), g.const("s2", np.array([2], np.int64)))
        self.embed = g.const("embed.weight", w.embed)
        positions = g.const("positions.weight", w.positions) if self.gpt2 else ""
        flat_hidden = g.const("flat_hidden", np.array([-1, w.hidden], dtype=np.int64))
        self.seqlens, self.totals, self.bs_shapes = {}, {}, {}
        rows = []
        for pre in self.groups:
            # seqlens_k = tokens per row - 1 (int32 [B]); total_sequence_length = mask width (int32 scalar).
            summed = g.one("ReduceSum", [f"{pre}attention_mask", axis1], keepdims=0)
            self.seqlens[pre] = g.one("Cast", [g.one("Sub", [summed, one64])], to=TensorProto.INT32)
            width = g.one("Gather", [g.one("Shape", [f"{pre}attention_mask"]), idx1], axis=0)
            self.totals[pre] = g.one("Cast", [width], to=TensorProto.INT32)
            self.bs_shapes[pre] = g.one("Slice", [g.one("Shape", [f"{pre}input_ids"]), *self.first2])
            x = g.one("Gather", [self.embed, f"{pre}input_ids"], axis=0)
            if self.gpt2:
                x = g.one("Add", [x, g.one("Gather", [positions, f"{pre}position_ids"], axis=0)])
            rows.append(g.one("Reshape", [x, flat_hidden]))
        x = rows[0] if len(rows) == 1 else g.one("Concat", rows, axis=0)
        if self.mixed:   # where the first group's rows end
            self.n_first = g.one("ReduceProd", [self.bs_shapes[""]], keepdims=1)
            self.big = g.const("int64_max", np.array([2 ** 62], dtype=np.int64))
        return x

    def split_rows(self, t: str) -> list[str]:
        """[rows of all groups] -> one tensor per group."""
        if not self.mixed:
            return [t]
        zero = self.first2[0]
        return [self.g.one("Slice", [t, zero, self.n_first, zero]), self.g.one("Slice", [t, self.n_first, self.big, zero])]

    def as_3d(self, t: str, pre: str, width: int) -> str:
        """[rows, width] -> the group's [batch, sequence, width] (each shape tensor is built once)."""
        if (pre, width) not in self._shapes:
            last = self.g.const(f"width_{pre}{width}", np.array([width], np.int64))
            self._shapes[pre, width] = self.g.one("Concat", [self.bs_shapes[pre], last], axis=0)
        return self.g.one("Reshape", [t, self._shapes[pre, width]])

    # -- attention's settings
    def attention_settings(self) -> None:
        """The attention op's attributes and, per layer, its inputs after total_sequence_length. With an int8 cache
        they run up to k_scale / v_scale (positions 7-13: cos, sin, position_ids, attention_bias, head_sink,
        k_scale, v_scale)."""
        g, w = self.g, self.w
        extra_attn: list[str] = []
        attrs: dict = {}
        if not self.gpt2:
            cos, sin = _rope_caches(w)
            extra_attn = [g.const("rope.cos", cos), g.const("rope.sin", sin)]
            attrs = {"do_rotary": 1, "rotary_interleaved": 0}
        if w.sliding_window is not None and w.sliding_window < w.max_length:
            # the op's window counts the query itself, as transformers' (q - window, q] (checked on CPU)
            attrs["local_window_size"] = int(w.sliding_window)
        if w.model_head_dim:   # padded heads: the op would scale q.k by 1/sqrt(the padded size)
            attrs["scale"] = float(1.0 / np.sqrt(w.model_head_dim))
        if self.kv_scales is not None:
            attrs.update(k_quant_type="PER_CHANNEL", v_quant_type="PER_CHANNEL", kv_cache_bit_width=8)
        self.attn_attrs = attrs
        self.attn_tail = [extra_attn] * w.num_layers
        if self.kv_scales is not None:
            self.attn_tail = [[*(extra_attn or ["", ""]), "", "", "", g.const(f"layers.{i}.k_scale", k.astype(np.float32)),
                               g.const(f"layers.{i}.v_scale", v.astype(np.float32))]
                              for i, (k, v) in enumerate(self.kv_scales)]
        if w.rotary_layers is not None:
            # A NoPE layer (do_rotary 0) gets no rotary tables: onnxruntime's CUDA kernel, handed cos / sin with
            # do_rotary 0, reads out of bounds (an illegal memory access on an H200; docs/GPU.md).
            self.attn_tail = [tail if rotary else _trailing_blanks_cut(["", "", *tail[2:]])
                              for rotary, tail in zip(w.rotary_layers, self.attn_tail)]

    # -- building blocks
    def norm(self, inp: str, wt: np.ndarray, b: np.ndarray | None, prefix: str) -> str:
        g = self.g
        if self.gpt2:
            return g.one("LayerNormalization", [inp, g.const(f"{prefix}.weight", wt), g.const(f"{prefix}.bias", b)],
                         axis=-1, epsilon=self.w.norm_eps)
        # RMSNorm from standard ops (once per run, on the embeddings; onnxruntime fuses the pattern). The
        # contrib SimplifiedLayerNormalization lives in the default domain, where onnx's checker rejects it.
        mean_sq = g.one("ReduceMean", [g.one("Mul", [inp, inp]), g.const(f"{prefix}.axes", np.array([-1], np.int64))],
                        keepdims=1)
        eps = g.const(f"{prefix}.eps", np.array(self.w.norm_eps, np.float32))
        scaled = g.one("Div", [inp, g.one("Sqrt", [g.one("Add", [mean_sq, eps])])])
        return g.one("Mul", [scaled, g.const(f"{prefix}.weight", wt)])

    def skip_norm(self, inp: str, skip: str, wt: np.ndarray, b: np.ndarray | None, prefix: str) -> tuple[str, str]:
        """(normalized(inp + skip), inp + skip). RMSNorm as one fused op; LayerNorm as Add + LayerNormalization
        (the "Residual norms" comment at the top)."""
        if self.gpt2:
            total = self.g.one("Add", [inp, skip])
            return self.norm(total, wt, b, prefix), total
        outs = self.g.op("SkipSimplifiedLayerNormalization", [inp, skip, self.g.const(f"{prefix}.weight", wt)],
                         n_out=4, domain=MS, epsilon=self.w.norm_eps)
        return outs[0], outs[3]

    def linear(self, inp: str, wt: np.ndarray, b: np.ndarray | None, prefix: str) -> str:
        y = self.g.one("MatMul", [inp, self.g.const(f"{prefix}.weight", wt)])
        return self.g.one("Add", [y, self.g.const(f"{prefix}.bias", b)]) if b is not None else y

    def attention(self, i: int, h: str, lw: LayerWeights) -> str:
        """Layer i's q|k|v projection, one attention call per group (each on its own cache), the rows joined."""
        g, w, p = self.g, self.w, f"layers.{i}"
        qkv = self.linear(h, lw.qkv_w, lw.qkv_b, f"{p}.qkv")
        if lw.q_norm_w is not None:
            qkv = self.qk_norm(qkv, lw, p)
        attrs = self.layer_attrs(i)
        attended = []
        for pre, part in zip(self.groups, self.split_rows(qkv)):
            out = g.op("GroupQueryAttention",
                       [self.as_3d(part, pre, self.qkv_width), "", "", pre + past_name(i, "key"),
                        pre + past_name(i, "value"), self.seqlens[pre], self.totals[pre], *self.attn_tail[i]],
                       domain=MS, name=f"{pre}{p}.attention",
                       outputs=[f"{pre}{p}.attn_out", pre + present_name(i, "key"), pre + present_name(i, "value")],
                       num_heads=w.num_heads, kv_num_heads=w.num_kv_heads, **attrs)[0]
            attended.append(g.one("Reshape", [out, self.flat_attn]))
        attn = attended[0] if len(attended) == 1 else g.one("Concat", attended, axis=0)
        return self.linear(attn, lw.out_w, lw.out_b, f"{p}.out")

    def layer_attrs(self, i: int) -> dict:
        """The attention op's attributes for layer i: a NoPE layer (SmolLM3) does not rotate."""
        rotary = self.w.rotary_layers
        if rotary is None or rotary[i]:
            return self.attn_attrs
        return {**self.attn_attrs, "do_rotary": 0}

    def qk_norm(self, qkv: str, lw: LayerWeights, p: str) -> str:
        """Qwen3's per-head RMSNorm of q and k, before the op rotates them: written here because onnxruntime's CPU
        GroupQueryAttention refuses its own q_norm_weight / k_norm_weight inputs. [rows, q|k|v] -> the same shape."""
        g, w = self.g, self.w
        heads = w.num_heads + w.num_kv_heads
        qk, v = g.op("Split", [qkv, g.const(f"{p}.qk_split", np.array([heads * w.head_dim,
                                                                      w.num_kv_heads * w.head_dim], np.int64))],
                     n_out=2, axis=-1)
        per_head = g.one("Reshape", [qk, g.const(f"{p}.qk_heads", np.array([-1, heads, w.head_dim], np.int64))])
        weight = np.concatenate([np.tile(lw.q_norm_w, (w.num_heads, 1)), np.tile(lw.k_norm_w, (w.num_kv_heads, 1))])
        normed = self.norm(per_head, weight, None, f"{p}.qk_norm")
        flat = g.one("Reshape", [normed, g.const(f"{p}.qk_flat", np.array([-1, heads * w.head_dim], np.int64))])
        return g.one("Concat", [flat, v], axis=-1)

    def mlp_activation(self, p: str, h: str, lw: LayerWeights) -> str:
        """The MLP up to its down projection: GPT-2's gelu, Llama's SwiGLU."""
        g = self.g
        if self.gpt2:
            up = g.one("MatMul", [h, g.const(f"{p}.up.weight", lw.up_w)])
            # gelu_new is FastGelu's tanh form; exact gelu is BiasGelu's erf form (both add the bias themselves).
            op = "FastGelu" if self.w.activation == "gelu_tanh" else "BiasGelu"
            return g.one(op, [up, g.const(f"{p}.up.bias", lw.up_b)], domain=MS)
        gate_up = self.linear(h, lw.up_w, lw.up_b, f"{p}.up")
        gate, upv = g.op("Split", [gate_up, g.const(f"{p}.split", np.array([lw.down_w.shape[0]] * 2, np.int64))],
                         n_out=2, axis=-1)
        return g.one("Mul", [g.one("Mul", [gate, g.one("Sigmoid", [gate])]), upv])   # SiLU(gate) * up

    def layers(self, x: str) -> str:
        """Every block; each one's closing residual norm is the next one's first norm (the last: the final norm).
        Returns the final normalized hidden states."""
        w = self.w
        self.qkv_width = (w.num_heads + 2 * w.num_kv_heads) * w.head_dim
        self.flat_attn = self.g.const("flat_attn", np.array([-1, w.num_heads * w.head_dim], np.int64))
        residual, h = x, ""
        for i, lw in enumerate(w.layers):
            p = f"layers.{i}"
            if i == 0:
                h = self.norm(residual, lw.norm1_w, lw.norm1_b, f"{p}.norm1")
            a = self.attention(i, h, lw)
            h, residual = self.skip_norm(a, residual, lw.norm2_w, lw.norm2_b, f"{p}.norm2")
            m = self.linear(self.mlp_activation(p, h, lw), lw.down_w, lw.down_b, f"{p}.down")
            if i + 1 < w.num_layers:
                nxt = w.layers[i + 1]
                h, residual = self.skip_norm(m, residual, nxt.norm1_w, nxt.norm1_b, f"layers.{i + 1}.norm1")
            else:
                h, residual = self.skip_norm(m, residual, w.final_norm_w, w.final_norm_b, "final_norm")
        return h

    def lm_head(self, h: str) -> None:
        """Gemm(transB) on the embedding itself when tied, so its weights are stored once; logits per group."""
        head = self.embed if self.w.lm_head is None else self.g.const("lm_head.weight", self.w.lm_head)
        logits2d = self.g.one("Gemm", [h, head], transB=1)
        for pre, part in zip(self.groups, self.split_rows(logits2d)):
            self.g.op("Identity", [self.as_3d(part, pre, self.w.vocab_size)], outputs=[f"{pre}logits"])


# family -> a _DecoderBuilder subclass, for families whose graph module registers itself (export/gemma_graph.py).
BUILDERS: dict[str, type[_DecoderBuilder]] = {}


def build_decoder_graph(w: DecoderWeights, opset: int = 18, mixed: bool = False,
                        kv_scales: KvScales | None = None) -> onnx.ModelProto:
    """The in-place decoder. mixed=True adds a second group of rows (inputs and outputs prefixed "chunk.")
    that shares every weight multiplication with the first but has its own attention call: one run then
    decodes one token for some slots AND prefills a prompt chunk for another, reading the weights once.
    kv_scales: an int8 cache, quantized per channel with these scales (calibrate_kv_scales: per channel of the
    model's heads, spread here over padded heads)."""
    if kv_scales is not None and len(kv_scales) != w.num_layers:
        raise ValueError(f"kv_scales: {len(kv_scales)} layers, the model has {w.num_layers}")
    if kv_scales is not None and w.model_head_dim:
        # Scales come per model channel; a padded channel only ever holds 0, any positive scale quantizes it to 0.
        kv_scales = [tuple(spread(t, w.num_kv_heads, w.model_head_dim, w.head_dim, fill=1.0) for t in pair)
                     for pair in kv_scales]
    b = BUILDERS.get(w.family, _DecoderBuilder)(w, mixed, kv_scales)
    inputs, outputs = _graph_io(w, b.groups, TensorProto.INT8 if kv_scales is not None else TensorProto.FLOAT)
    x = b.embed_rows()
    b.attention_settings()
    b.lm_head(b.layers(x))
    name = f"{w.family}-decoder-inplace{'-mixed' if mixed else ''}{'-kv8' if kv_scales is not None else ''}"
    graph = helper.make_graph(b.g.nodes, name, inputs, outputs, b.g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(MS, 1)],
                              producer_name="ortserve.export")
    model.ir_version = 9   # readable by every onnxruntime this project supports
    return model


# ----------------------------------------------------------------------------- graph files


def export_inplace(model, model_type: str, max_length: int, out) -> GraphSpec:
    """Write the in-place graph of `model` to `out`, and its mixed twin (MIXED_FILE) beside it; returns the
    I/O spec model.json lists (the plain graph's: the mixed one adds the same names prefixed "chunk.")."""
    from .graphs import GraphSpec, TensorSpec

    w = inplace_weights(model, model_type, max_length)
    for mixed, path in ((False, out), (True, out.parent / MIXED_FILE)):
        onnx_model = build_decoder_graph(w, mixed=mixed)
        save_checked(onnx_model, path)
    cache = ("batch", "kv_heads", "max_sequence", "head_dim")
    inputs = [TensorSpec("input_ids", "int64", ("batch", "sequence")),
              TensorSpec("attention_mask", "int64", ("batch", "total_sequence"))]
    if w.positions is not None:
        inputs.append(TensorSpec("position_ids", "int64", ("batch", "sequence")))
    outputs = [TensorSpec("logits", "float32", ("batch", "sequence", "vocab"))]
    for i in range(w.num_layers):
        for kind in ("key", "value"):
            inputs.append(TensorSpec(past_name(i, kind), "float32", cache))
            outputs.append(TensorSpec(present_name(i, kind), "float32", cache))
    return GraphSpec(tuple(inputs), tuple(outputs))


def export_inplace_kv8(model, model_type: str, max_length: int, out, calibration: list[list[int]]) -> KvScales:
    """Write the int8-cache graph of `model` to `out` and its mixed twin (KV8_MIXED_FILE) beside it, both with
    the scales calibrated on `calibration`; returns them."""
    w = inplace_weights(model, model_type, max_length)
    scales = calibrate_kv_scales(model, calibration)
    for mixed, path in ((False, out), (True, out.parent / KV8_MIXED_FILE)):
        onnx_model = build_decoder_graph(w, mixed=mixed, kv_scales=scales)
        save_checked(onnx_model, path)
    return scales


def export_inplace_transformed(w: DecoderWeights, out, mixed_out, transform, kv_scales: KvScales | None = None
                               ) -> list:
    """The in-place graph of `w` and its mixed twin, each passed through `transform(graph) -> (graph, info)`
    (weight quantization), written to `out` / `mixed_out`; returns the two infos."""
    infos = []
    for mixed, path in ((False, out), (True, mixed_out)):
        graph, info = transform(build_decoder_graph(w, mixed=mixed, kv_scales=kv_scales))
        save_checked(graph, path)
        infos.append(info)
    return infos


def _trailing_blanks_cut(inputs: list[str]) -> list[str]:
    """An op's optional inputs without the blank ones at the end (an absent trailing input is left out)."""
    while inputs and not inputs[-1]:
        inputs = inputs[:-1]
    return inputs
