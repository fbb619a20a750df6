"""ModernBERT (gte-modernbert, nomic-modernbert and ModernBERT fine-tunes) under Hugging Face parameter names.

What differs from BERT (training/bert.py):
- no position or token type tables: queries and keys are rotated (RoPE) by their position 0..S-1, with one theta
  for global layers (`global_rope_theta`) and another for local ones (`local_rope_theta`);
- layers alternate global attention and a bidirectional sliding window: a local layer's token i sees token j when
  |i - j| <= local_attention // 2 (HF's `config.sliding_window`), and both kinds see only unpadded keys;
  `layer_types` (or, in older configs, `global_attn_every_n_layers`: layer i is global when i % n == 0) says which;
- pre-norm layers: x + attn(attn_norm(x)), then x + mlp(mlp_norm(x)); the first layer's attn_norm is the identity
  (the embedding norm precedes it) and a final_norm ends the encoder; LayerNorms carry a bias only with `norm_bias`;
- the MLP is a GeGLU: Wi projects to 2 x intermediate, split into input and gate, act(input) * gate -> Wo;
- Wqkv is one fused projection; `attention_bias` / `mlp_bias` switch their biases;
- heads: `head` (dense -> activation -> norm) under every task; MLM adds `decoder` tied to the token embeddings;
  the sentence classifier pools the first token ("cls") or the mean of unpadded tokens ("mean") first.

transformers runs the padded batch through SDPA with a boolean mask. A padded query further than half a window
from every real token has no key to see in a local layer: SDPA answers zeros for such a row (the eager softmax would
average every key), so the attention here multiplies its probabilities by "this row sees some key". Real tokens
never meet that case, but the gate compares every position.
"""
from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from training.bert import activation

log = logging.getLogger(__name__)

LAYER_TYPES = ("full_attention", "sliding_attention")
POOLINGS = ("cls", "mean")
_DEFAULT_THETA = {"full_attention": 160_000.0, "sliding_attention": 10_000.0}
_THETA_KEYS = {"full_attention": "global_rope_theta", "sliding_attention": "local_rope_theta"}


def _checked_activation(key: str, name: str):
    try:
        return activation(name)
    except ValueError as e:
        raise ValueError(f"{key}: {str(e).split(': ', 1)[1]}") from None


