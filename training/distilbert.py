"""DistilBERT encoder and heads with Hugging Face parameter names.

A 6-layer student of BERT with its own names (q_lin/k_lin/v_lin/out_lin, sa_layer_norm, ffn.lin1/lin2,
output_layer_norm), no token type embeddings (so no token_type_ids input anywhere) and no pooler: the
classifier reads the [CLS] state through pre_classifier + ReLU. Loaded from HF checkpoints to be
fine-tuned, exported and served; we do not pre-train it (distillation needs a teacher).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from training.bert import activation
from training.heads import MaskedLM, SequenceClassifier, TokenClassifier
from training.weight_init import init_weights

# HF hard-codes this epsilon for every DistilBERT LayerNorm.
LN_EPS = 1e-12


@dataclass
class DistilBertConfig:
    """DistilBERT sizes under Hugging Face's config.json names."""

    vocab_size: int = 30522
    max_position_embeddings: int = 512
    sinusoidal_pos_embds: bool = False  # only how HF initialises the table; the weights are in the file
    n_layers: int = 6
    n_heads: int = 12
    dim: int = 768
    hidden_dim: int = 3072
    dropout: float = 0.1
    attention_dropout: float = 0.1
    activation: str = "gelu"
    initializer_range: float = 0.02
    qa_dropout: float = 0.1
    seq_classif_dropout: float = 0.2
    pad_token_id: int = 0
    num_labels: int = 2
    id2label: dict[int, str] | None = None
    label2id: dict[str, int] | None = None

    def __post_init__(self) -> None:
        if self.dim % self.n_heads:
            raise ValueError(f"dim: {self.dim} is not a multiple of n_heads={self.n_heads}")
        activation(self.activation)
        if self.id2label is not None:
            self.id2label = {int(k): str(v) for k, v in self.id2label.items()}
            self.num_labels = len(self.id2label)
        else:
            self.id2label = {i: f"LABEL_{i}" for i in range(self.num_labels)}
        if self.label2id is None:
            self.label2id = {v: k for k, v in self.id2label.items()}
        else:
            self.label2id = {str(k): int(v) for k, v in self.label2id.items()}

    # The names the rest of the code base uses for every encoder.
    @property
    def hidden_size(self) -> int:
        return self.dim

    @property
    def num_hidden_layers(self) -> int:
        return self.n_layers

    def to_hf_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["id2label"] = {str(k): v for k, v in self.id2label.items()}
        d.pop("num_labels")
        d["model_type"] = "distilbert"
        d["tie_word_embeddings"] = True
        return d

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any]) -> "DistilBertConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        kw = {k: v for k, v in d.items() if k in names}
        if kw.get("id2label") is not None and "num_labels" in kw and kw["num_labels"] != len(kw["id2label"]):
            kw.pop("num_labels")
        if kw.get("pad_token_id") is None:
            kw.pop("pad_token_id", None)
        return cls(**kw)


class Embeddings(nn.Module):
    def __init__(self, config: DistilBertConfig) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.dim, padding_idx=config.pad_token_id)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.dim)
        self.LayerNorm = nn.LayerNorm(config.dim, eps=LN_EPS)
        self.dropout = nn.Dropout(config.dropout)
        self.register_buffer("position_ids", torch.arange(config.max_position_embeddings).unsqueeze(0),
                             persistent=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        position_ids = self.position_ids[:, :input_ids.size(1)]
        return self.dropout(self.LayerNorm(self.word_embeddings(input_ids) + self.position_embeddings(position_ids)))


class MultiHeadSelfAttention(nn.Module):
    def __init__(self, config: DistilBertConfig) -> None:
        super().__init__()
        self.n_heads = config.n_heads
        self.head_dim = config.dim // config.n_heads
        self.q_lin = nn.Linear(config.dim, config.dim)
        self.k_lin = nn.Linear(config.dim, config.dim)
        self.v_lin = nn.Linear(config.dim, config.dim)
        self.out_lin = nn.Linear(config.dim, config.dim)
        self.dropout = nn.Dropout(config.attention_dropout)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(x.size()[:-1] + (self.n_heads, self.head_dim)).permute(0, 2, 1, 3)

    def forward(self, hidden: torch.Tensor, additive_mask: torch.Tensor) -> torch.Tensor:
        q, k, v = self._heads(self.q_lin(hidden)), self._heads(self.k_lin(hidden)), self._heads(self.v_lin(hidden))
        # Same eager shape as BERT (matmul, scale, additive mask, softmax, matmul).
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_dim)
        probs = self.dropout(torch.softmax(scores + additive_mask, dim=-1))
        ctx = torch.matmul(probs, v).permute(0, 2, 1, 3).contiguous()
        return self.out_lin(ctx.view(ctx.size()[:-2] + (self.n_heads * self.head_dim,)))


