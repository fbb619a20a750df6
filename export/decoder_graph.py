"""The in-place-cache decoder graph, written directly from a checkpoint's weights (no tracing).

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
Llama family (RMSNorm, rotary inside the attention op, SwiGLU, grouped-query attention, optional q/k/v bias).

The "kv8" variant keeps the cache in int8: the attention op quantizes each new key/value per channel with a
fixed scale (calibrated here from the PyTorch model's keys/values on sample text, with 2x headroom; values
beyond it saturate) and reads the cache dequantized. A quarter of the fp32 cache's memory; onnxruntime 1.32's
CPU kernel alone, batch 8 over 1000 cached tokens, 12 heads: 0.50x fp32's time, and an fp16 cache 1.09x
(6 interleaved rounds, 2026-11-23), so no fp16 cache is offered.

Head sizes that are not a multiple of 16 (which onnxruntime's CPU kernel refuses) are zero-padded (pad_heads):
every head's q/k/v projection gains zero columns, the output projection zero rows, and the op's `scale` stays
1/sqrt(the model's head size), so q.k, the softmax and the output are those of the model. The model's channels
sit in the two halves of the padded head (modelpkg/heads.py), which keeps rotate-half rotary pairs together:
the rotary tables of the padded channels rotate zeros into zeros.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from modelpkg import MIXED_PREFIX, head_channels, padded_head_dim, past_name, present_name

if TYPE_CHECKING:   # graphs.py imports torch; this module is imported without it (the graph is written by hand)
    from .graphs import GraphSpec

MS = "com.microsoft"
# Residual norms: the LayerNorm family's are written as Add + LayerNormalization, not the fused contrib op:
# onnxruntime 1.32's CPU SkipLayerNormalization measured 2.5-6x slower than the pair (2 cores, 2026-11-27: 59 vs
# 24 us at [32, 768], 389 vs 62 us at [440, 384]; `python -m bench skip_norm`). SkipSimplifiedLayerNormalization
# (RMSNorm) is as fast as its parts and stays fused. The server turns onnxruntime's SkipLayerNormFusion off so the
# pair is not fused back (server/sessions.py).
LAYOUT = "inplace"   # model.json cache.layout of graphs made here ("concat" = the traced graph)


@dataclass
class LayerWeights:
    """One block, weights already in MatMul orientation [in, out]."""

    norm1_w: np.ndarray
    norm1_b: np.ndarray | None          # None for RMSNorm
    qkv_w: np.ndarray                   # [hidden, (heads + 2 kv_heads) * head_dim], packed q|k|v
    qkv_b: np.ndarray | None
    out_w: np.ndarray                   # [heads * head_dim, hidden]
    out_b: np.ndarray | None
    norm2_w: np.ndarray
    norm2_b: np.ndarray | None
    up_w: np.ndarray                    # GPT-2: c_fc [hidden, inner]; Llama: gate|up packed [hidden, 2 inner]
    up_b: np.ndarray | None
    down_w: np.ndarray                  # [inner, hidden]
    down_b: np.ndarray | None


@dataclass
class DecoderWeights:
    family: str                         # "gpt2" | "llama"
    num_heads: int
    num_kv_heads: int
    head_dim: int
    hidden: int
    vocab_size: int
    max_length: int
    norm_eps: float
    embed: np.ndarray                   # [vocab, hidden]
    lm_head: np.ndarray | None          # [vocab, hidden]; None = tied to embed
    final_norm_w: np.ndarray
    final_norm_b: np.ndarray | None
    layers: list[LayerWeights] = field(default_factory=list)
    positions: np.ndarray | None = None  # GPT-2 wpe [max_length, hidden]
    activation: str = "gelu_tanh"       # GPT-2 MLP: "gelu_tanh" (gelu_new) or "gelu" (exact erf form)
    rope_theta: float = 10000.0
    model_head_dim: int | None = None   # the model's head size when head_dim is padded (pad_heads); None = head_dim

    @property
    def num_layers(self) -> int:
        return len(self.layers)


class _Graph:
    """Tiny helper that names nodes and collects initializers."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self._n = 0

    def const(self, name: str, arr: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(arr), name))
        return name

    def op(self, op_type: str, inputs: list[str], n_out: int = 1, domain: str = "", name: str | None = None,
           outputs: list[str] | None = None, **attrs) -> list[str]:
        self._n += 1
        base = name or f"{op_type}_{self._n}"
        outs = outputs or [f"{base}_out{i}" for i in range(n_out)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=base, domain=domain, **attrs))
        return outs

    def one(self, op_type: str, inputs: list[str], **kw) -> str:
        return self.op(op_type, inputs, **kw)[0]


