"""The in-place decoder graph's input: a checkpoint's weights as numpy arrays in MatMul orientation, read from our
PyTorch models (GPT-2; the Llama family: Llama, Qwen2, Mistral, Qwen3, SmolLM3, Phi-3), heads zero-padded to a size
the attention op takes, and the int8 cache's scales calibrated on the model's own keys and values.
export/decoder_graph.py writes the graph.

Head sizes that are not a multiple of 16 (which onnxruntime's CPU GroupQueryAttention refuses) are zero-padded
(pad_heads): every head's q/k/v projection gains zero columns, the output projection zero rows, and the graph keeps
the op's `scale` at 1/sqrt(the model's head size), so q.k, the softmax and the output are those of the model. The
model's channels sit in the two halves of the padded head (modelpkg/heads.py), which keeps rotate-half rotary pairs
together.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from modelpkg import head_channels, padded_head_dim


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
    q_norm_w: np.ndarray | None = None  # Qwen3: per-head RMSNorm weights [head_dim] on q and k before rotary
    k_norm_w: np.ndarray | None = None


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
    rope_inv_freq: np.ndarray | None = None  # float64 [rotary_dim / 2] (export/decoder_rope.py); None: rope_theta's
    rope_scale: float = 1.0             # yarn / longrope attention factor on cos and sin
    rotary_layers: tuple[bool, ...] | None = None  # SmolLM3: False for a layer without rotary; None = all rotate
    sliding_window: int | None = None   # Phi-3: a query sees this many keys, itself included (every layer)

    @property
    def num_layers(self) -> int:
        return len(self.layers)


# per layer: (key scale, value scale), each [kv_heads * the model's head size] (head-major)
KvScales = list[tuple[np.ndarray, np.ndarray]]

LLAMA_FAMILY = ("llama", "qwen2", "mistral", "qwen3", "smollm3", "phi3")


def spread(a: np.ndarray, heads: int, d: int, padded: int, fill: float = 0.0) -> np.ndarray:
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
        return np.concatenate([spread(p, h, d, padded) for p, h in zip(parts, (w.num_heads, w.num_kv_heads,
                                                                             w.num_kv_heads))], axis=-1)

    layers = [dataclasses.replace(lw, qkv_w=qkv(lw.qkv_w), qkv_b=qkv(lw.qkv_b),
                                  out_w=spread(lw.out_w.T, w.num_heads, d, padded).T.copy()) for lw in w.layers]
    return dataclasses.replace(w, head_dim=padded, model_head_dim=d, layers=layers)


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


def _packed(at, mlp) -> tuple[np.ndarray, np.ndarray]:
    """q|k|v and gate|up [in, out], packed for one MatMul each (Phi-3 stores them so already)."""
    if hasattr(at, "qkv_proj"):
        return _np(at.qkv_proj.weight).T, _np(mlp.gate_up_proj.weight).T
    return (np.concatenate([_np(at.q_proj.weight).T, _np(at.k_proj.weight).T, _np(at.v_proj.weight).T], axis=1),
            np.concatenate([_np(mlp.gate_proj.weight).T, _np(mlp.up_proj.weight).T], axis=1))


def llama_weights(model, max_length: int | None = None) -> DecoderWeights:
    """training.llama.LlamaForCausalLM (the Llama family): q|k|v and gate|up packed for one MatMul each."""
    from .decoder_rope import rope_settings

    c = model.config
    m = model.model
    if c.hidden_act != "silu":
        raise ValueError(f"hidden_act: only silu (SwiGLU) has a graph here, got {c.hidden_act!r}")
    inv_freq, rope_scale, rotary_layers = rope_settings(c, max_length or c.max_position_embeddings)

    def bias(*linears) -> np.ndarray | None:
        if all(getattr(lin, "bias", None) is None for lin in linears):
            return None
        return np.concatenate([_np(lin.bias) for lin in linears])

    layers = []
    for blk in m.layers:
        at, mlp = blk.self_attn, blk.mlp
        qkv_w, up_w = _packed(at, mlp)
        qk_norm = hasattr(at, "q_norm")
        layers.append(LayerWeights(
            norm1_w=_np(blk.input_layernorm.weight), norm1_b=None,
            qkv_w=qkv_w, qkv_b=None if c.fused else bias(at.q_proj, at.k_proj, at.v_proj),
            out_w=_np(at.o_proj.weight).T, out_b=bias(at.o_proj),
            norm2_w=_np(blk.post_attention_layernorm.weight), norm2_b=None,
            up_w=up_w, up_b=None if c.fused else bias(mlp.gate_proj, mlp.up_proj),
            down_w=_np(mlp.down_proj.weight).T, down_b=bias(mlp.down_proj),
            q_norm_w=_np(at.q_norm.weight) if qk_norm else None, k_norm_w=_np(at.k_norm.weight) if qk_norm else None))
    tied = model.lm_head.weight.data_ptr() == m.embed_tokens.weight.data_ptr()
    return DecoderWeights(family="llama", num_heads=c.num_attention_heads, num_kv_heads=c.num_key_value_heads,
                          head_dim=c.head_dim, hidden=c.hidden_size, vocab_size=c.vocab_size,
                          max_length=max_length or c.max_position_embeddings, norm_eps=c.rms_norm_eps,
                          embed=_np(m.embed_tokens.weight), lm_head=None if tied else _np(model.lm_head.weight),
                          final_norm_w=_np(m.norm.weight), final_norm_b=None, layers=layers,
                          rope_theta=float(c.rope_theta), rope_inv_freq=inv_freq, rope_scale=rope_scale,
                          rotary_layers=rotary_layers, sliding_window=c.sliding_window)


# model_type -> reader (model, max_length) -> weights, for families whose graph module registers itself
# (export/gemma_graph.py).
READERS: dict[str, Callable[[Any, int], DecoderWeights]] = {}


def inplace_weights(model, model_type: str, max_length: int) -> DecoderWeights:
    """The model's weights, heads zero-padded to a size the attention op takes."""
    if model_type in READERS:
        return READERS[model_type](model, max_length)
    if model_type == "gpt2":
        return pad_heads(gpt2_weights(model, max_length))
    if model_type in LLAMA_FAMILY:
        return pad_heads(llama_weights(model, max_length))
    raise ValueError(f"model_type: no in-place decoder graph for {model_type!r}")


INT8_MAX = 127
# Room above the largest |key| / |value| seen in calibration: text outside it writes larger values, which would
# saturate. At 1x a random-init Llama's values clipped on the gate's held-out sentences and the gate refused it;
# 2x (one bit of the 8) kept every model tried within the gate's limits (docs/BENCHMARKS.md, the kv8 variant).
HEADROOM = 2.0


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
