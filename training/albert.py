"""ALBERT encoder and heads with Hugging Face parameter names.

ALBERT's two parameter savings over BERT:
- factorized embeddings: tokens are embedded in a small space (embedding_size E), then projected to
  hidden_size H by `encoder.embedding_hidden_mapping_in` (V*E + E*H weights instead of V*H);
- cross-layer sharing: num_hidden_layers passes run through num_hidden_groups layer groups (1 by
  default: ONE set of layer weights reused at every depth).
Its pair objective is sentence-order prediction (SOP, training/masking.py), its MLM head projects H back
to E before the tied decoder. Attention is eager with a finfo.min additive mask, as in training/bert.py.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from training.bert import BertConfig, activation
from training.heads import MaskedLM, PooledClassifier, PreTraining, TokenClassifier
from training.weight_init import init_weights

_PRESETS: dict[str, dict[str, int]] = {
    # BERT's presets (training/bert.py) with E = H/2 (tiny, small) or ALBERT-base's 128.
    "tiny": dict(num_hidden_layers=2, hidden_size=64, embedding_size=32, num_attention_heads=2,
                 intermediate_size=128, max_position_embeddings=128),
    "small": dict(num_hidden_layers=4, hidden_size=256, embedding_size=128, num_attention_heads=4,
                  intermediate_size=1024, max_position_embeddings=256),
    "base": dict(num_hidden_layers=12, hidden_size=768, embedding_size=128, num_attention_heads=12,
                 intermediate_size=3072, max_position_embeddings=512),
}


@dataclass
class AlbertConfig(BertConfig):
    """BERT's fields plus ALBERT's, under HF's config.json names."""

    vocab_size: int = 30000
    embedding_size: int = 128
    num_hidden_groups: int = 1
    inner_group_num: int = 1
    hidden_act: str = "gelu_new"
    hidden_dropout_prob: float = 0.0
    attention_probs_dropout_prob: float = 0.0
    classifier_dropout_prob: float = 0.1

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 1 <= self.num_hidden_groups <= self.num_hidden_layers:
            raise ValueError(f"num_hidden_groups: must be in 1..num_hidden_layers={self.num_hidden_layers}, "
                             f"got {self.num_hidden_groups}")
        if self.inner_group_num < 1:
            raise ValueError(f"inner_group_num: must be >= 1, got {self.inner_group_num}")

    @classmethod
    def preset(cls, name: str, vocab_size: int, **overrides: Any) -> "AlbertConfig":
        if name not in _PRESETS:
            raise ValueError(f"preset: unknown ALBERT preset {name!r} (one of {sorted(_PRESETS)})")
        return cls(vocab_size=vocab_size, **{**_PRESETS[name], **overrides})

    def to_hf_dict(self) -> dict[str, Any]:
        d = super().to_hf_dict()
        d["model_type"] = "albert"
        d.pop("classifier_dropout", None)  # ALBERT's is classifier_dropout_prob
        return d


class AlbertEmbeddings(nn.Module):
    """Word + position + token type embeddings in the small space E, then LayerNorm."""

    def __init__(self, config: AlbertConfig) -> None:
        super().__init__()
        e = config.embedding_size
        self.word_embeddings = nn.Embedding(config.vocab_size, e, padding_idx=config.pad_token_id)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, e)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, e)
        self.LayerNorm = nn.LayerNorm(e, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.register_buffer("position_ids", torch.arange(config.max_position_embeddings).unsqueeze(0),
                             persistent=False)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor) -> torch.Tensor:
        position_ids = self.position_ids[:, :input_ids.size(1)]
        x = (self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)
             + self.position_embeddings(position_ids))
        return self.dropout(self.LayerNorm(x))


class AlbertAttention(nn.Module):
    """Self-attention with its output projection and post-LN inside (one module, as HF names it)."""

    def __init__(self, config: AlbertConfig) -> None:
        super().__init__()
        if config.hidden_size % config.num_attention_heads:
            raise ValueError(f"hidden_size: {config.hidden_size} is not a multiple of "
                             f"num_attention_heads={config.num_attention_heads}")
        self.num_heads = config.num_attention_heads
        self.head_dim = config.hidden_size // config.num_attention_heads
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.key = nn.Linear(config.hidden_size, config.hidden_size)
        self.value = nn.Linear(config.hidden_size, config.hidden_size)
        self.attention_dropout = nn.Dropout(config.attention_probs_dropout_prob)
        self.output_dropout = nn.Dropout(config.hidden_dropout_prob)
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(x.size()[:-1] + (self.num_heads, self.head_dim)).permute(0, 2, 1, 3)

    def forward(self, hidden: torch.Tensor, additive_mask: torch.Tensor) -> torch.Tensor:
        q, k, v = self._heads(self.query(hidden)), self._heads(self.key(hidden)), self._heads(self.value(hidden))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_dim)
        probs = self.attention_dropout(torch.softmax(scores + additive_mask, dim=-1))
        ctx = torch.matmul(probs, v).permute(0, 2, 1, 3).contiguous()
        ctx = ctx.view(ctx.size()[:-2] + (self.num_heads * self.head_dim,))
        return self.LayerNorm(hidden + self.output_dropout(self.dense(ctx)))


class AlbertLayer(nn.Module):
    def __init__(self, config: AlbertConfig) -> None:
        super().__init__()
        self.full_layer_layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.attention = AlbertAttention(config)
        self.ffn = nn.Linear(config.hidden_size, config.intermediate_size)
        self.ffn_output = nn.Linear(config.intermediate_size, config.hidden_size)
        self.act = activation(config.hidden_act)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, hidden: torch.Tensor, additive_mask: torch.Tensor) -> torch.Tensor:
        attn = self.attention(hidden, additive_mask)
        ffn = self.dropout(self.ffn_output(self.act(self.ffn(attn))))
        return self.full_layer_layer_norm(ffn + attn)