def _rope_caches(w: DecoderWeights) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin [max_length, head_dim / 2] for HF's rotate-half rotary (computed in float64, stored fp32). The
    frequencies are the model's head size's; a padded head's extra pairs get the identity rotation (cos 1, sin 0):
    they hold zeros either way."""
    d = w.model_head_dim or w.head_dim
    inv = 1.0 / (w.rope_theta ** (np.arange(0, d // 2, dtype=np.float64) * 2 / d))
    angles = np.arange(w.max_length, dtype=np.float64)[:, None] * inv[None, :]
    cos, sin = np.ones((w.max_length, w.head_dim // 2)), np.zeros((w.max_length, w.head_dim // 2))
    cos[:, :d // 2], sin[:, :d // 2] = np.cos(angles), np.sin(angles)
    return cos.astype(np.float32), sin.astype(np.float32)


def _spread(a: np.ndarray, heads: int, d: int, padded: int, fill: float = 0.0) -> np.ndarray:
    """Last axis [heads * d] -> [heads * padded], each head's channels moved where modelpkg.head_channels puts
    them, the new channels set to `fill`."""
    out = np.full((*a.shape[:-1], heads, padded), fill, dtype=a.dtype)
    out[..., head_channels(d, padded)] = a.reshape(*a.shape[:-1], heads, d)
    return out.reshape(*a.shape[:-1], heads * padded)


def pad_heads(w: DecoderWeights) -> DecoderWeights:
    """The same model with every head widened by zero channels to the next multiple of 16 (unchanged when its
    head size already is one): q/k/v projection columns and biases, and the output projection's rows."""
    d = w.head_dim
    padded = padded_head_dim(d)
    if padded == d:
        return w
    nq, nkv = w.num_heads * d, w.num_kv_heads * d

    def qkv(a: np.ndarray | None) -> np.ndarray | None:
        if a is None:
            return None
        parts = (a[..., :nq], a[..., nq:nq + nkv], a[..., nq + nkv:])
        return np.concatenate([_spread(p, h, d, padded) for p, h in zip(parts, (w.num_heads, w.num_kv_heads,
                                                                              w.num_kv_heads))], axis=-1)

    layers = [dataclasses.replace(lw, qkv_w=qkv(lw.qkv_w), qkv_b=qkv(lw.qkv_b),
                                  out_w=_spread(lw.out_w.T, w.num_heads, d, padded).T.copy()) for lw in w.layers]
    return dataclasses.replace(w, head_dim=padded, model_head_dim=d, layers=layers)