class FFN(nn.Module):
    def __init__(self, config: DistilBertConfig) -> None:
        super().__init__()
        self.lin1 = nn.Linear(config.dim, config.hidden_dim)
        self.lin2 = nn.Linear(config.hidden_dim, config.dim)
        self.act = activation(config.activation)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.lin2(self.act(self.lin1(x))))


class TransformerBlock(nn.Module):
    """Post-LN: attention + residual + sa_layer_norm, then FFN + residual + output_layer_norm."""

    def __init__(self, config: DistilBertConfig) -> None:
        super().__init__()
        self.attention = MultiHeadSelfAttention(config)
        self.sa_layer_norm = nn.LayerNorm(config.dim, eps=LN_EPS)
        self.ffn = FFN(config)
        self.output_layer_norm = nn.LayerNorm(config.dim, eps=LN_EPS)

    def forward(self, hidden: torch.Tensor, additive_mask: torch.Tensor) -> torch.Tensor:
        sa = self.sa_layer_norm(self.attention(hidden, additive_mask) + hidden)
        return self.output_layer_norm(self.ffn(sa) + sa)


class Transformer(nn.Module):
    def __init__(self, config: DistilBertConfig) -> None:
        super().__init__()
        self.layer = nn.ModuleList(TransformerBlock(config) for _ in range(config.n_layers))

    def forward(self, hidden: torch.Tensor, additive_mask: torch.Tensor) -> torch.Tensor:
        for layer in self.layer:
            hidden = layer(hidden, additive_mask)
        return hidden


class DistilBertModel(nn.Module):
    def __init__(self, config: DistilBertConfig) -> None:
        super().__init__()
        self.config = config
        self.embeddings = Embeddings(config)
        self.transformer = Transformer(config)
        self.apply(lambda m: init_weights(m, config.initializer_range))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """-> last_hidden_state [B, S, dim]."""
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        hidden = self.embeddings(input_ids)
        dtype = hidden.dtype
        additive = (1.0 - attention_mask[:, None, None, :].to(dtype)) * torch.finfo(dtype).min
        return self.transformer(hidden, additive)

    def states(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
               token_type_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, None]:
        """What every family's encoder answers (training/heads.py): token_type_ids ignored (DistilBERT has
        none), no pooled vector."""
        return self(input_ids, attention_mask), None


class DistilBertForSequenceClassification(SequenceClassifier):
    """[CLS] state -> pre_classifier -> ReLU -> dropout -> classifier. token_type_ids are accepted and ignored."""

    prefix = "distilbert"

    def __init__(self, config: DistilBertConfig) -> None:
        super().__init__(config, DistilBertModel(config))
        self.pre_classifier = nn.Linear(config.dim, config.dim)
        self.classifier = nn.Linear(config.dim, config.num_labels)
        self.dropout = nn.Dropout(config.seq_classif_dropout)
        for m in (self.pre_classifier, self.classifier):
            init_weights(m, config.initializer_range)

    def head(self, vec: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.dropout(torch.relu(self.pre_classifier(vec))))


class DistilBertForMaskedLM(MaskedLM):
    """vocab_transform -> activation -> vocab_layer_norm -> vocab_projector (weight tied to the embeddings)."""

    prefix = "distilbert"
    decoder_path = "vocab_projector"

    def __init__(self, config: DistilBertConfig) -> None:
        super().__init__(config, DistilBertModel(config))
        self.vocab_transform = nn.Linear(config.dim, config.dim)
        self.vocab_layer_norm = nn.LayerNorm(config.dim, eps=LN_EPS)
        self.vocab_projector = nn.Linear(config.dim, config.vocab_size)
        self.act = activation(config.activation)
        self._init_head(self.vocab_transform, self.vocab_layer_norm, self.vocab_projector)

    def mlm_head(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.vocab_projector(self.vocab_layer_norm(self.act(self.vocab_transform(hidden))))


class DistilBertForTokenClassification(TokenClassifier):
    """DistilBERT + dropout (config.dropout) + a linear classifier at every position (HF's layout)."""

    prefix = "distilbert"

    def __init__(self, config: DistilBertConfig) -> None:
        super().__init__(config, DistilBertModel(config), config.dropout)
