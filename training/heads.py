"""The task heads the five BERT-family encoders share (training/bert.py, roberta.py, albert.py, distilbert.py,
electra.py), each under its family's Hugging Face parameter names.

A headed model keeps its encoder under HF's prefix (`prefix`: "bert", "roberta", ...), so its state dict keys
are HF's. What differs between the families is given to the constructor (the encoder, the dropout, the
classifier's activation) or named by a class attribute (the pooler inside the encoder, the tied decoder and
its bias). Every family's encoder answers `states(input_ids, attention_mask, token_type_ids)` ->
(last hidden state [B, S, H], pooled [B, H] or None).

The training tasks call the parts separately: `encode` then `head` (training/tasks/classify.py),
`token_head` (token_classify.py), `mlm_head` and, for pre-training, `pair_head` (mlm.py).
"""
from __future__ import annotations

from typing import Any, Callable, ClassVar

import torch
from torch import nn

from training.weight_init import init_weights


def classifier_dropout(config: Any) -> float:
    """HF's rule: classifier_dropout when set, else hidden_dropout_prob."""
    return config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob


class EncoderHeadModel(nn.Module):
    """An encoder under HF's prefix and the config; the heads are the subclasses'."""

    prefix: ClassVar[str]

    def __init__(self, config: Any, encoder: nn.Module) -> None:
        super().__init__()
        self.config = config
        setattr(self, self.prefix, encoder)

    @property
    def body(self) -> nn.Module:
        """The encoder (`self.bert`, `self.roberta`, ...)."""
        return getattr(self, self.prefix)

    def states(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
               token_type_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self.body.states(input_ids, attention_mask, token_type_ids)


class _OnHiddenStates(EncoderHeadModel):
    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
               token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        """-> last hidden state [B, S, H]."""
        return self.states(input_ids, attention_mask, token_type_ids)[0]


class _DropoutLinear(_OnHiddenStates):
    """Dropout + one linear `classifier` H -> num_labels (BERT's and ALBERT's sentence head, every token head)."""

    def __init__(self, config: Any, encoder: nn.Module, dropout: float) -> None:
        super().__init__(config, encoder)
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        init_weights(self.classifier, config.initializer_range)


class SequenceClassifier(_OnHiddenStates):
    """Sentence logits through `head` from the first token's state; the head is the family's."""

    def head(self, vec: torch.Tensor) -> torch.Tensor:
        """Logits from one [B, H] vector (the first token's state; training also feeds a mean-pooled one)."""
        raise NotImplementedError

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        """-> logits [B, num_labels]."""
        return self.head(self.encode(input_ids, attention_mask, token_type_ids)[:, 0])


class PooledClassifier(SequenceClassifier, _DropoutLinear):
    """BERT, ALBERT: dropout + linear `classifier` on the encoder's tanh pooler over [CLS]."""

    pooler_path: ClassVar[str]  # the pooler's Linear inside the encoder

    def head(self, vec: torch.Tensor) -> torch.Tensor:
        """Logits from one [B, H] vector: pooler dense + tanh, dropout, classifier."""
        pooler = self.body.get_submodule(self.pooler_path)
        return self.classifier(self.dropout(torch.tanh(pooler(vec))))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        """-> logits [B, num_labels]."""
        _, pooled = self.states(input_ids, attention_mask, token_type_ids)
        return self.classifier(self.dropout(pooled))


class ClassificationHead(nn.Module):
    """RoBERTa's and ELECTRA's (no pooler): dropout -> dense -> activation -> dropout -> out_proj."""

    def __init__(self, config: Any, activation: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout = nn.Dropout(classifier_dropout(config))
        self.out_proj = nn.Linear(config.hidden_size, config.num_labels)
        self.activation = activation

    def forward(self, vec: torch.Tensor) -> torch.Tensor:
        return self.out_proj(self.dropout(self.activation(self.dense(self.dropout(vec)))))


class ProjectedClassifier(SequenceClassifier):
    """RoBERTa, ELECTRA: `classifier` is a ClassificationHead on the first token's state."""

    def __init__(self, config: Any, encoder: nn.Module, activation: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__(config, encoder)
        self.classifier = ClassificationHead(config, activation)
        self.classifier.apply(lambda m: init_weights(m, config.initializer_range))

    def head(self, vec: torch.Tensor) -> torch.Tensor:
        return self.classifier(vec)


class TokenClassifier(_DropoutLinear):
    """Dropout + one linear `classifier` applied at every position (HF's *ForTokenClassification)."""

    def token_head(self, hidden: torch.Tensor) -> torch.Tensor:
        """Per-position logits from [..., H] states."""
        return self.classifier(self.dropout(hidden))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        """-> logits [B, S, num_labels]."""
        return self.token_head(self.encode(input_ids, attention_mask, token_type_ids))


class MaskedLM(EncoderHeadModel):
    """A masked-LM head whose vocabulary projection (`decoder_path`) has the word embeddings as its weight.

    bias_path: the head parameter that IS the decoder's bias (HF's layout: both keys in the state dict, one
    tensor), or None where the decoder keeps its own bias (DistilBERT, ELECTRA)."""

    decoder_path: ClassVar[str]
    bias_path: ClassVar[str | None] = None

    def _init_head(self, *parts: nn.Module) -> None:
        """HF's init of the head's parts (in this order), a zero shared bias, then the tying."""
        for part in parts:
            part.apply(lambda m: init_weights(m, self.config.initializer_range))
        if self.bias_path is not None:
            with torch.no_grad():
                self.get_parameter(self.bias_path).zero_()
        self.tie_weights()

    def tie_weights(self) -> None:
        decoder = self.get_submodule(self.decoder_path)
        decoder.weight = self.body.embeddings.word_embeddings.weight
        if self.bias_path is not None:
            decoder.bias = self.get_parameter(self.bias_path)

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
               token_type_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """-> (last hidden state [B, S, H], pooled [B, H] or None)."""
        return self.states(input_ids, attention_mask, token_type_ids)

    def mlm_head(self, hidden: torch.Tensor) -> torch.Tensor:
        """Vocabulary logits from [..., H] states (the MLM task calls it on the selected positions only)."""
        raise NotImplementedError

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        """-> logits [B, S, vocab]."""
        return self.mlm_head(self.encode(input_ids, attention_mask, token_type_ids)[0])


class PreTraining(MaskedLM):
    """The masked LM plus a 2-way sentence relationship head on the pooled vector (BERT's NSP, ALBERT's SOP)."""

    def pair_head(self, pooled: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (mlm_logits [B, S, vocab], pair logits [B, 2])."""
        hidden, pooled = self.encode(input_ids, attention_mask, token_type_ids)
        return self.mlm_head(hidden), self.pair_head(pooled)
