"""ELECTRA encoder and heads with Hugging Face parameter names.

ELECTRA is BERT's encoder (training/bert.py's layers, reused unchanged) with two differences in the body:
- tokens are embedded in a space of size embedding_size E (word, position and token type tables, then
  LayerNorm, as BERT does) and, when E != hidden_size H, projected to H by `electra.embeddings_project`;
  with E == H there is no projection (and no such key in the file);
- there is no pooler.
Heads, under HF's names:
- ElectraForSequenceClassification (a fine-tuned discriminator): `classifier.dense` H -> H, exact GELU (HF
  hard-codes it, whatever hidden_act says), `classifier.out_proj` H -> labels, on the first token;
- ElectraForMaskedLM (the generator): `generator_predictions` (dense H -> E, exact GELU, LayerNorm on E), then
  `generator_lm_head` E -> vocab whose weight is the word embedding table (tied) and whose bias is its own.
Token types are real: the graph takes token_type_ids, like BERT's. We load ELECTRA checkpoints to fine-tune,
export and serve them; we do not pre-train one (replaced-token detection needs a generator and a
discriminator trained together). ElectraForPreTraining / ElectraModel files (what the released
discriminators are) are read as an encoder to start from: their discriminator head is dropped.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from training.bert import BertConfig, BertEmbeddings, BertEncoder
from training.heads import MaskedLM, ProjectedClassifier, TokenClassifier, classifier_dropout
from training.weight_init import init_weights


@dataclass
class ElectraConfig(BertConfig):
    """BERT's fields plus embedding_size, with HF's ElectraConfig defaults (ELECTRA-small's discriminator)."""

    embedding_size: int = 128
    hidden_size: int = 256
    num_attention_heads: int = 4
    intermediate_size: int = 1024

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.embedding_size < 1:
            raise ValueError(f"embedding_size: must be >= 1, got {self.embedding_size}")

    @property
    def projected(self) -> bool:
        """Whether the embeddings are projected E -> H (HF creates embeddings_project only then)."""
        return self.embedding_size != self.hidden_size

    def to_hf_dict(self) -> dict[str, Any]:
        d = super().to_hf_dict()
        d["model_type"] = "electra"
        return d


class ElectraModel(nn.Module):
    """E-sized BERT embeddings, the optional E -> H projection, BERT's encoder; no pooler."""

    def __init__(self, config: ElectraConfig) -> None:
        super().__init__()
        self.config = config
        self.embeddings = BertEmbeddings(config, width=config.embedding_size)
        self.embeddings_project = (nn.Linear(config.embedding_size, config.hidden_size)
                                   if config.projected else None)
        self.encoder = BertEncoder(config)
        self.apply(lambda m: init_weights(m, config.initializer_range))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        """-> last_hidden_state [B, S, H]."""
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        hidden = self.embeddings(input_ids, token_type_ids)
        if self.embeddings_project is not None:
            hidden = self.embeddings_project(hidden)
        dtype = hidden.dtype
        additive = (1.0 - attention_mask[:, None, None, :].to(dtype)) * torch.finfo(dtype).min
        return self.encoder(hidden, additive)

    def states(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
               token_type_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, None]:
        """What every family's encoder answers (training/heads.py): no pooled vector."""
        return self(input_ids, attention_mask, token_type_ids), None


class ElectraForSequenceClassification(ProjectedClassifier):
    """RoBERTa's head (dense, activation, out_proj on the first token) with GELU (exact) for tanh."""

    prefix = "electra"

    def __init__(self, config: ElectraConfig) -> None:
        super().__init__(config, ElectraModel(config), F.gelu)


class ElectraGeneratorPredictions(nn.Module):
    """H -> E: dense, GELU (exact, hard-coded by HF), LayerNorm on E."""

    def __init__(self, config: ElectraConfig) -> None:
        super().__init__()
        self.LayerNorm = nn.LayerNorm(config.embedding_size, eps=config.layer_norm_eps)
        self.dense = nn.Linear(config.hidden_size, config.embedding_size)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(F.gelu(self.dense(hidden)))


class ElectraForMaskedLM(MaskedLM):
    """The generator: generator_predictions, then generator_lm_head (weight tied to the word embeddings)."""

    prefix = "electra"
    decoder_path = "generator_lm_head"

    def __init__(self, config: ElectraConfig) -> None:
        super().__init__(config, ElectraModel(config))
        self.generator_predictions = ElectraGeneratorPredictions(config)
        self.generator_lm_head = nn.Linear(config.embedding_size, config.vocab_size)
        self._init_head(self.generator_predictions, self.generator_lm_head)

    def mlm_head(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.generator_lm_head(self.generator_predictions(hidden))


class ElectraForTokenClassification(TokenClassifier):
    """ELECTRA + dropout + a linear classifier at every position (HF's layout)."""

    prefix = "electra"

    def __init__(self, config: ElectraConfig) -> None:
        super().__init__(config, ElectraModel(config), classifier_dropout(config))