# per layer: (key scale, value scale), each [kv_heads * the model's head size] (head-major)
KvScales = list[tuple[np.ndarray, np.ndarray]]


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
        kv_scales = [tuple(_spread(t, w.num_kv_heads, w.model_head_dim, w.head_dim, fill=1.0) for t in pair)
                     for pair in kv_scales]
    g = _Graph()
    gpt2 = w.family == "gpt2"
    f32 = TensorProto.FLOAT
    cache_type = TensorProto.INT8 if kv_scales is not None else f32
    cache_shape = ["batch", w.num_kv_heads, "max_sequence", w.head_dim]
    groups = ["", MIXED_PREFIX] if mixed else [""]
    inputs, outputs = [], []
    for pre in groups:
        b, s = f"{pre}batch", f"{pre}sequence"
        inputs += [helper.make_tensor_value_info(f"{pre}input_ids", TensorProto.INT64, [b, s]),
                   helper.make_tensor_value_info(f"{pre}attention_mask", TensorProto.INT64, [b, f"{pre}total_sequence"])]
        if gpt2:
            inputs.append(helper.make_tensor_value_info(f"{pre}position_ids", TensorProto.INT64, [b, s]))
        outputs.append(helper.make_tensor_value_info(f"{pre}logits", f32, [b, s, w.vocab_size]))
        for i in range(w.num_layers):
            for kind in ("key", "value"):
                inputs.append(helper.make_tensor_value_info(pre + past_name(i, kind), cache_type, cache_shape))
                outputs.append(helper.make_tensor_value_info(pre + present_name(i, kind), cache_type, cache_shape))

    axis1 = g.const("axis_1", np.array([1], dtype=np.int64))
    one64 = g.const("one_i64", np.array(1, dtype=np.int64))
    idx1 = g.const("idx_1", np.array(1, dtype=np.int64))
    first2 = (g.const("s0", np.array([0], np.int64)), g.const("s2", np.array([2], np.int64)))
    embed = g.const("embed.weight", w.embed)
    positions = g.const("positions.weight", w.positions) if gpt2 else ""
    flat_hidden = g.const("flat_hidden", np.array([-1, w.hidden], dtype=np.int64))

    # Per group: attention bookkeeping from its mask, its [batch, sequence] shape, its rows of hidden states.
    seqlens, totals, bs_shapes, rows = {}, {}, {}, []
    for pre in groups:
        # seqlens_k = tokens per row - 1 (int32 [B]); total_sequence_length = mask width (int32 scalar).
        summed = g.one("ReduceSum", [f"{pre}attention_mask", axis1], keepdims=0)
        seqlens[pre] = g.one("Cast", [g.one("Sub", [summed, one64])], to=TensorProto.INT32)
        width = g.one("Gather", [g.one("Shape", [f"{pre}attention_mask"]), idx1], axis=0)
        totals[pre] = g.one("Cast", [width], to=TensorProto.INT32)
        bs_shapes[pre] = g.one("Slice", [g.one("Shape", [f"{pre}input_ids"]), *first2])
        x = g.one("Gather", [embed, f"{pre}input_ids"], axis=0)
        if gpt2:
            x = g.one("Add", [x, g.one("Gather", [positions, f"{pre}position_ids"], axis=0)])
        rows.append(g.one("Reshape", [x, flat_hidden]))
    # All rows of all groups as one [tokens, hidden] matrix: every weight is read once per run.
    x = rows[0] if len(rows) == 1 else g.one("Concat", rows, axis=0)
    if mixed:   # where the first group's rows end
        n_first = g.one("ReduceProd", [bs_shapes[""]], keepdims=1)
        big = g.const("int64_max", np.array([2 ** 62], dtype=np.int64))
        zero = first2[0]

    def split_rows(t: str) -> list[str]:
        if not mixed:
            return [t]
        return [g.one("Slice", [t, zero, n_first, zero]), g.one("Slice", [t, n_first, big, zero])]

    shapes: dict[tuple[str, int], str] = {}

    def as_3d(t: str, pre: str, width: int) -> str:
        """[rows, width] -> the group's [batch, sequence, width] (each shape tensor is built once)."""
        if (pre, width) not in shapes:
            last = g.const(f"width_{pre}{width}", np.array([width], np.int64))
            shapes[pre, width] = g.one("Concat", [bs_shapes[pre], last], axis=0)
        return g.one("Reshape", [t, shapes[pre, width]])

    extra_attn: list[str] = []
    attrs: dict = {}
    if not gpt2:
        cos, sin = _rope_caches(w)
        extra_attn = [g.const("rope.cos", cos), g.const("rope.sin", sin)]
        attrs = {"do_rotary": 1, "rotary_interleaved": 0}
    if w.model_head_dim:   # padded heads: the op would scale q.k by 1/sqrt(the padded size)
        attrs["scale"] = float(1.0 / np.sqrt(w.model_head_dim))
    if kv_scales is not None:
        attrs.update(k_quant_type="PER_CHANNEL", v_quant_type="PER_CHANNEL", kv_cache_bit_width=8)

    # The attention op's inputs after total_sequence_length, per layer. With an int8 cache they run up to
    # k_scale / v_scale (positions 7-13: cos, sin, position_ids, attention_bias, head_sink, k_scale, v_scale).
    attn_tail = [extra_attn] * w.num_layers
    if kv_scales is not None:
        attn_tail = [[*(extra_attn or ["", ""]), "", "", "", g.const(f"layers.{i}.k_scale", k.astype(np.float32)),
                      g.const(f"layers.{i}.v_scale", v.astype(np.float32))] for i, (k, v) in enumerate(kv_scales)]

    def norm(inp: str, wt: np.ndarray, b: np.ndarray | None, prefix: str) -> str:
        if gpt2:
            return g.one("LayerNormalization", [inp, g.const(f"{prefix}.weight", wt), g.const(f"{prefix}.bias", b)],
                         axis=-1, epsilon=w.norm_eps)
        # RMSNorm from standard ops (once per run, on the embeddings; onnxruntime fuses the pattern). The
        # contrib SimplifiedLayerNormalization lives in the default domain, where onnx's checker rejects it.
        mean_sq = g.one("ReduceMean", [g.one("Mul", [inp, inp]), g.const(f"{prefix}.axes", np.array([-1], np.int64))],
                        keepdims=1)
        eps = g.const(f"{prefix}.eps", np.array(w.norm_eps, np.float32))
        scaled = g.one("Div", [inp, g.one("Sqrt", [g.one("Add", [mean_sq, eps])])])
        return g.one("Mul", [scaled, g.const(f"{prefix}.weight", wt)])

    def skip_norm(inp: str, skip: str, wt: np.ndarray, b: np.ndarray | None, prefix: str) -> tuple[str, str]:
        """(normalized(inp + skip), inp + skip). RMSNorm as one fused op; LayerNorm as Add + LayerNormalization
        (the "Residual norms" comment at the top)."""
        if gpt2:
            total = g.one("Add", [inp, skip])
            return norm(total, wt, b, prefix), total
        outs = g.op("SkipSimplifiedLayerNormalization", [inp, skip, g.const(f"{prefix}.weight", wt)], n_out=4,
                    domain=MS, epsilon=w.norm_eps)
        return outs[0], outs[3]

    def linear(inp: str, wt: np.ndarray, b: np.ndarray | None, prefix: str) -> str:
        y = g.one("MatMul", [inp, g.const(f"{prefix}.weight", wt)])
        return g.one("Add", [y, g.const(f"{prefix}.bias", b)]) if b is not None else y

    qkv_width = (w.num_heads + 2 * w.num_kv_heads) * w.head_dim
    flat_attn = g.const("flat_attn", np.array([-1, w.num_heads * w.head_dim], np.int64))
    residual = x
    h = ""
    for i, lw in enumerate(w.layers):
        p = f"layers.{i}"
        if i == 0:
            h = norm(residual, lw.norm1_w, lw.norm1_b, f"{p}.norm1")
        qkv = linear(h, lw.qkv_w, lw.qkv_b, f"{p}.qkv")
        attended = []
        for pre, part in zip(groups, split_rows(qkv)):
            out = g.op("GroupQueryAttention",
                       [as_3d(part, pre, qkv_width), "", "", pre + past_name(i, "key"), pre + past_name(i, "value"),
                        seqlens[pre], totals[pre], *attn_tail[i]],
                       domain=MS, name=f"{pre}{p}.attention",
                       outputs=[f"{pre}{p}.attn_out", pre + present_name(i, "key"), pre + present_name(i, "value")],
                       num_heads=w.num_heads, kv_num_heads=w.num_kv_heads, **attrs)[0]
            attended.append(g.one("Reshape", [out, flat_attn]))
        attn = attended[0] if len(attended) == 1 else g.one("Concat", attended, axis=0)
        a = linear(attn, lw.out_w, lw.out_b, f"{p}.out")
        h, residual = skip_norm(a, residual, lw.norm2_w, lw.norm2_b, f"{p}.norm2")
        if gpt2:
            up = g.one("MatMul", [h, g.const(f"{p}.up.weight", lw.up_w)])
            # gelu_new is FastGelu's tanh form; exact gelu is BiasGelu's erf form (both add the bias themselves).
            op = "FastGelu" if w.activation == "gelu_tanh" else "BiasGelu"
            act = g.one(op, [up, g.const(f"{p}.up.bias", lw.up_b)], domain=MS)
        else:
            gate_up = linear(h, lw.up_w, lw.up_b, f"{p}.up")
            gate, upv = g.op("Split", [gate_up, g.const(f"{p}.split", np.array([lw.down_w.shape[0]] * 2, np.int64))],
                             n_out=2, axis=-1)
            act = g.one("Mul", [g.one("Mul", [gate, g.one("Sigmoid", [gate])]), upv])   # SiLU(gate) * up
        m = linear(act, lw.down_w, lw.down_b, f"{p}.down")
        if i + 1 < w.num_layers:
            nxt = w.layers[i + 1]
            h, residual = skip_norm(m, residual, nxt.norm1_w, nxt.norm1_b, f"layers.{i + 1}.norm1")
        else:
            h, residual = skip_norm(m, residual, w.final_norm_w, w.final_norm_b, "final_norm")
    # LM head: Gemm(transB) on the embedding itself when tied, so its weights are stored once.
    head = embed if w.lm_head is None else g.const("lm_head.weight", w.lm_head)
    logits2d = g.one("Gemm", [h, head], transB=1)
    for pre, part in zip(groups, split_rows(logits2d)):
        g.op("Identity", [as_3d(part, pre, w.vocab_size)], outputs=[f"{pre}logits"])

    name = f"{w.family}-decoder-inplace{'-mixed' if mixed else ''}{'-kv8' if kv_scales is not None else ''}"
    graph = helper.make_graph(g.nodes, name, inputs, outputs, g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(MS, 1)],
                              producer_name="ortserve.export")
    model.ir_version = 9   # readable by every onnxruntime this project supports
    return model