class AlbertLayerGroup(nn.Module):
    def __init__(self, config: AlbertConfig) -> None:
        super().__init__()
        self.albert_layers = nn.ModuleList(AlbertLayer(config) for _ in range(config.inner_group_num))

    def forward(self, hidden: torch.Tensor, additive_mask: torch.Tensor) -> torch.Tensor:
        for layer in self.albert_layers:
            hidden = layer(hidden, additive_mask)
        return hidden


class AlbertTransformer(nn.Module):
    """E -> H projection, then num_hidden_layers passes through the shared group(s)."""

    def __init__(self, config: AlbertConfig) -> None:
        super().__init__()
        self.config = config
        self.embedding_hidden_mapping_in = nn.Linear(config.embedding_size, config.hidden_size)
        self.albert_layer_groups = nn.ModuleList(AlbertLayerGroup(config) for _ in range(config.num_hidden_groups))

    def forward(self, hidden: torch.Tensor, additive_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.embedding_hidden_mapping_in(hidden)
        n, g = self.config.num_hidden_layers, self.config.num_hidden_groups
        for i in range(n):
            # Pass i uses group floor(i * G / L): with G = 1 every pass reuses the same weights.
            hidden = self.albert_layer_groups[i * g // n](hidden, additive_mask)
        return hidden


class AlbertModel(nn.Module):
    """Embeddings + shared-layer encoder (+ optional tanh pooler on [CLS], a plain Linear named `pooler`)."""

    def __init__(self, config: AlbertConfig, add_pooling_layer: bool = True) -> None:
        super().__init__()
        self.config = config
        self.embeddings = AlbertEmbeddings(config)
        self.encoder = AlbertTransformer(config)
        self.pooler = nn.Linear(config.hidden_size, config.hidden_size) if add_pooling_layer else None
        self.apply(lambda m: init_weights(m, config.initializer_range))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """-> (last_hidden_state [B, S, H], pooled [B, H] or None without pooler)."""
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        hidden = self.embeddings(input_ids, token_type_ids)
        dtype = hidden.dtype
        additive = (1.0 - attention_mask[:, None, None, :].to(dtype)) * torch.finfo(dtype).min
        hidden = self.encoder(hidden, additive)
        pooled = torch.tanh(self.pooler(hidden[:, 0])) if self.pooler is not None else None
        return hidden, pooled

    def states(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
               token_type_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """What every family's encoder answers (training/heads.py): here, forward itself."""
        return self(input_ids, attention_mask, token_type_ids)


class AlbertMLMHead(nn.Module):
    """H -> E (dense, activation, LayerNorm), then the decoder tied to the E-sized word embeddings."""

    def __init__(self, config: AlbertConfig) -> None:
        super().__init__()
        self.LayerNorm = nn.LayerNorm(config.embedding_size, eps=config.layer_norm_eps)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))
        self.dense = nn.Linear(config.hidden_size, config.embedding_size)
        self.decoder = nn.Linear(config.embedding_size, config.vocab_size)
        self.decoder.bias = self.bias
        self.act = activation(config.hidden_act)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.LayerNorm(self.act(self.dense(hidden))))


class AlbertSOPHead(nn.Module):
    def __init__(self, config: AlbertConfig) -> None:
        super().__init__()
        self.dropout = nn.Dropout(config.classifier_dropout_prob)
        self.classifier = nn.Linear(config.hidden_size, 2)

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.dropout(pooled))


class _AlbertMLM:
    """Where ALBERT's MLM decoder and its shared bias live (`predictions`, at the top level)."""

    prefix = "albert"
    decoder_path = "predictions.decoder"
    bias_path = "predictions.bias"
    predictions: AlbertMLMHead

    def mlm_head(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.predictions(hidden)


class AlbertForMaskedLM(_AlbertMLM, MaskedLM):
    def __init__(self, config: AlbertConfig) -> None:
        super().__init__(config, AlbertModel(config, add_pooling_layer=False))
        self.predictions = AlbertMLMHead(config)
        self._init_head(self.predictions)


class AlbertForPreTraining(_AlbertMLM, PreTraining):
    """MLM + sentence-order prediction."""

    def __init__(self, config: AlbertConfig) -> None:
        super().__init__(config, AlbertModel(config, add_pooling_layer=True))
        self.predictions = AlbertMLMHead(config)
        self.sop_classifier = AlbertSOPHead(config)
        self._init_head(self.sop_classifier, self.predictions)

    def pair_head(self, pooled: torch.Tensor) -> torch.Tensor:
        return self.sop_classifier(pooled)


class AlbertForSequenceClassification(PooledClassifier):
    """ALBERT + dropout (classifier_dropout_prob) + classifier on the pooled [CLS] vector (`pooler`: a Linear)."""

    prefix = "albert"
    pooler_path = "pooler"

    def __init__(self, config: AlbertConfig) -> None:
        super().__init__(config, AlbertModel(config, add_pooling_layer=True), config.classifier_dropout_prob)


class AlbertForTokenClassification(TokenClassifier):
    """ALBERT without pooler + dropout (classifier_dropout_prob) + a linear classifier at every position."""

    prefix = "albert"

    def __init__(self, config: AlbertConfig) -> None:
        p = config.classifier_dropout_prob if config.classifier_dropout_prob is not None else config.hidden_dropout_prob
        super().__init__(config, AlbertModel(config, add_pooling_layer=False), p)
