"""BERT encoder and heads with Hugging Face parameter names.

One file, nanoGPT style: a config dataclass and plain modules whose state dict keys equal those of
`transformers`' Bert* models, so HF checkpoints load with `load_state_dict(strict=True)` and ours
load into `transformers`.

Attention is written out eagerly (matmul, scale, additive mask, softmax, matmul) in the same shape
as HF's legacy eager path: onnxruntime's BERT fusion only recognises that graph, not SDPA.
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

from training.heads import (MaskedLM, PooledClassifier, PreTraining, TokenClassifier,
                            classifier_dropout)
from training.weight_init import init_weights

log = logging.getLogger(__name__)

_ACTIVATIONS = {
    "gelu": lambda x: F.gelu(x),
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
    "silu": F.silu,
    "swish": F.silu,
}

_PRESETS: dict[str, dict[str, int]] = {
    # tiny: unit tests (seconds); small: default trained models (minutes on 2 cores); base: BERT-base.
    "tiny": dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=2, intermediate_size=128,
                 max_position_embeddings=128),
    "small": dict(num_hidden_layers=4, hidden_size=256, num_attention_heads=4, intermediate_size=1024,
                  max_position_embeddings=256),
    "base": dict(num_hidden_layers=12, hidden_size=768, num_attention_heads=12, intermediate_size=3072,
                 max_position_embeddings=512),
}


def activation(name: str):
    """The activation function HF means by `name`."""
    try:
        return _ACTIVATIONS[name]
    except KeyError:
        raise ValueError(f"hidden_act: unsupported activation {name!r} (one of {sorted(_ACTIVATIONS)})") from None


@dataclass
class BertConfig:
    """BERT sizes under Hugging Face's config.json names."""

    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    pad_token_id: int = 0
    initializer_range: float = 0.02
    num_labels: int = 2
    id2label: dict[int, str] | None = None
    label2id: dict[str, int] | None = None
    classifier_dropout: float | None = None

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"hidden_size: {self.hidden_size} is not a multiple of "
                             f"num_attention_heads={self.num_attention_heads}")
        activation(self.hidden_act)
        if self.id2label is not None:
            self.id2label = {int(k): str(v) for k, v in self.id2label.items()}
            self.num_labels = len(self.id2label)
        else:
            self.id2label = {i: f"LABEL_{i}" for i in range(self.num_labels)}
        if self.label2id is None:
            self.label2id = {v: k for k, v in self.id2label.items()}
        else:
            self.label2id = {str(k): int(v) for k, v in self.label2id.items()}

    @classmethod
    def preset(cls, name: str, vocab_size: int, **overrides: Any) -> "BertConfig":
        """`tiny` / `small` / `base` sizes; any other field can be overridden."""
        if name not in _PRESETS:
            raise ValueError(f"preset: unknown BERT preset {name!r} (one of {sorted(_PRESETS)})")
        return cls(vocab_size=vocab_size, **{**_PRESETS[name], **overrides})

    def to_hf_dict(self) -> dict[str, Any]:
        """config.json content (without architectures, which depend on the head)."""
        d = dataclasses.asdict(self)
        d["id2label"] = {str(k): v for k, v in self.id2label.items()}
        d.pop("num_labels")  # HF derives it from id2label
        d["model_type"] = "bert"
        d["position_embedding_type"] = "absolute"
        d["tie_word_embeddings"] = True
        return d

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any]) -> "BertConfig":
        """Build from an HF config dict; keys we do not model are ignored."""
        if d.get("position_embedding_type", "absolute") != "absolute":
            raise ValueError(f"position_embedding_type: only 'absolute' is supported, got {d['position_embedding_type']!r}")
        names = {f.name for f in dataclasses.fields(cls)}
        kw = {k: v for k, v in d.items() if k in names}
        if kw.get("id2label") is not None and "num_labels" in kw and kw["num_labels"] != len(kw["id2label"]):
            kw.pop("num_labels")
        if kw.get("pad_token_id") is None:
            kw.pop("pad_token_id", None)
        return cls(**kw)


class BertEmbeddings(nn.Module):
    """Word + position + token type embeddings, LayerNorm, dropout.

    width: the embedding size (default hidden_size); ELECTRA embeds in a smaller E and projects to H after."""

    def __init__(self, config: BertConfig, width: int | None = None) -> None:
        super().__init__()
        e = width or config.hidden_size
        self.word_embeddings = nn.Embedding(config.vocab_size, e, padding_idx=config.pad_token_id)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, e)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, e)
        self.LayerNorm = nn.LayerNorm(e, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        # Sliced like HF does, so the exported graph keeps the shape onnxruntime's EmbedLayerNorm fusion expects.
        self.register_buffer("position_ids", torch.arange(config.max_position_embeddings).unsqueeze(0),
                             persistent=False)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor) -> torch.Tensor:
        seq_len = input_ids.size(1)
        position_ids = self.position_ids[:, :seq_len]
        x = (self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)
             + self.position_embeddings(position_ids))
        return self.dropout(self.LayerNorm(x))


class BertSelfAttention(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.head_dim = config.hidden_size // config.num_attention_heads
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.key = nn.Linear(config.hidden_size, config.hidden_size)
        self.value = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout = nn.Dropout(config.attention_probs_dropout_prob)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        # [B, S, hidden] -> [B, H, S, D]
        return x.view(x.size()[:-1] + (self.num_heads, self.head_dim)).permute(0, 2, 1, 3)

    def forward(self, hidden: torch.Tensor, additive_mask: torch.Tensor) -> torch.Tensor:
        q = self._heads(self.query(hidden))
        k = self._heads(self.key(hidden))
        v = self._heads(self.value(hidden))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_dim)
        probs = self.dropout(torch.softmax(scores + additive_mask, dim=-1))
        ctx = torch.matmul(probs, v).permute(0, 2, 1, 3).contiguous()
        return ctx.view(ctx.size()[:-2] + (self.num_heads * self.head_dim,))