# ----------------------------------------------------------------------------- from our PyTorch models


def _np(t) -> np.ndarray:
    return t.detach().to("cpu").float().numpy()


def gpt2_weights(model, max_length: int | None = None) -> DecoderWeights:
    """training.gpt.GPT2LMHeadModel (nn.Linear weights are [out, in]: transposed for MatMul)."""
    c = model.config
    tr = model.transformer
    heads, hd = c.n_head, c.n_embd // c.n_head
    layers = []
    for blk in tr.h:
        layers.append(LayerWeights(
            norm1_w=_np(blk.ln_1.weight), norm1_b=_np(blk.ln_1.bias),
            qkv_w=_np(blk.attn.c_attn.weight).T, qkv_b=_np(blk.attn.c_attn.bias),
            out_w=_np(blk.attn.c_proj.weight).T, out_b=_np(blk.attn.c_proj.bias),
            norm2_w=_np(blk.ln_2.weight), norm2_b=_np(blk.ln_2.bias),
            up_w=_np(blk.mlp.c_fc.weight).T, up_b=_np(blk.mlp.c_fc.bias),
            down_w=_np(blk.mlp.c_proj.weight).T, down_b=_np(blk.mlp.c_proj.bias)))
    tied = model.lm_head.weight.data_ptr() == tr.wte.weight.data_ptr()
    acts = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu"}
    if c.activation_function not in acts:
        raise ValueError(f"activation_function: {c.activation_function!r} has no fused op here (one of {sorted(acts)})")
    return DecoderWeights(family="gpt2", num_heads=heads, num_kv_heads=heads, head_dim=hd, hidden=c.n_embd,
                          vocab_size=c.vocab_size, max_length=max_length or c.n_positions,
                          norm_eps=c.layer_norm_epsilon, embed=_np(tr.wte.weight),
                          lm_head=None if tied else _np(model.lm_head.weight),
                          final_norm_w=_np(tr.ln_f.weight), final_norm_b=_np(tr.ln_f.bias), layers=layers,
                          positions=_np(tr.wpe.weight)[:max_length or c.n_positions],
                          activation=acts[c.activation_function])