@dataclass
class ModernBertConfig:
    """ModernBERT sizes and switches under transformers' ModernBertConfig names."""

    vocab_size: int = 50368
    hidden_size: int = 768
    intermediate_size: int = 1152
    num_hidden_layers: int = 22
    num_attention_heads: int = 12
    hidden_activation: str = "gelu"
    max_position_embeddings: int = 8192
    initializer_range: float = 0.02
    initializer_cutoff_factor: float = 2.0
    norm_eps: float = 1e-5
    norm_bias: bool = False
    pad_token_id: int | None = 50283
    eos_token_id: int | None = 50282
    bos_token_id: int | None = 50281
    cls_token_id: int | None = 50281
    sep_token_id: int | None = 50282
    attention_bias: bool = False
    attention_dropout: float = 0.0
    layer_types: list[str] | None = None
    global_attn_every_n_layers: int = 3
    global_rope_theta: float = _DEFAULT_THETA["full_attention"]
    local_rope_theta: float = _DEFAULT_THETA["sliding_attention"]
    local_attention: int = 128
    embedding_dropout: float = 0.0
    mlp_bias: bool = False
    mlp_dropout: float = 0.0
    decoder_bias: bool = True
    classifier_pooling: str = "cls"
    classifier_dropout: float = 0.0
    classifier_bias: bool = False
    classifier_activation: str = "gelu"
    tie_word_embeddings: bool = True
    num_labels: int = 2
    id2label: dict[int, str] | None = None
    label2id: dict[str, int] | None = None

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"hidden_size: {self.hidden_size} is not a multiple of "
                             f"num_attention_heads={self.num_attention_heads}")
        _checked_activation("hidden_activation", self.hidden_activation)
        _checked_activation("classifier_activation", self.classifier_activation)
        if self.classifier_pooling not in POOLINGS:
            raise ValueError(f"classifier_pooling: {self.classifier_pooling!r} is not one of {', '.join(POOLINGS)}")
        if self.layer_types is None:
            n = self.global_attn_every_n_layers
            self.layer_types = [LAYER_TYPES[bool(i % n)] for i in range(self.num_hidden_layers)]
        self.layer_types = list(self.layer_types)
        odd = [t for t in self.layer_types if t not in LAYER_TYPES]
        if odd or len(self.layer_types) != self.num_hidden_layers:
            raise ValueError(f"layer_types: need {self.num_hidden_layers} entries of {', '.join(LAYER_TYPES)}, "
                             f"got {self.layer_types!r}")
        if self.id2label is None:
            self.id2label = {i: f"LABEL_{i}" for i in range(self.num_labels)}
        self.id2label = {int(k): str(v) for k, v in self.id2label.items()}
        self.num_labels = len(self.id2label)
        self.label2id = ({str(k): int(v) for k, v in self.label2id.items()} if self.label2id is not None
                         else {v: k for k, v in self.id2label.items()})

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def sliding_window(self) -> int:
        """How far a local layer sees on each side (transformers' `config.sliding_window`)."""
        return self.local_attention // 2

    def rope_theta(self, layer_type: str) -> float:
        return self.global_rope_theta if layer_type == "full_attention" else self.local_rope_theta

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any]) -> "ModernBertConfig":
        """From config.json as transformers 5 writes it (`layer_types`, `rope_parameters`) or as the released
        checkpoints carry it (`global_attn_every_n_layers`, `global_rope_theta`, `local_rope_theta`). Rotary
        scaling is refused by name: the graph computes plain RoPE only."""
        if d.get("rope_scaling"):
            raise ValueError(f"rope_scaling: only plain rotary positions are supported, got {d['rope_scaling']!r}")
        fields = {f.name: f.default for f in dataclasses.fields(cls)}
        # A null keeps its meaning where the field may be None (no eos token...); elsewhere it means the default.
        kw = {k: v for k, v in d.items() if k in fields and (v is not None or fields[k] is None or k.endswith("_id"))}
        rope = d.get("rope_parameters") or {}
        for layer_type, key in _THETA_KEYS.items():
            params = rope.get(layer_type) or {}
            kind = params.get("rope_type", "default")
            if kind != "default":
                raise ValueError(f"rope_parameters.{layer_type}.rope_type: only 'default' is supported, got {kind!r}")
            extra = sorted(set(params) - {"rope_type", "rope_theta"})
            if extra:
                raise ValueError(f"rope_parameters.{layer_type}: unsupported keys {extra}")
            if "rope_theta" in params:
                kw[key] = float(params["rope_theta"])
        if kw.get("id2label") is not None:
            kw.pop("num_labels", None)
        return cls(**kw)

    def to_hf_dict(self) -> dict[str, Any]:
        """config.json content (without architectures): both the transformers 5 keys and the older ones."""
        d = dataclasses.asdict(self)
        d["id2label"] = {str(k): v for k, v in self.id2label.items()}
        d.pop("num_labels")
        d["rope_parameters"] = {t: {"rope_type": "default", "rope_theta": self.rope_theta(t)} for t in LAYER_TYPES}
        pattern = [LAYER_TYPES[bool(i % self.global_attn_every_n_layers)] for i in range(self.num_hidden_layers)]
        if pattern != self.layer_types:   # an irregular pattern: older readers must not derive another one
            d.pop("global_attn_every_n_layers")
        d["model_type"] = "modernbert"
        return d


def _norm(config: ModernBertConfig) -> nn.LayerNorm:
    return nn.LayerNorm(config.hidden_size, eps=config.norm_eps, bias=config.norm_bias)


class ModernBertEmbeddings(nn.Module):
    """Token embeddings -> norm -> dropout (no positions: those are rotary, in the attention)."""

    def __init__(self, config: ModernBertConfig) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.norm = _norm(config)
        self.drop = nn.Dropout(config.embedding_dropout)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.drop(self.norm(self.tok_embeddings(input_ids)))


