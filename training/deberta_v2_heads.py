"""DeBERTa-v2 / v3 task heads under Hugging Face's names, over training/deberta_v2.py's encoder (`deberta.`):

- DebertaV2ForSequenceClassification: `pooler.dense` (HF's ContextPooler) on the first token + pooler_hidden_act,
  dropout, `classifier` (both top-level, not under `deberta.`);
- DebertaV2ForTokenClassification: `classifier` at every position;
- DebertaV2ForMaskedLM in both of transformers' layouts, chosen by config `legacy` as transformers chooses:
  legacy (its default) `cls.predictions` (transform H -> E, LayerNorm, decoder tied to the word embeddings, bias),
  or the enhanced-mask decoder's `lm_predictions.lm_head` (dense H -> H, LayerNorm, product with the word
  embeddings, bias).
"""
from __future__ import annotations

import torch
from torch import nn

from training.bert import activation
from training.deberta_v2 import DebertaV2Config, DebertaV2Model, act
from training.heads import MaskedLM, SequenceClassifier, TokenClassifier
from training.weight_init import init_weights


class ContextPooler(nn.Module):
    """HF's ContextPooler on the first token's vector: dropout, dense, pooler_hidden_act."""

    def __init__(self, config: DebertaV2Config) -> None:
        super().__init__()
        self.dense = nn.Linear(config.pooler_hidden_size, config.pooler_hidden_size)
        self.dropout = nn.Dropout(config.pooler_dropout)
        self.act = act(config.pooler_hidden_act)

    def forward(self, vec: torch.Tensor) -> torch.Tensor:
        return self.act(self.dense(self.dropout(vec)))


class DebertaV2ForSequenceClassification(SequenceClassifier):
    """`pooler` (ContextPooler) on the first token, dropout (cls_dropout, else hidden_dropout_prob), `classifier`."""

    prefix = "deberta"

    def __init__(self, config: DebertaV2Config) -> None:
        super().__init__(config, DebertaV2Model(config))
        self.pooler = ContextPooler(config)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.dropout = nn.Dropout(config.hidden_dropout_prob if config.cls_dropout is None else config.cls_dropout)
        for part in (self.pooler, self.classifier):
            part.apply(lambda m: init_weights(m, config.initializer_range))

    def head(self, vec: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.dropout(self.pooler(vec)))


class DebertaV2ForTokenClassification(TokenClassifier):
    """DeBERTa + dropout (hidden_dropout_prob) + a linear `classifier` at every position."""

    prefix = "deberta"

    def __init__(self, config: DebertaV2Config) -> None:
        super().__init__(config, DebertaV2Model(config), config.hidden_dropout_prob)


class LegacyPredictionHeadTransform(nn.Module):
    """cls.predictions.transform: dense H -> E, hidden_act, LayerNorm on E."""

    def __init__(self, config: DebertaV2Config) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.embedding_size)
        self.act = activation(config.hidden_act)
        self.LayerNorm = nn.LayerNorm(config.embedding_size, eps=config.layer_norm_eps)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.act(self.dense(hidden)))


class LegacyLMPredictionHead(nn.Module):
    """cls.predictions: transform, then `decoder` E -> vocab (its weight the word embeddings, its bias `bias`)."""

    def __init__(self, config: DebertaV2Config) -> None:
        super().__init__()
        self.transform = LegacyPredictionHeadTransform(config)
        self.decoder = nn.Linear(config.embedding_size, config.vocab_size)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))
        self.decoder.bias = self.bias

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.transform(hidden))


class LegacyOnlyMLMHead(nn.Module):
    def __init__(self, config: DebertaV2Config) -> None:
        super().__init__()
        self.predictions = LegacyLMPredictionHead(config)


class EnhancedLMHead(LegacyPredictionHeadTransform):
    """lm_predictions.lm_head: the same dense (H -> H here: E == H), hidden_act, LayerNorm, then the product with the
    word embeddings, + bias."""

    def __init__(self, config: DebertaV2Config) -> None:
        super().__init__(config)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def forward(self, hidden: torch.Tensor, word_embeddings: torch.Tensor) -> torch.Tensor:
        return torch.matmul(super().forward(hidden), word_embeddings.t()) + self.bias


class EnhancedOnlyMLMHead(nn.Module):
    def __init__(self, config: DebertaV2Config) -> None:
        super().__init__()
        self.lm_head = EnhancedLMHead(config)


class DebertaV2ForMaskedLM(MaskedLM):
    """The MLM head transformers builds for this config: `cls.predictions` when legacy, else `lm_predictions`."""

    prefix = "deberta"
    decoder_path = "cls.predictions.decoder"
    bias_path = "cls.predictions.bias"

    def __init__(self, config: DebertaV2Config) -> None:
        if config.legacy and not config.tie_word_embeddings:
            raise ValueError("tie_word_embeddings: false (an untied cls.predictions.decoder) is not supported")
        if not config.legacy and config.embedding_size != config.hidden_size:
            raise ValueError("embedding_size: the lm_predictions head (legacy false) needs embedding_size == "
                             "hidden_size (transformers multiplies H-wide states by the E-wide word embeddings)")
        super().__init__(config, DebertaV2Model(config))
        if config.legacy:
            self.cls = LegacyOnlyMLMHead(config)
            self._init_head(self.cls)
        else:
            self.lm_predictions = EnhancedOnlyMLMHead(config)
            self.lm_predictions.apply(lambda m: init_weights(m, config.initializer_range))

    def tie_weights(self) -> None:
        if self.config.legacy:
            super().tie_weights()

    def mlm_head(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.config.legacy:
            return self.cls.predictions(hidden)
        return self.lm_predictions.lm_head(hidden, self.deberta.embeddings.word_embeddings.weight)


def normalise_hf_keys(sd: dict[str, torch.Tensor], model: nn.Module) -> dict[str, torch.Tensor]:
    """HF-named weights -> what `model` loads: the keys transformers ignores on load dropped (the absolute position
    table of a model that does not add one, v3's replaced-token-detection head `mask_predictions.*`); a masked
    LM whose file holds the other head layout than config `legacy` names is refused (it would load a fresh head)."""
    config = model.config
    out = {k: v for k, v in sd.items()
           if not k.startswith("mask_predictions.")
           and not (not config.position_biased_input and k.endswith("embeddings.position_embeddings.weight"))}
    if isinstance(model, DebertaV2ForMaskedLM):
        other = "lm_predictions." if config.legacy else "cls.predictions."
        if any(k.startswith(other) for k in out):
            raise ValueError(f"legacy: config says {str(config.legacy).lower()}, but the weights hold the "
                             f"{other}* head (set legacy to {str(not config.legacy).lower()})")
    return out