def llama_weights(model, max_length: int | None = None) -> DecoderWeights:
    """training.llama.LlamaForCausalLM (Llama / Qwen2 / Mistral): q|k|v and gate|up packed for one MatMul each."""
    c = model.config
    m = model.model
    if c.hidden_act != "silu":
        raise ValueError(f"hidden_act: only silu (SwiGLU) has a graph here, got {c.hidden_act!r}")

    def bias(*linears) -> np.ndarray | None:
        if all(lin.bias is None for lin in linears):
            return None
        return np.concatenate([_np(lin.bias) for lin in linears])

    layers = []
    for blk in m.layers:
        at, mlp = blk.self_attn, blk.mlp
        layers.append(LayerWeights(
            norm1_w=_np(blk.input_layernorm.weight), norm1_b=None,
            qkv_w=np.concatenate([_np(at.q_proj.weight).T, _np(at.k_proj.weight).T, _np(at.v_proj.weight).T], axis=1),
            qkv_b=bias(at.q_proj, at.k_proj, at.v_proj),
            out_w=_np(at.o_proj.weight).T, out_b=bias(at.o_proj),
            norm2_w=_np(blk.post_attention_layernorm.weight), norm2_b=None,
            up_w=np.concatenate([_np(mlp.gate_proj.weight).T, _np(mlp.up_proj.weight).T], axis=1),
            up_b=bias(mlp.gate_proj, mlp.up_proj),
            down_w=_np(mlp.down_proj.weight).T, down_b=bias(mlp.down_proj)))
    tied = model.lm_head.weight.data_ptr() == m.embed_tokens.weight.data_ptr()
    return DecoderWeights(family="llama", num_heads=c.num_attention_heads, num_kv_heads=c.num_key_value_heads,
                          head_dim=c.head_dim, hidden=c.hidden_size, vocab_size=c.vocab_size,
                          max_length=max_length or c.max_position_embeddings, norm_eps=c.rms_norm_eps,
                          embed=_np(m.embed_tokens.weight), lm_head=None if tied else _np(model.lm_head.weight),
                          final_norm_w=_np(m.norm.weight), final_norm_b=None, layers=layers,
                          rope_theta=float(c.rope_theta))