class ModernBertMLP(nn.Module):
    """GeGLU: Wi's output halves are the input and the gate."""

    def __init__(self, config: ModernBertConfig) -> None:
        super().__init__()
        self.Wi = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=config.mlp_bias)
        self.act = _checked_activation("hidden_activation", config.hidden_activation)
        self.drop = nn.Dropout(config.mlp_dropout)
        self.Wo = nn.Linear(config.intermediate_size, config.hidden_size, bias=config.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        inp, gate = self.Wi(x).chunk(2, dim=-1)
        return self.Wo(self.drop(self.act(inp) * gate))


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class ModernBertAttention(nn.Module):
    """Fused Wqkv -> rotary q, k -> softmax(q k^T / sqrt(d) + mask), zeroed on rows that see no key -> Wo."""

    def __init__(self, config: ModernBertConfig) -> None:
        super().__init__()
        self.heads, self.head_dim = config.num_attention_heads, config.head_dim
        self.Wqkv = nn.Linear(config.hidden_size, 3 * config.hidden_size, bias=config.attention_bias)
        self.Wo = nn.Linear(config.hidden_size, config.hidden_size, bias=config.attention_bias)
        self.attn_drop = nn.Dropout(config.attention_dropout)
        self.out_drop = nn.Dropout(config.attention_dropout)

    def forward(self, x: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor],
                mask: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = self.Wqkv(x).view(b, s, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(dim=0)
        cos, sin = rotary                                   # [S, D], broadcast over batch and heads
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        additive, sees_any = mask
        scores = torch.matmul(q, k.transpose(-1, -2)) * (self.head_dim ** -0.5) + additive
        probs = self.attn_drop(torch.softmax(scores, dim=-1) * sees_any)
        out = torch.matmul(probs, v).transpose(1, 2).reshape(b, s, -1)
        return self.out_drop(self.Wo(out))


class ModernBertEncoderLayer(nn.Module):
    def __init__(self, config: ModernBertConfig, index: int) -> None:
        super().__init__()
        self.attn_norm = nn.Identity() if index == 0 else _norm(config)
        self.attn = ModernBertAttention(config)
        self.mlp_norm = _norm(config)
        self.mlp = ModernBertMLP(config)
        self.attention_type = config.layer_types[index]

    def forward(self, x: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor],
                mask: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), rotary, mask)
        return x + self.mlp(self.mlp_norm(x))


class ModernBertModel(nn.Module):
    """Embeddings -> layers (global or local attention each) -> final_norm; `forward` -> last hidden state."""

    def __init__(self, config: ModernBertConfig) -> None:
        super().__init__()
        self.config = config
        self.embeddings = ModernBertEmbeddings(config)
        self.layers = nn.ModuleList(ModernBertEncoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.final_norm = _norm(config)
        d = config.head_dim
        for layer_type in LAYER_TYPES:   # not in the state dict (HF recomputes them too)
            inv_freq = 1.0 / (config.rope_theta(layer_type) ** (torch.arange(0, d, 2, dtype=torch.float) / d))
            self.register_buffer(f"{layer_type}_inv_freq", inv_freq, persistent=False)

    def _rotary(self, seq: int, layer_type: str) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = torch.arange(seq, dtype=torch.float)[:, None] * getattr(self, f"{layer_type}_inv_freq")[None, :]
        angles = torch.cat((freqs, freqs), dim=-1)
        return angles.cos(), angles.sin()

    def _masks(self, attention_mask: torch.Tensor, dtype: torch.dtype) -> dict[str, tuple[torch.Tensor, ...]]:
        """Per layer type: (additive mask [B, 1, S, S] or [B, 1, 1, S], 1.0 where a query row sees some key)."""
        seq = attention_mask.shape[1]
        keys = attention_mask[:, None, None, :].bool()
        pos = torch.arange(seq)
        near = (pos[:, None] - pos[None, :]).abs() <= self.config.sliding_window
        zero, lowest = torch.zeros((), dtype=dtype), torch.tensor(torch.finfo(dtype).min, dtype=dtype)
        out = {}
        for layer_type, allowed in (("full_attention", keys), ("sliding_attention", keys & near)):
            additive = torch.where(allowed, zero, lowest)
            out[layer_type] = (additive, allowed.to(dtype).amax(dim=-1, keepdim=True))
        return out

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        """-> last_hidden_state [B, S, hidden]. token_type_ids is accepted and ignored (there are none)."""
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        x = self.embeddings(input_ids)
        masks = self._masks(attention_mask, x.dtype)
        rotary = {t: self._rotary(input_ids.shape[1], t) for t in set(self.config.layer_types)}
        for layer in self.layers:
            x = layer(x, rotary[layer.attention_type], masks[layer.attention_type])
        return self.final_norm(x)


class ModernBertPredictionHead(nn.Module):
    """dense -> classifier_activation -> norm: under the MLM decoder and under every classifier."""

    def __init__(self, config: ModernBertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size, bias=config.classifier_bias)
        self.act = _checked_activation("classifier_activation", config.classifier_activation)
        self.norm = _norm(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.act(self.dense(x)))


class _Headed(nn.Module):
    """The encoder under HF's prefix `model` and the `head` every task has."""

    def __init__(self, config: ModernBertConfig) -> None:
        super().__init__()
        self.config = config
        self.model = ModernBertModel(config)
        self.head = ModernBertPredictionHead(config)

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
               token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        """-> last hidden state [B, S, H]."""
        return self.model(input_ids, attention_mask)

    def states(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
               token_type_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, None]:
        """What every family's encoder answers (training/heads.py): no pooled vector."""
        return self.encode(input_ids, attention_mask), None


class ModernBertForMaskedLM(_Headed):
    """head -> decoder (its weight the token embeddings when tie_word_embeddings; its own bias)."""

    def __init__(self, config: ModernBertConfig) -> None:
        super().__init__(config)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size, bias=config.decoder_bias)
        init_modernbert(self)
        self.tie_weights()

    def tie_weights(self) -> None:
        if self.config.tie_word_embeddings:
            self.decoder.weight = self.model.embeddings.tok_embeddings.weight

    def tied_hf_keys(self) -> set[str]:
        """Keys transformers derives from others (not written, filled in on load)."""
        return {"decoder.weight"} if self.config.tie_word_embeddings else set()

    def mlm_head(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.head(hidden))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        """-> logits [B, S, vocab]."""
        return self.mlm_head(self.encode(input_ids, attention_mask))


