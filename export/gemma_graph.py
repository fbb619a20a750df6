"""Gemma 2 / Gemma 3 (text) in the in-place decoder graph: the weights read from training/gemma.py's model and the
builder that writes them (export/decoder_graph.py's, with Gemma's parts swapped in). Importing this module
registers both for model_type gemma2 / gemma3_text (decoder_weights.READERS, decoder_graph.BUILDERS).

What differs from the Llama graph, each as transformers computes it:
  - the embedding rows are multiplied by sqrt(hidden) (a Mul after the Gather: the table is shared with the tied
    head, so the factor cannot be folded into it);
  - every RMSNorm's (1 + weight) is folded into the stored weight (the same fp32 sum transformers forms);
  - the block's four norms: input_layernorm -> attention -> post_attention_layernorm (plain RMSNorm), then the
    residual add fused with pre_feedforward_layernorm, MLP -> post_feedforward_layernorm, the next add fused with
    the next block's input_layernorm (or the final norm);
  - FastGelu(gate) * up in the MLP (the tanh form of gelu_pytorch_tanh);
  - GroupQueryAttention's `scale` = query_pre_attn_scalar**-0.5, `softcap` = Gemma 2's attn_logit_softcapping,
    and on sliding layers `local_window_size` = sliding_window: the op then lets a query at position p see keys
    p - window < j <= p, transformers' sliding mask (checked against a numpy reference over prefill, chunks and
    decoding past the window in the full-length cache: tests/export/test_gemma_export.py);
  - two rotary tables, one per layer type (Gemma 3: rope_local_base_freq on sliding layers, rope_theta and an
    optional linear scaling on full ones; Gemma 2: one base for both);
  - Gemma 3's q/k RMSNorms over each head, written before the op (whose rotary would otherwise come first; its
    own q_norm_weight input is not honoured by the CPU provider);
  - final soft-capping: cap * tanh(logits / cap) after the head's Gemm.

The cache is the same full-length in-place buffer as every other decoder's (docs/model-package.md): a sliding
layer keeps every position and masks the old ones, so the server needs no new fact to drive it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from modelpkg import padded_head_dim, past_name, present_name

from . import decoder_graph, decoder_weights
from .decoder_weights import DecoderWeights, LayerWeights, pad_heads
from .errors import ExportError
from .graph_writer import MS


@dataclass
class GemmaLayer(LayerWeights):
    """A Gemma block: LayerWeights' norm1 is input_layernorm, norm2 pre_feedforward_layernorm (all (1 + w))."""

    post_attn_w: np.ndarray | None = None
    post_ff_w: np.ndarray | None = None
    q_norm_w: np.ndarray | None = None    # Gemma 3 [head_dim]
    k_norm_w: np.ndarray | None = None
    layer_type: str = "full_attention"
    window: int | None = None             # positions a query sees (itself included); None = all


@dataclass
class GemmaWeights(DecoderWeights):
    embed_scale: float = 1.0
    query_scale: float = 1.0
    attn_softcap: float | None = None
    final_softcap: float | None = None
    ropes: dict[str, tuple[float, float]] = field(default_factory=dict)  # layer type -> (base, linear factor)


def _np(t) -> np.ndarray:
    return t.detach().to("cpu").float().numpy()


def _one_plus(norm) -> np.ndarray:
    return (1.0 + norm.weight.detach().float()).numpy()


def gemma_weights(model, max_length: int | None = None) -> GemmaWeights:
    """training.gemma.GemmaForCausalLM: q|k|v and gate|up packed for one MatMul each, norms as (1 + w)."""
    c = model.config
    m = model.model
    layers = []
    for i, blk in enumerate(m.layers):
        at, mlp = blk.self_attn, blk.mlp
        layers.append(GemmaLayer(
            norm1_w=_one_plus(blk.input_layernorm), norm1_b=None,
            qkv_w=np.concatenate([_np(at.q_proj.weight).T, _np(at.k_proj.weight).T, _np(at.v_proj.weight).T], axis=1),
            qkv_b=None, out_w=_np(at.o_proj.weight).T, out_b=None,
            norm2_w=_one_plus(blk.pre_feedforward_layernorm), norm2_b=None,
            up_w=np.concatenate([_np(mlp.gate_proj.weight).T, _np(mlp.up_proj.weight).T], axis=1), up_b=None,
            down_w=_np(mlp.down_proj.weight).T, down_b=None,
            post_attn_w=_one_plus(blk.post_attention_layernorm), post_ff_w=_one_plus(blk.post_feedforward_layernorm),
            q_norm_w=_one_plus(at.q_norm) if c.qk_norm else None, k_norm_w=_one_plus(at.k_norm) if c.qk_norm else None,
            layer_type=c.layer_types[i], window=c.window(i)))
    tied = model.lm_head.weight.data_ptr() == m.embed_tokens.weight.data_ptr()
    return GemmaWeights(family=c.model_type, num_heads=c.num_attention_heads, num_kv_heads=c.num_key_value_heads,
                        head_dim=c.head_dim, hidden=c.hidden_size, vocab_size=c.vocab_size,
                        max_length=max_length or c.max_position_embeddings, norm_eps=c.rms_norm_eps,
                        embed=_np(m.embed_tokens.weight), lm_head=None if tied else _np(model.lm_head.weight),
                        final_norm_w=_one_plus(m.norm), final_norm_b=None, layers=layers,
                        embed_scale=float(np.float32(c.hidden_size ** 0.5)),
                        query_scale=float(c.query_pre_attn_scalar) ** -0.5, attn_softcap=c.attention_softcap,
                        final_softcap=c.final_logit_softcapping,
                        ropes={kind: c.rope(kind) for kind in sorted(set(c.layer_types))})