class BertSelfOutput(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, hidden: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dropout(self.dense(hidden)) + residual)


class BertAttention(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.self = BertSelfAttention(config)
        self.output = BertSelfOutput(config)

    def forward(self, hidden: torch.Tensor, additive_mask: torch.Tensor) -> torch.Tensor:
        return self.output(self.self(hidden, additive_mask), hidden)


class BertIntermediate(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)
        self.act = activation(config.hidden_act)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.act(self.dense(hidden))


class BertOutput(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.intermediate_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, hidden: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dropout(self.dense(hidden)) + residual)


class BertLayer(nn.Module):
    """Post-LN encoder layer: attention + residual + LN, then FFN + residual + LN."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.attention = BertAttention(config)
        self.intermediate = BertIntermediate(config)
        self.output = BertOutput(config)

    def forward(self, hidden: torch.Tensor, additive_mask: torch.Tensor) -> torch.Tensor:
        attn = self.attention(hidden, additive_mask)
        return self.output(self.intermediate(attn), attn)


class BertEncoder(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(config) for _ in range(config.num_hidden_layers))

    def forward(self, hidden: torch.Tensor, additive_mask: torch.Tensor) -> torch.Tensor:
        for layer in self.layer:
            hidden = layer(hidden, additive_mask)
        return hidden


class BertPooler(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.dense(hidden[:, 0]))


class BertModel(nn.Module):
    """Embeddings + encoder (+ optional [CLS] pooler)."""

    def __init__(self, config: BertConfig, add_pooling_layer: bool = True) -> None:
        super().__init__()
        self.config = config
        self.embeddings = BertEmbeddings(config)
        self.encoder = BertEncoder(config)
        self.pooler = BertPooler(config) if add_pooling_layer else None
        self.apply(lambda m: init_weights(m, config.initializer_range))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """-> (last_hidden_state [B, S, hidden], pooled_output [B, hidden] or None without pooler)."""
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        hidden = self.embeddings(input_ids, token_type_ids)
        dtype = hidden.dtype
        # finfo.min rather than -inf: a fully padded row then softmaxes to uniform instead of NaN.
        additive = (1.0 - attention_mask[:, None, None, :].to(dtype)) * torch.finfo(dtype).min
        hidden = self.encoder(hidden, additive)
        pooled = self.pooler(hidden) if self.pooler is not None else None
        return hidden, pooled

    def states(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
               token_type_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """What every family's encoder answers (training/heads.py): here, forward itself."""
        return self(input_ids, attention_mask, token_type_ids)


class BertForSequenceClassification(PooledClassifier):
    """BERT + dropout + linear classifier on the pooled [CLS] vector."""

    prefix = "bert"
    pooler_path = "pooler.dense"

    def __init__(self, config: BertConfig) -> None:
        super().__init__(config, BertModel(config, add_pooling_layer=True), classifier_dropout(config))


class BertPredictionHeadTransform(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.act = activation(config.hidden_act)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.act(self.dense(hidden)))


class BertLMPredictionHead(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.transform = BertPredictionHeadTransform(config)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size, bias=True)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))
        # HF 5.x: decoder.bias IS cls.predictions.bias (both keys in the state dict, one tensor).
        self.decoder.bias = self.bias

    def forward(self, hidden: torch.Tensor, vocab_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Logits over the vocabulary, or over `vocab_ids` only (their rows of the decoder, in that order)."""
        h = self.transform(hidden)
        if vocab_ids is None:
            return self.decoder(h)
        return F.linear(h, self.decoder.weight[vocab_ids], self.bias[vocab_ids])


class BertOnlyMLMHead(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.predictions = BertLMPredictionHead(config)

    def forward(self, hidden: torch.Tensor, vocab_ids: torch.Tensor | None = None) -> torch.Tensor:
        return self.predictions(hidden, vocab_ids)


class BertPreTrainingHeads(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.predictions = BertLMPredictionHead(config)
        self.seq_relationship = nn.Linear(config.hidden_size, 2)


class _BertMLM:
    """Where BERT's MLM decoder and its shared bias live (`cls.predictions`)."""

    prefix = "bert"
    decoder_path = "cls.predictions.decoder"
    bias_path = "cls.predictions.bias"


class BertForMaskedLM(_BertMLM, MaskedLM):
    """BERT without pooler + MLM head tied to the word embeddings."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__(config, BertModel(config, add_pooling_layer=False))
        self.cls = BertOnlyMLMHead(config)
        self._init_head(self.cls)

    def mlm_head(self, hidden: torch.Tensor, vocab_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Logits over the vocabulary, or over `vocab_ids` only."""
        return self.cls(hidden, vocab_ids)


class BertForPreTraining(_BertMLM, PreTraining):
    """BERT with pooler + MLM head + 2-way sentence relationship head (NSP / SOP)."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__(config, BertModel(config, add_pooling_layer=True))
        self.cls = BertPreTrainingHeads(config)
        self._init_head(self.cls)

    def mlm_head(self, hidden: torch.Tensor, vocab_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Logits over the vocabulary, or over `vocab_ids` only."""
        return self.cls.predictions(hidden, vocab_ids)

    def pair_head(self, pooled: torch.Tensor) -> torch.Tensor:
        return self.cls.seq_relationship(pooled)


class BertForTokenClassification(TokenClassifier):
    """BERT without pooler + dropout + one linear classifier applied at every position (HF's layout)."""

    prefix = "bert"

    def __init__(self, config: BertConfig) -> None:
        super().__init__(config, BertModel(config, add_pooling_layer=False), classifier_dropout(config))
