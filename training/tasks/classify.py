"""Fine-tuning an encoder checkpoint (BERT, RoBERTa, ALBERT, DistilBERT, ELECTRA; ours or HF) as a sequence
classifier (`python -m training classify`)."""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from training import data as data_mod
from training.checkpoint import checkpoint_kind, family_of_kind, load_model
from training.metrics import classification_metrics
from training.tokenizer import load_tokenizer
from training.weight_init import init_weights

from .base import Batch, HeldOutTask, pad_ids, sample_capped
from .mlm import MLM_KINDS

log = logging.getLogger(__name__)

@dataclass
class ClassifyConfig:
    """Fine-tuning a BERT checkpoint (ours or any HF BERT dir) as a sequence classifier."""

    init: str
    train: str | None = None        # None: the default genre data
    validation: str | None = None
    test: str | None = None
    labels: list[str] | None = None
    max_length: int = 128
    eval_examples: int = 1000
    # A pooler the init checkpoint lacks (MLM checkpoints have none) can start as tanh(identity)
    # instead of a 0.02-std random matrix (small outputs, slow head); measured no better here.
    pooler_init: str = "random"     # random (HF) | identity | auto (identity when missing)
    # Weight of an auxiliary loss on the mean of the token states (through the same pooler and
    # classifier); it teaches the encoder genre features fast while [CLS] learns to gather them.
    # Training only: the saved model is the standard [CLS]-pooled BertForSequenceClassification.
    mean_pool_aux: float = 1.0
    # Re-initialise the top N encoder layers before fine-tuning (Zhang et al. 2021, "Revisiting
    # few-sample BERT fine-tuning"). -1 = auto: all layers when --init is an MLM checkpoint whose own
    # metrics.json shows it never got past predicting token frequencies (held-out top-1 below
    # PLATEAU_TOP1): measured, such an encoder keeps the classifier at the majority class for 200
    # steps, while fresh layers on its embeddings learn. 0 for any other checkpoint (e.g. MiniLM).
    reinit_layers: int = -1


PLATEAU_TOP1 = 0.2