def inplace_gemma_weights(model, max_length: int) -> GemmaWeights:
    """The model's weights with heads zero-padded to a multiple of 16 where needed (Gemma 2 only: Gemma 3's q/k
    norms average over the head's channels, which padding would change)."""
    c = model.config
    if c.qk_norm and padded_head_dim(c.head_dim) != c.head_dim:
        raise ExportError(f"head_dim: {c.head_dim} is not a multiple of 16 (onnxruntime's GroupQueryAttention) and "
                          "Gemma 3's q/k norms cannot be zero-padded")
    return pad_heads(gemma_weights(model, max_length))


def rope_tables(w: GemmaWeights, kind: str) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin [max_length, head_dim / 2] of a layer type (float64, stored fp32); a padded head's extra pairs
    rotate by 0 (they hold zeros)."""
    base, factor = w.ropes[kind]
    d = w.model_head_dim or w.head_dim
    inv = 1.0 / (base ** (np.arange(0, d // 2, dtype=np.float64) * 2 / d)) / factor
    angles = np.arange(w.max_length, dtype=np.float64)[:, None] * inv[None, :]
    cos, sin = np.ones((w.max_length, w.head_dim // 2)), np.zeros((w.max_length, w.head_dim // 2))
    cos[:, :d // 2], sin[:, :d // 2] = np.cos(angles), np.sin(angles)
    return cos.astype(np.float32), sin.astype(np.float32)


class GemmaBuilder(decoder_graph._DecoderBuilder):
    """decoder_graph's builder with Gemma's embedding scale, norms, MLP, attention settings and capped head."""

    w: GemmaWeights

    def embed_rows(self) -> str:
        x = super().embed_rows()
        return self.g.one("Mul", [x, self.g.const("embed_scale", np.array(self.w.embed_scale, np.float32))])

    def attention_settings(self) -> None:
        """Per layer: its type's cos/sin (and the int8 cache's scales); per layer type: the op's attributes."""
        g, w = self.g, self.w
        tables = {}
        for kind in w.ropes:
            cos, sin = rope_tables(w, kind)
            tables[kind] = [g.const(f"rope.{kind}.cos", cos), g.const(f"rope.{kind}.sin", sin)]
        attrs = {"do_rotary": 1, "rotary_interleaved": 0, "scale": float(w.query_scale)}
        if w.attn_softcap is not None:
            attrs["softcap"] = float(w.attn_softcap)
        if self.kv_scales is not None:
            attrs.update(k_quant_type="PER_CHANNEL", v_quant_type="PER_CHANNEL", kv_cache_bit_width=8)
        self.attn_attrs = attrs
        self.attn_tail = []
        for i, lw in enumerate(w.layers):
            tail = list(tables[lw.layer_type])
            if self.kv_scales is not None:
                k, v = self.kv_scales[i]
                tail += ["", "", "", g.const(f"layers.{i}.k_scale", k.astype(np.float32)),
                         g.const(f"layers.{i}.v_scale", v.astype(np.float32))]
            self.attn_tail.append(tail)

    def _head_norm(self, t: str, heads: int, wt: np.ndarray, prefix: str) -> str:
        """RMSNorm over each head of [rows, heads * head_dim] (Gemma 3's q_norm / k_norm)."""
        g, d = self.g, self.w.head_dim
        per_head = g.one("Reshape", [t, g.const(f"{prefix}.heads", np.array([-1, heads, d], np.int64))])
        normed = self.norm(per_head, wt, None, prefix)
        return g.one("Reshape", [normed, g.const(f"{prefix}.flat", np.array([-1, heads * d], np.int64))])

    def _qkv(self, i: int, h: str, lw: GemmaLayer) -> list[list[str]]:
        """Per group, the op's query/key/value inputs: packed q|k|v, or (Gemma 3) q and k normed per head."""
        p, w = f"layers.{i}", self.w
        qkv = self.linear(h, lw.qkv_w, None, f"{p}.qkv")
        if lw.q_norm_w is None:
            return [[self.as_3d(part, pre, self.qkv_width), "", ""]
                    for pre, part in zip(self.groups, self.split_rows(qkv))]
        nq, nkv = w.num_heads * w.head_dim, w.num_kv_heads * w.head_dim
        q, k, v = self.g.op("Split", [qkv, self.g.const(f"{p}.qkv_split", np.array([nq, nkv, nkv], np.int64))],
                            n_out=3, axis=-1)
        q = self._head_norm(q, w.num_heads, lw.q_norm_w, f"{p}.q_norm")
        k = self._head_norm(k, w.num_kv_heads, lw.k_norm_w, f"{p}.k_norm")
        parts = [self.split_rows(t) for t in (q, k, v)]
        return [[self.as_3d(parts[0][j], pre, nq), self.as_3d(parts[1][j], pre, nkv), self.as_3d(parts[2][j], pre, nkv)]
                for j, pre in enumerate(self.groups)]

    def attention(self, i: int, h: str, lw: GemmaLayer) -> str:
        """Layer i's attention: one op call per group, windowed on sliding layers."""
        g, w, p = self.g, self.w, f"layers.{i}"
        attrs = dict(self.attn_attrs)
        if lw.window is not None:
            attrs["local_window_size"] = int(lw.window)
        attended = []
        for pre, qkv in zip(self.groups, self._qkv(i, h, lw)):
            out = g.op("GroupQueryAttention",
                       [*qkv, pre + past_name(i, "key"), pre + past_name(i, "value"),
                        self.seqlens[pre], self.totals[pre], *self.attn_tail[i]],
                       domain=MS, name=f"{pre}{p}.attention",
                       outputs=[f"{pre}{p}.attn_out", pre + present_name(i, "key"),
                                pre + present_name(i, "value")],
                       num_heads=w.num_heads, kv_num_heads=w.num_kv_heads, **attrs)[0]
            attended.append(g.one("Reshape", [out, self.flat_attn]))
        attn = attended[0] if len(attended) == 1 else g.one("Concat", attended, axis=0)
        return self.linear(attn, lw.out_w, None, f"{p}.out")

    def mlp_activation(self, p: str, h: str, lw: GemmaLayer) -> str:
        """gelu_tanh(gate) * up."""
        g = self.g
        gate_up = self.linear(h, lw.up_w, None, f"{p}.up")
        gate, upv = g.op("Split", [gate_up, g.const(f"{p}.split", np.array([lw.down_w.shape[0]] * 2, np.int64))],
                         n_out=2, axis=-1)
        return g.one("Mul", [g.one("FastGelu", [gate], domain=MS), upv])

    def layers(self, x: str) -> str:
        """Every block with Gemma's four norms; the residual adds fused into the norms that follow them."""
        w = self.w
        self.qkv_width = (w.num_heads + 2 * w.num_kv_heads) * w.head_dim
        self.flat_attn = self.g.const("flat_attn", np.array([-1, w.num_heads * w.head_dim], np.int64))
        residual = x
        h = self.norm(residual, w.layers[0].norm1_w, None, "layers.0.norm1")
        for i, lw in enumerate(w.layers):
            p = f"layers.{i}"
            a = self.norm(self.attention(i, h, lw), lw.post_attn_w, None, f"{p}.post_attn_norm")
            h, residual = self.skip_norm(a, residual, lw.norm2_w, None, f"{p}.norm2")
            m = self.linear(self.mlp_activation(p, h, lw), lw.down_w, None, f"{p}.down")
            m = self.norm(m, lw.post_ff_w, None, f"{p}.post_ff_norm")
            last = i + 1 == w.num_layers
            nxt, name = (w.final_norm_w, "final_norm") if last else (w.layers[i + 1].norm1_w, f"layers.{i + 1}.norm1")
            h, residual = self.skip_norm(m, residual, nxt, None, name)
        return h

    def lm_head(self, h: str) -> None:
        """The tied head's Gemm, then cap * tanh(logits / cap) when the model caps its logits."""
        g, w = self.g, self.w
        head = self.embed if w.lm_head is None else g.const("lm_head.weight", w.lm_head)
        logits2d = g.one("Gemm", [h, head], transB=1)
        if w.final_softcap is not None:
            cap = g.const("final_softcap", np.array(w.final_softcap, np.float32))
            logits2d = g.one("Mul", [g.one("Tanh", [g.one("Div", [logits2d, cap])]), cap])
        for pre, part in zip(self.groups, self.split_rows(logits2d)):
            g.op("Identity", [self.as_3d(part, pre, w.vocab_size)], outputs=[f"{pre}logits"])


for _model_type in ("gemma2", "gemma3_text"):
    decoder_weights.READERS[_model_type] = inplace_gemma_weights
    decoder_graph.BUILDERS[_model_type] = GemmaBuilder