class _Classifier(_Headed):
    def __init__(self, config: ModernBertConfig) -> None:
        super().__init__(config)
        self.drop = nn.Dropout(config.classifier_dropout)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        init_modernbert(self)

    def head_logits(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.drop(self.head(x)))


class ModernBertForSequenceClassification(_Classifier):
    """Pool (first token, or the mean of unpadded tokens: `classifier_pooling`) -> head -> dropout -> classifier."""

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        """-> logits [B, num_labels]."""
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        hidden = self.encode(input_ids, attention_mask)
        if self.config.classifier_pooling == "cls":
            pooled = hidden[:, 0]
        else:
            weights = attention_mask.to(hidden.dtype)
            pooled = (hidden * weights[..., None]).sum(dim=1) / weights.sum(dim=1, keepdim=True)
        return self.head_logits(pooled)


class ModernBertForTokenClassification(_Classifier):
    """head -> dropout -> classifier at every position."""

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        """-> logits [B, S, num_labels]."""
        return self.head_logits(self.encode(input_ids, attention_mask))


def init_modernbert(model: nn.Module) -> None:
    """transformers' init: truncated normal weights (cut at initializer_cutoff_factor std), with std
    initializer_range for inputs and embeddings, shrunk by sqrt(2 layers) for outputs, hidden^-0.5 for the
    classifier; zero biases, unit norms."""
    cfg = model.config
    cut = cfg.initializer_cutoff_factor or 3.0
    std_in, std_out = cfg.initializer_range, cfg.initializer_range / math.sqrt(2.0 * cfg.num_hidden_layers)

    def draw(layer: nn.Module, std: float) -> None:
        nn.init.trunc_normal_(layer.weight, mean=0.0, std=std, a=-cut * std, b=cut * std)
        if getattr(layer, "bias", None) is not None:
            nn.init.zeros_(layer.bias)

    for m in model.modules():
        if isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, ModernBertEmbeddings):
            draw(m.tok_embeddings, std_in)
        elif isinstance(m, (ModernBertMLP, ModernBertAttention)):
            draw(m.Wi if isinstance(m, ModernBertMLP) else m.Wqkv, std_in)
            draw(m.Wo, std_out)
        elif isinstance(m, ModernBertPredictionHead):
            draw(m.dense, std_out)
    if isinstance(model, _Classifier):
        draw(model.classifier, cfg.hidden_size ** -0.5)
    elif isinstance(model, ModernBertForMaskedLM) and not cfg.tie_word_embeddings:
        draw(model.decoder, std_out)


# training/checkpoint.py's kinds of this family: kind -> (model class, HF architecture, model_type)
KINDS: dict[str, tuple[type[nn.Module], str, str]] = {
    "modernbert-mlm": (ModernBertForMaskedLM, "ModernBertForMaskedLM", "modernbert"),
    "modernbert-classifier": (ModernBertForSequenceClassification, "ModernBertForSequenceClassification",
                              "modernbert"),
    "modernbert-token-classifier": (ModernBertForTokenClassification, "ModernBertForTokenClassification",
                                    "modernbert"),
}
