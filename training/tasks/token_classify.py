"""Fine-tuning an encoder checkpoint (BERT, RoBERTa, ALBERT, DistilBERT, ELECTRA; ours or HF) as a per-token
classifier (`python -m training token-classify`): the HF *ForTokenClassification layout, one label per word on
its first sub-token (training/token_data.py), scored per word."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from training import data as data_mod
from training import token_data
from training.checkpoint import checkpoint_kind, family_of_kind, load_model
from training.metrics import classification_metrics
from training.tokenizer import load_tokenizer

from .base import Batch, HeldOutTask, pad_ids, sample_capped
from .classify import CLASSIFIER_FAMILIES

log = logging.getLogger(__name__)

TOKEN_CLASSIFIER_FAMILIES = CLASSIFIER_FAMILIES


@dataclass
class TokenClassifyConfig:
    init: str
    train: str | None = None        # None: the default data (punctuation and casing of the corpus)
    validation: str | None = None
    test: str | None = None
    labels: list[str] | None = None
    max_length: int = 128
    eval_examples: int = 1000


class TokenClassifyTask(HeldOutTask):
    name = "token-classify"
    kind = ""  # set in __init__: <family of --init>-token-classifier
    eval_key = "macro_f1"
    higher_is_better = True
    head_prefixes = ("classifier.",)   # --head-lr applies to the fresh per-token classifier

    def __init__(self, cfg: TokenClassifyConfig, seed: int) -> None:
        self.cfg = cfg
        self.seed = seed
        family = family_of_kind(checkpoint_kind(cfg.init))
        if family not in TOKEN_CLASSIFIER_FAMILIES:
            raise data_mod.DataError(f"{cfg.init}: init: token classification takes a "
                                     f"{', '.join(TOKEN_CLASSIFIER_FAMILIES)} checkpoint, got model_type {family!r}")
        self.kind = f"{family}-token-classifier"
        self.tok = load_tokenizer(cfg.init)
        if self.tok.kind == "bpe":
            raise data_mod.DataError(f"{cfg.init}: init: token classification needs an encoder tokenizer "
                                     "(WordPiece or RoBERTa's BPE)")
        splits, self.labels, self.source = self._splits(cfg)
        if len(self.labels) < 2:
            raise data_mod.DataError(f"{cfg.train}: field 'labels': need at least 2 labels, got {self.labels}")
        self.label_index = {lab: i for i, lab in enumerate(self.labels)}
        self.class_counts = {k: _counts(v) for k, v in splits.items()}
        tok = self.tok.tokenizer
        tok.enable_truncation(cfg.max_length)
        try:
            self.train = [token_data.align(tok, e, self.label_index) for e in splits["train"]]
            held = {k: sample_capped(splits[k], cfg.eval_examples, seed) for k in ("validation", "test") if k in splits}
            self.held = {k: [token_data.align(tok, e, self.label_index) for e in v] for k, v in held.items()}
        finally:
            tok.no_truncation()
        self.train = [r for r in self.train if r.words_kept]
        if not self.train:
            raise data_mod.DataError(f"{cfg.train}: no training example keeps a labelled word within max_length")
        self.baseline = None
        if self.held.get("test"):
            golds = [x for r in self.held["test"] for x in r.labels if x != token_data.IGNORE]
            self.baseline = token_data.majority_word_baseline(splits["train"], golds, self.labels)

    def _splits(self, cfg: TokenClassifyConfig) -> tuple[dict[str, list], list[str], str]:
        if cfg.train is None:
            if cfg.validation or cfg.test:
                raise data_mod.DataError("train: --validation/--test need --train")
            from training import punctuation
            data = punctuation.punctuation_data(punctuation.PunctuationConfig(), seed=self.seed)
            return data.splits, list(data.labels), data.source
        train = token_data.read_word_labels(cfg.train, cfg.labels)
        labels = token_data.word_label_set(train, cfg.labels)
        splits = {"train": train}
        for name in ("validation", "test"):
            path = getattr(cfg, name)
            if path:
                splits[name] = token_data.read_word_labels(path, labels)
        return splits, labels, "user files"

    def build_model(self, resume: Path | None, dropout: float | None) -> nn.Module:
        over: dict[str, Any] = {"num_labels": len(self.labels), "id2label": dict(enumerate(self.labels)),
                                "label2id": dict(self.label_index)}
        if dropout is not None:
            if self.kind.startswith("distilbert"):
                over.update(dropout=dropout, attention_dropout=dropout)
            else:
                over.update(hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
        model, config = load_model(resume or self.cfg.init, kind=self.kind, **over)
        limit = getattr(config, "max_tokens", config.max_position_embeddings)
        if self.cfg.max_length > limit:
            raise data_mod.DataError(f"max_length: {self.cfg.max_length} exceeds the model's {limit} positions "
                                     f"(max_position_embeddings={config.max_position_embeddings})")
        return model

    def _encode(self, rows: Sequence[token_data.AlignedExample]) -> Batch:
        return {
            "input_ids": pad_ids([r.ids for r in rows], self.tok.pad_id),
            "token_type_ids": pad_ids([r.type_ids for r in rows], 0),
            "attention_mask": pad_ids([[1] * len(r.ids) for r in rows], 0),
            "labels": pad_ids([r.labels for r in rows], token_data.IGNORE),
        }

    def make_batch(self, indices: Sequence[int], seed: int) -> Batch:
        return self._encode([self.train[i] for i in indices])

    def loss(self, model: nn.Module, batch: Batch, rows: slice, label_smoothing: float) -> torch.Tensor:
        # Normalised by the GLOBAL batch's labelled words, so the ranks' shares sum to the batch mean.
        n = int((batch["labels"] != token_data.IGNORE).sum())
        local = {k: v[rows] for k, v in batch.items()}
        logits = model.token_head(model.encode(local["input_ids"], local["attention_mask"], local["token_type_ids"]))
        return F.cross_entropy(logits.flatten(0, 1), local["labels"].flatten(), ignore_index=token_data.IGNORE,
                               reduction="sum", label_smoothing=label_smoothing) / max(n, 1)

    def score(self, model: nn.Module, rows: list, device: torch.device) -> dict[str, Any]:
        preds: list[int] = []
        golds: list[int] = []
        nll = 0.0
        order = sorted(range(len(rows)), key=lambda i: len(rows[i].ids))
        for start in range(0, len(order), 64):
            b = {k: v.to(device) for k, v in self._encode([rows[i] for i in order[start:start + 64]]).items()}
            logits = model(b["input_ids"], b["attention_mask"], b["token_type_ids"])
            keep = b["labels"] != token_data.IGNORE
            nll += float(F.cross_entropy(logits[keep], b["labels"][keep], reduction="sum"))
            preds += logits.argmax(-1)[keep].tolist()
            golds += b["labels"][keep].tolist()
        out = classification_metrics(preds, golds, self.labels)
        out["loss"] = nll / max(len(golds), 1)
        out["words"] = out.pop("examples")
        return out

    def summary(self) -> dict[str, Any]:
        s: dict[str, Any] = {"data": self.source, "labels": self.labels, "class_counts": self.class_counts,
                             "init": str(self.cfg.init), "arch": self.kind.split("-", 1)[0],
                             "unit": "word (its first sub-token)"}
        if self.baseline is not None:
            s["majority_baseline_test"] = self.baseline
        return s


def _counts(exs: Sequence[token_data.WordsExample]) -> dict[str, int]:
    out: dict[str, int] = {}
    for e in exs:
        for t in e.labels:
            out[t] = out.get(t, 0) + 1
    return dict(sorted(out.items()))