def plateaued_mlm(init: str | Path) -> float | None:
    """Held-out top-1 of one of our MLM checkpoints if it is below PLATEAU_TOP1, else None."""
    from training.checkpoint import CheckpointError
    try:
        if checkpoint_kind(init) not in MLM_KINDS:
            return None
    except CheckpointError:
        return None
    f = Path(init) / "metrics.json"
    try:
        top1 = json.loads(f.read_text())["test"]["top1"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return float(top1) if isinstance(top1, (int, float)) and top1 < PLATEAU_TOP1 else None


CLASSIFIER_FAMILIES = ("bert", "roberta", "albert", "distilbert", "electra")


def _encoder_layers(model: nn.Module) -> list[nn.Module]:
    """The encoder's layer modules, bottom first (ALBERT: its shared layer group(s))."""
    family = model.config.to_hf_dict()["model_type"]
    enc = getattr(model, family)
    return list({"bert": lambda: enc.encoder.layer, "roberta": lambda: enc.encoder.layer,
                 "electra": lambda: enc.encoder.layer,
                 "albert": lambda: enc.encoder.albert_layer_groups,
                 "distilbert": lambda: enc.transformer.layer}[family]())


def _pooler_dense(model: nn.Module) -> nn.Linear:
    """The hidden x hidden Linear the classifier head applies first."""
    family = model.config.to_hf_dict()["model_type"]
    return {"bert": lambda: model.bert.pooler.dense, "roberta": lambda: model.classifier.dense,
            "albert": lambda: model.albert.pooler, "distilbert": lambda: model.pre_classifier,
            "electra": lambda: model.classifier.dense}[family]()


class ClassifyTask(HeldOutTask):
    name = "classify"
    kind = "bert-classifier"  # per instance: <family of --init>-classifier
    eval_key = "macro_f1"
    higher_is_better = True

    def __init__(self, cfg: ClassifyConfig, seed: int) -> None:
        self.cfg = cfg
        self.seed = seed
        family = family_of_kind(checkpoint_kind(cfg.init))
        if family not in CLASSIFIER_FAMILIES:
            raise data_mod.DataError(f"{cfg.init}: init: classification takes a {', '.join(CLASSIFIER_FAMILIES)} "
                                     f"checkpoint, got model_type {family!r}")
        self.kind = f"{family}-classifier"
        self.tok = load_tokenizer(cfg.init)
        if self.tok.kind == "bpe":
            raise data_mod.DataError(f"{cfg.init}: init: classification needs an encoder tokenizer with a "
                                     "cls token (WordPiece or RoBERTa's BPE)")
        self.baseline: dict[str, Any] | None = None
        self.class_counts: dict[str, dict[str, int]] = {}
        self.plays: dict[str, list[str]] | None = None
        if cfg.train is None:
            if cfg.validation or cfg.test:
                raise data_mod.DataError("train: --validation/--test need --train")
            g = data_mod.genre_data(data_mod.GenreDataConfig())
            self.labels = list(g.labels)
            splits = g.splits
            self.plays = g.plays
            self.source = "shakespeare genre (First Folio sections), split by play"
        else:
            train = data_mod.read_labelled(cfg.train, cfg.labels)
            self.labels = data_mod.label_set(train, cfg.labels)
            splits = {"train": train}
            for name in ("validation", "test"):
                path = getattr(cfg, name)
                if path:
                    splits[name] = data_mod.read_labelled(path, self.labels)
            self.source = "user files"
        if len(self.labels) < 2:
            raise data_mod.DataError(f"{cfg.train}: field 'label': need at least 2 labels, got {self.labels}")
        self.class_counts = {k: _counts(v) for k, v in splits.items()}
        self.label_index = {lab: i for i, lab in enumerate(self.labels)}
        self.train = self._encode_examples(splits["train"])
        held = {k: sample_capped(splits[k], cfg.eval_examples, seed) for k in ("validation", "test") if k in splits}
        self.held = {k: self._encode_examples(v) for k, v in held.items()}
        if "test" in held:  # on the same (possibly capped) test examples the model is scored on
            self.baseline = data_mod.majority_baseline(splits["train"], held["test"], self.labels)

    def _encode_examples(self, exs: Sequence[data_mod.Example]) -> list[tuple[list[int], list[int], int]]:
        tok = self.tok.tokenizer
        tok.enable_truncation(self.cfg.max_length)
        try:
            inputs = [(e.text, e.text_pair) if e.text_pair else e.text for e in exs]
            encs = tok.encode_batch(inputs)
        finally:
            tok.no_truncation()
        return [(e.ids, e.type_ids, self.label_index[x.label]) for e, x in zip(encs, exs)]

    def build_model(self, resume: Path | None, dropout: float | None) -> nn.Module:
        over: dict[str, Any] = {
            "num_labels": len(self.labels),
            "id2label": {i: lab for i, lab in enumerate(self.labels)},
            "label2id": dict(self.label_index),
        }
        if dropout is not None:
            over.update(hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
        if dropout is not None and self.kind == "distilbert-classifier":
            over = {k: v for k, v in over.items() if "dropout" not in k}
            over.update(dropout=dropout, attention_dropout=dropout)
        model, config = load_model(resume or self.cfg.init, kind=self.kind, **over)
        # A head the init checkpoint lacks (an MLM checkpoint has no pooler / classifier) starts fresh.
        fresh_pooler = checkpoint_kind(self.cfg.init) in MLM_KINDS and checkpoint_kind(self.cfg.init) not in (
            "bert-pretraining", "albert-pretraining")
        layers = _encoder_layers(model)
        n_reinit = self.cfg.reinit_layers
        if n_reinit < 0:
            top1 = plateaued_mlm(self.cfg.init)
            n_reinit = len(layers) if top1 is not None else 0
            if n_reinit and resume is None:
                log.warning("%s: held-out MLM top-1 %.3f < %.2f (token-frequency plateau): re-initialising all "
                            "%d encoder layers, keeping the embeddings (--reinit-layers 0 keeps them all)",
                            self.cfg.init, top1, PLATEAU_TOP1, n_reinit)
        if resume is None and n_reinit > 0:
            if n_reinit > len(layers):
                raise data_mod.DataError(f"reinit_layers: {n_reinit} exceeds the model's {len(layers)} layers")
            for layer in layers[len(layers) - n_reinit:]:
                layer.apply(lambda m: init_weights(m, config.initializer_range))
        if resume is None and (self.cfg.pooler_init == "identity" or (self.cfg.pooler_init == "auto" and fresh_pooler)):
            dense = _pooler_dense(model)
            with torch.no_grad():
                dense.weight.copy_(torch.eye(config.hidden_size))
                dense.bias.zero_()
        limit = getattr(config, "max_tokens", config.max_position_embeddings)
        if self.cfg.max_length > limit:
            raise data_mod.DataError(f"max_length: {self.cfg.max_length} exceeds the model's {limit} positions "
                                     f"(max_position_embeddings={config.max_position_embeddings})")
        return model

    def _encode(self, examples: Sequence[tuple[list[int], list[int], int]]) -> Batch:
        return {
            "input_ids": pad_ids([e[0] for e in examples], self.tok.pad_id),
            "token_type_ids": pad_ids([e[1] for e in examples], 0),
            "attention_mask": pad_ids([[1] * len(e[0]) for e in examples], 0),
            "labels": torch.tensor([e[2] for e in examples], dtype=torch.long),
        }

    def make_batch(self, indices: Sequence[int], seed: int) -> Batch:
        return self._encode([self.train[i] for i in indices])

    def loss(self, model: nn.Module, batch: Batch, rows: slice, label_smoothing: float) -> torch.Tensor:
        n = batch["labels"].numel()
        local = {k: v[rows] for k, v in batch.items()}
        mask = local["attention_mask"]
        hidden = model.encode(local["input_ids"], mask, local["token_type_ids"])
        logits = model.head(hidden[:, 0])
        loss = F.cross_entropy(logits, local["labels"], reduction="sum", label_smoothing=label_smoothing) / n
        if self.cfg.mean_pool_aux > 0:
            m = mask[..., None].to(hidden.dtype)
            mean = (hidden * m).sum(1) / m.sum(1).clamp(min=1)
            aux = model.head(mean)
            loss = loss + self.cfg.mean_pool_aux * F.cross_entropy(
                aux, local["labels"], reduction="sum", label_smoothing=label_smoothing) / n
        return loss

    def score(self, model: nn.Module, examples: list, device: torch.device) -> dict[str, Any]:
        # Length-sorted batches waste less padding; predictions are put back in order.
        order = sorted(range(len(examples)), key=lambda i: len(examples[i][0]))
        preds = [0] * len(examples)
        nll = 0.0
        for start in range(0, len(order), 64):
            idx = order[start:start + 64]
            b = {k: v.to(device) for k, v in self._encode([examples[i] for i in idx]).items()}
            logits = model(b["input_ids"], b["attention_mask"], b["token_type_ids"])
            nll += float(F.cross_entropy(logits, b["labels"], reduction="sum"))
            for i, p in zip(idx, logits.argmax(-1).tolist()):
                preds[i] = p
        out = classification_metrics(preds, [e[2] for e in examples], self.labels)
        out["loss"] = nll / len(examples)
        return out

    def summary(self) -> dict[str, Any]:
        s: dict[str, Any] = {"data": self.source, "labels": self.labels, "class_counts": self.class_counts,
                             "init": str(self.cfg.init), "arch": self.kind.rsplit("-", 1)[0]}
        if self.plays is not None:
            s["plays"] = self.plays
        if self.baseline is not None:
            s["majority_baseline_test"] = self.baseline
        return s


def _counts(exs: Sequence[data_mod.Example]) -> dict[str, int]:
    out: dict[str, int] = {}
    for e in exs:
        out[e.label] = out.get(e.label, 0) + 1
    return dict(sorted(out.items()))
