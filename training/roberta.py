"""RoBERTa: BERT's encoder with RoBERTa's embeddings and heads, under Hugging Face parameter names.

What differs from BERT (training/bert.py, whose encoder layers are reused unchanged):
- position ids count only non-pad tokens and start past the padding index
  (padding_idx + 1 + cumsum of non-pad), so a checkpoint has max_position_embeddings = max tokens + 2;
- token types are effectively unused: the tokenizer gives all zeros (real checkpoints have
  type_vocab_size 1), so the exported graph takes no token_type_ids input;
- no pooler; the classifier head is dense + tanh + out_proj on <s>, the MLM head has its own
  dense + LayerNorm (named `layer_norm`) and always uses exact GELU;
- pre-training is MLM only with dynamic masking (no NSP).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from training.bert import _PRESETS as _BERT_PRESETS
from training.bert import BertConfig, BertEncoder
from training.heads import MaskedLM, ProjectedClassifier, TokenClassifier, classifier_dropout
from training.weight_init import init_weights


@dataclass
class RobertaConfig(BertConfig):
    """BERT's fields with RoBERTa's defaults (pad 1, one token type, LayerNorm eps 1e-5)."""

    vocab_size: int = 50265
    max_position_embeddings: int = 514
    type_vocab_size: int = 1
    layer_norm_eps: float = 1e-5
    pad_token_id: int = 1
    bos_token_id: int | None = 0
    eos_token_id: int | None = 2

    @property
    def max_tokens(self) -> int:
        """Longest sequence the position table allows (positions start at pad_token_id + 1)."""
        return self.max_position_embeddings - self.pad_token_id - 1

    @classmethod
    def preset(cls, name: str, vocab_size: int, **overrides: Any) -> "RobertaConfig":
        """BERT's presets; the position table grows by pad + 1 so the same number of tokens fits."""
        if name not in _BERT_PRESETS:
            raise ValueError(f"preset: unknown RoBERTa preset {name!r} (one of {sorted(_BERT_PRESETS)})")
        base = dict(_BERT_PRESETS[name])
        pad = overrides.get("pad_token_id", 1)
        base["max_position_embeddings"] += pad + 1
        return cls(vocab_size=vocab_size, **{**base, **overrides})

    def to_hf_dict(self) -> dict[str, Any]:
        d = super().to_hf_dict()
        d["model_type"] = "roberta"
        return d


class RobertaEmbeddings(nn.Module):
    def __init__(self, config: RobertaConfig) -> None:
        super().__init__()
        self.padding_idx = config.pad_token_id
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size,
                                                padding_idx=config.pad_token_id)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None) -> torch.Tensor:
        # Pad tokens get position padding_idx (a zero row); real tokens padding_idx+1, +2, ... in order.
        # Computed from the ids (not the attention mask) exactly as HF does.
        real = input_ids.ne(self.padding_idx).long()
        position_ids = torch.cumsum(real, dim=1) * real + self.padding_idx
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        x = (self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)
             + self.position_embeddings(position_ids))
        return self.dropout(self.LayerNorm(x))


class RobertaModel(nn.Module):
    """Embeddings + BERT encoder; no pooler (neither HF head uses one)."""

    def __init__(self, config: RobertaConfig) -> None:
        super().__init__()
        self.config = config
        self.embeddings = RobertaEmbeddings(config)
        self.encoder = BertEncoder(config)
        self.apply(lambda m: init_weights(m, config.initializer_range))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        """-> last_hidden_state [B, S, hidden]."""
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        hidden = self.embeddings(input_ids, token_type_ids)
        dtype = hidden.dtype
        additive = (1.0 - attention_mask[:, None, None, :].to(dtype)) * torch.finfo(dtype).min
        return self.encoder(hidden, additive)

    def states(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
               token_type_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, None]:
        """What every family's encoder answers (training/heads.py): no pooled vector."""
        return self(input_ids, attention_mask, token_type_ids), None


class RobertaLMHead(nn.Module):
    """dense -> GELU (exact, whatever hidden_act says: HF hard-codes it) -> layer_norm -> decoder."""

    def __init__(self, config: RobertaConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))
        self.decoder.bias = self.bias

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.layer_norm(F.gelu(self.dense(hidden))))


class RobertaForMaskedLM(MaskedLM):
    prefix = "roberta"
    decoder_path = "lm_head.decoder"
    bias_path = "lm_head.bias"

    def __init__(self, config: RobertaConfig) -> None:
        super().__init__(config, RobertaModel(config))
        self.lm_head = RobertaLMHead(config)
        self._init_head(self.lm_head)

    def mlm_head(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)


class RobertaForSequenceClassification(ProjectedClassifier):
    """On the <s> vector: dropout -> dense -> tanh -> dropout -> out_proj (RoBERTa has no pooler)."""

    prefix = "roberta"

    def __init__(self, config: RobertaConfig) -> None:
        super().__init__(config, RobertaModel(config), torch.tanh)


class RobertaForTokenClassification(TokenClassifier):
    """RoBERTa + dropout + a linear classifier at every position (HF's layout: `classifier` is one Linear)."""

    prefix = "roberta"

    def __init__(self, config: RobertaConfig) -> None:
        super().__init__(config, RobertaModel(config), classifier_dropout(config))