LLAMA_FAMILY = ("llama", "qwen2", "mistral")


MIXED_FILE = "model.mixed.onnx"
KV8_MIXED_FILE = "model.kv8.mixed.onnx"    # the kv8 variant's mixed twin (cache.mixed_graphs in model.json)
FP16_MIXED_FILE = "model.fp16.mixed.onnx"  # the fp16 variant's mixed twin (for the CUDA provider)


INT8_MAX = 127
# Room above the largest |key| / |value| seen in calibration: text outside it writes larger values, which would
# saturate. Measured on the gate's held-out sentences: at 1x a random-init Llama's values clipped (KL 8.8e-3
# nats, perplexity ratio 1.027); at 2x (one bit of the 8) every model tried stays under 5e-4 nats.
HEADROOM = 2.0


def inplace_weights(model, model_type: str, max_length: int) -> DecoderWeights:
    """The model's weights, heads zero-padded to a size the attention op takes."""
    if model_type == "gpt2":
        return pad_heads(gpt2_weights(model, max_length))
    if model_type in LLAMA_FAMILY:
        return pad_heads(llama_weights(model, max_length))
    raise ValueError(f"model_type: no in-place decoder graph for {model_type!r}")


def export_inplace(model, model_type: str, max_length: int, out) -> GraphSpec:
    """Write the in-place graph of `model` to `out`, and its mixed twin (MIXED_FILE) beside it; returns the
    I/O spec model.json lists (the plain graph's: the mixed one adds the same names prefixed "chunk.")."""
    from .graphs import GraphSpec, TensorSpec

    w = inplace_weights(model, model_type, max_length)
    for mixed, path in ((False, out), (True, out.parent / MIXED_FILE)):
        onnx_model = build_decoder_graph(w, mixed=mixed)
        onnx.checker.check_model(onnx_model)
        onnx.save(onnx_model, str(path))
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


def calibrate_kv_scales(model, sequences: list[list[int]]) -> KvScales:
    """Per layer and channel (kv head x head dim): HEADROOM x the largest |key| / |value| the PyTorch model
    writes into its cache over `sequences`, over 127 — the int8 step."""
    import torch

    peaks: list[list[np.ndarray]] = []
    with torch.no_grad():
        for ids in sequences:
            _, presents = model(torch.tensor([ids], dtype=torch.long))
            for i, (k, v) in enumerate(presents):
                # [1, kv_heads, S, D] -> per channel [kv_heads * D], head-major (the op's scale layout)
                now = [t[0].abs().amax(dim=1).reshape(-1).float().numpy() for t in (k, v)]
                if len(peaks) <= i:
                    peaks.append(now)
                else:
                    peaks[i] = [np.maximum(a, b) for a, b in zip(peaks[i], now)]
    tiny = np.float32(1e-8)    # a channel that stayed 0 still needs a positive scale
    return [(HEADROOM * np.maximum(k, tiny) / INT8_MAX, HEADROOM * np.maximum(v, tiny) / INT8_MAX) for k, v in peaks]


def export_inplace_kv8(model, model_type: str, max_length: int, out, calibration: list[list[int]]) -> KvScales:
    """Write the int8-cache graph of `model` to `out` and its mixed twin (KV8_MIXED_FILE) beside it, both with
    the scales calibrated on `calibration`; returns them."""
    w = inplace_weights(model, model_type, max_length)
    scales = calibrate_kv_scales(model, calibration)
    for mixed, path in ((False, out), (True, out.parent / KV8_MIXED_FILE)):
        onnx_model = build_decoder_graph(w, mixed=mixed, kv_scales=scales)
        onnx.checker.check_model(onnx_model)
        onnx.save(onnx_model, str(path))
    return scales


def export_inplace_transformed(w: DecoderWeights, out, mixed_out, transform, kv_scales: KvScales | None = None
                               ) -> list:
    """The in-place graph of `w` and its mixed twin, each passed through `transform(graph) -> (graph, info)`
    (weight quantization), written to `out` / `mixed_out`; returns the two infos."""
    infos = []
    for mixed, path in ((False, out), (True, mixed_out)):
        graph, info = transform(build_decoder_graph(w, mixed=mixed, kv_scales=kv_scales))
        onnx.checker.check_model(graph)
        onnx.save(graph, str(path))
        infos.append(info)
    return infos
