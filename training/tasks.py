"""The three training tasks (MLM pre-training, sequence classification, causal LM).

A task owns its data, model and loss; the loop in trainer.py is shared. Batches are built for
the GLOBAL batch (identical on every rank) and the loss of a rank's rows is normalised by the
global count of loss positions, so the sum over ranks is the single-process loss.
"""
from __future__ import annotations

import json
import logging
import math
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from training import data as data_mod
from training.albert import AlbertConfig, AlbertForMaskedLM, AlbertForPreTraining
from training.bert import BertConfig, BertForMaskedLM, BertForPreTraining, init_weights
from training.checkpoint import checkpoint_kind, family_of_kind, load_model, save_model
from training.gpt import GPT2LMHeadModel, GPTConfig
from training.llama import LlamaConfig, LlamaForCausalLM
from training.roberta import RobertaConfig, RobertaForMaskedLM
from training.masking import IGNORE_INDEX, MaskingConfig, build_pairs, mask_tokens, non_special_ids
from training.metrics import classification_metrics, perplexity, topk_hits
from training.tokenizer import TOKENIZER_FILES, TokenizerInfo, copy_tokenizer_dir, load_tokenizer

log = logging.getLogger(__name__)
Batch = dict[str, torch.Tensor]


class Task(Protocol):
    name: str
    kind: str                 # load_model kind of the saved checkpoint
    eval_key: str             # metric that picks the best checkpoint
    higher_is_better: bool

    def num_examples(self) -> int: ...
    def build_model(self, resume: Path | None, dropout: float | None) -> nn.Module: ...
    def make_batch(self, indices: Sequence[int], seed: int) -> Batch: ...
    def loss(self, model: nn.Module, batch: Batch, rows: slice, label_smoothing: float) -> torch.Tensor:
        """This rank's share of the global-batch loss (the shares sum to the global mean)."""
    def evaluate(self, model: nn.Module, split: str, device: torch.device) -> dict[str, Any] | None: ...
    def save(self, model: nn.Module, out_dir: Path, extra_files: dict[str, bytes]) -> None: ...
    def summary(self) -> dict[str, Any]: ...


def _pad(seqs: Sequence[Sequence[int]], value: int) -> torch.Tensor:
    width = max(len(s) for s in seqs)
    out = torch.full((len(seqs), width), value, dtype=torch.long)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = torch.tensor(s, dtype=torch.long)
    return out


def _sample(items: list, n: int, seed: int) -> list:
    """A deterministic subset of at most n items (the evaluation cap), order kept."""
    if n <= 0 or len(items) <= n:
        return items
    keep = sorted(random.Random(seed).sample(range(len(items)), n))
    return [items[i] for i in keep]


def _tokenizer_files(info_dir: Path) -> dict[str, Path]:
    return {name: info_dir / name for name in TOKENIZER_FILES if (info_dir / name).is_file()}


@dataclass
class CorpusSplits:
    """Documents for pre-training: train, and held-out text for evaluation."""

    train: list[str]
    validation: list[str] = field(default_factory=list)
    test: list[str] = field(default_factory=list)
    source: str = "shakespeare"


def default_corpus() -> CorpusSplits:
    # The play split is the genre task's fixed one (not the run's seed): test plays stay unseen.
    texts = data_mod.pretraining_texts(data_mod.GenreDataConfig())
    return CorpusSplits(texts["train"], texts["validation"], texts["test"], "shakespeare (held-out plays)")


def user_corpus(paths: Sequence[str], holdout: float = 0.05, seed: int = 0) -> CorpusSplits:
    """User text files; a seeded 5% of the documents is held out for evaluation."""
    docs = data_mod.read_corpus(paths)
    idx = list(range(len(docs)))
    random.Random(seed).shuffle(idx)
    n_eval = int(len(docs) * holdout) if len(docs) >= 20 else 0
    held = sorted(idx[:n_eval])
    half = len(held) // 2
    held_set = set(held)
    return CorpusSplits(
        [docs[i] for i in range(len(docs)) if i not in held_set],
        [docs[i] for i in held[:half]], [docs[i] for i in held[half:]], "user files",
    )


# --------------------------------------------------------------------------- MLM

ENCODER_ARCHS = ("bert", "roberta", "albert")
# Pair objectives each family pre-trains with: RoBERTa dropped NSP (MLM only), ALBERT replaced it with SOP.
PAIR_OBJECTIVES = {"bert": ("none", "nsp", "sop"), "roberta": ("none",), "albert": ("none", "sop")}
DEFAULT_PAIR_OBJECTIVE = {"bert": "none", "roberta": "none", "albert": "sop"}
MLM_KINDS = ("bert-mlm", "bert-pretraining", "roberta-mlm", "albert-mlm", "albert-pretraining", "distilbert-mlm")


@dataclass
class MLMConfig:
    """Masked-LM pre-training of a BERT from a preset."""

    tokenizer: str
    corpus: list[str] = field(default_factory=list)  # empty: Shakespeare
    preset: str = "small"
    pair_objective: str = "none"  # none | nsp | sop
    arch: str = "bert"            # bert | roberta | albert
    max_length: int = 128
    eval_examples: int = 256
    masking: MaskingConfig = field(default_factory=MaskingConfig)
    # A pretrained encoder to continue from (its tokenizer is `tokenizer`); None: a new model from `preset`.
    init: str | None = None
    init_layers: int | None = None  # keep only the bottom N layers of `init` (None: all)
    # The training loss's softmax: "full" (the whole vocabulary) or "corpus" (only the token types that occur in
    # the training text: a tied WordPiece head of 30522 rows whose corpus uses 11809 of them costs 0.39x as much).
    # Evaluation always scores over the full vocabulary.
    softmax: str = "full"


# Held-out text is always masked like this (BERT's 15%, 80/10/10), whatever rate training uses, so figures of
# runs with different training masking compare.
EVAL_MASKING = MaskingConfig()


class MLMTask:
    name = "mlm"
    eval_key = "loss"
    higher_is_better = False
    head_prefixes: tuple[str, ...] = ()  # parameters of a fresh head on a pretrained body (trained at --head-lr)

    def __init__(self, cfg: MLMConfig, seed: int) -> None:
        self.cfg = cfg
        self.seed = seed
        if cfg.arch not in ENCODER_ARCHS:
            raise data_mod.DataError(f"arch: MLM pre-training takes one of {', '.join(ENCODER_ARCHS)}, got {cfg.arch!r}")
        if cfg.pair_objective not in PAIR_OBJECTIVES[cfg.arch]:
            raise data_mod.DataError(f"pair_objective: {cfg.arch} pre-trains with "
                                     f"{' or '.join(PAIR_OBJECTIVES[cfg.arch])}, not {cfg.pair_objective!r}")
        self.kind = f"{cfg.arch}-mlm" if cfg.pair_objective == "none" else f"{cfg.arch}-pretraining"
        if cfg.init is not None and checkpoint_kind(cfg.init) not in MLM_KINDS:
            self.head_prefixes = ("cls.", "lm_head.", "predictions.", "vocab_")  # a fresh head: --head-lr
        self.tok: TokenizerInfo = load_tokenizer(cfg.tokenizer)
        want = "roberta" if cfg.arch == "roberta" else "wordpiece"
        if self.tok.kind != want or self.tok.mask_id is None or self.tok.cls_id is None:
            raise data_mod.DataError(f"{cfg.tokenizer}: tokenizer: {cfg.arch} MLM needs a {want} tokenizer with "
                                     "cls/sep/mask tokens (python -m training tokenizer --kind " + want + ")")
        corpus = user_corpus(cfg.corpus, seed=seed) if cfg.corpus else default_corpus()
        self.corpus_source = corpus.source
        self.random_ids = non_special_ids(self.tok.vocab_size, self.tok.special_ids)
        self.train = self._examples(corpus.train, pairs=True)
        if not self.train:
            raise data_mod.DataError("corpus: no text to train on")
        # Held-out text is scored on plain chunks (MLM metrics), whatever the pair objective.
        self.held = {
            "validation": _sample(self._examples(corpus.validation, pairs=False), cfg.eval_examples, seed),
            "test": _sample(self._examples(corpus.test, pairs=False), cfg.eval_examples, seed + 1),
        }
        if cfg.softmax not in ("full", "corpus"):
            raise data_mod.DataError(f"softmax: expected 'full' or 'corpus', got {cfg.softmax!r}")
        # "corpus": the ids the training text uses (sorted) and full id -> their index (-1 elsewhere).
        self.softmax_ids: torch.Tensor | None = None
        self.softmax_index: torch.Tensor | None = None
        if cfg.softmax == "corpus":
            if cfg.arch != "bert":
                raise data_mod.DataError(f"softmax: 'corpus' is implemented for bert, not {cfg.arch}")
            seen = torch.zeros(self.tok.vocab_size, dtype=torch.bool)
            for a, b, _ in self.train:
                seen[torch.tensor(a + (b or []))] = True
            self.softmax_ids = torch.nonzero(seen).flatten()
            self.softmax_index = torch.full((self.tok.vocab_size,), -1, dtype=torch.long)
            self.softmax_index[self.softmax_ids] = torch.arange(len(self.softmax_ids))

    def _lines(self, docs: Sequence[str]) -> list[list[list[int]]]:
        out = []
        for doc in docs:
            lines = [ln for ln in doc.split("\n") if ln.strip()]
            encs = self.tok.tokenizer.encode_batch(lines, add_special_tokens=False)
            out.append([e.ids for e in encs if e.ids])
        return out

    def _examples(self, docs: Sequence[str], pairs: bool) -> list[tuple[list[int], list[int] | None, int]]:
        """(A ids, B ids or None, pair label) without special tokens."""
        if not docs:
            return []
        lines = self._lines(docs)
        if pairs and self.cfg.pair_objective != "none":
            ps = build_pairs(lines, self.cfg.pair_objective, self.cfg.max_length - 3, self.seed)
            return [(p.a, p.b, p.label) for p in ps]
        width = self.cfg.max_length - 2
        out = []
        for doc in lines:
            ids = [t for ln in doc for t in ln]
            for i in range(0, len(ids), width):
                chunk = ids[i:i + width]
                if len(chunk) >= 8:
                    out.append((chunk, None, 0))
        return out

    def num_examples(self) -> int:
        return len(self.train)

    def build_model(self, resume: Path | None, dropout: float | None) -> nn.Module:
        over = {} if dropout is None else {"hidden_dropout_prob": dropout, "attention_probs_dropout_prob": dropout}
        if resume is not None:
            model, _ = load_model(resume, kind=self.kind, **over)
            return model
        if self.cfg.init is not None:
            return self._from_pretrained(over)
        arch, pad = self.cfg.arch, self.tok.pad_id
        config_cls = {"bert": BertConfig, "roberta": RobertaConfig, "albert": AlbertConfig}[arch]
        preset_pos = config_cls.preset(self.cfg.preset, vocab_size=self.tok.vocab_size,
                                       pad_token_id=pad).max_position_embeddings
        # RoBERTa's positions start at pad + 1: its table needs max_length + pad + 1 rows.
        need = self.cfg.max_length + (pad + 1 if arch == "roberta" else 0)
        extra: dict[str, Any] = {"bos_token_id": self.tok.bos_id, "eos_token_id": self.tok.eos_id} \
            if arch == "roberta" else {}
        config = config_cls.preset(self.cfg.preset, vocab_size=self.tok.vocab_size, pad_token_id=pad,
                                   max_position_embeddings=max(preset_pos, need), **extra, **over)
        classes = {"bert-mlm": BertForMaskedLM, "bert-pretraining": BertForPreTraining,
                   "roberta-mlm": RobertaForMaskedLM, "albert-mlm": AlbertForMaskedLM,
                   "albert-pretraining": AlbertForPreTraining}
        return classes[self.kind](config)

    def _from_pretrained(self, over: dict[str, Any]) -> nn.Module:
        """The --init encoder under an MLM head: its own head if it has one, else a fresh head whose decoder is
        tied to the encoder's word embeddings and whose bias starts at the log unigram frequencies of the
        training text (the head then starts at the frequency baseline instead of uniform)."""
        init = self.cfg.init
        assert init is not None
        had_head = checkpoint_kind(init) in MLM_KINDS
        model, config = load_model(init, kind=self.kind, **over)
        n = self.cfg.init_layers
        if n is not None and n != config.num_hidden_layers:
            if self.cfg.arch != "bert" or not 0 < n < config.num_hidden_layers:
                raise data_mod.DataError(f"init_layers: {n} must be below the {config.num_hidden_layers} layers of "
                                         f"{init} (bert only)")
            # Measured on MiniLM: its top layers were tuned for sentence embeddings, and a step costs n/L as much.
            model.bert.encoder.layer = model.bert.encoder.layer[:n]
            config.num_hidden_layers = n
            log.info("%s: keeping the bottom %d encoder layers", init, n)
        if self.cfg.max_length > config.max_position_embeddings:
            raise data_mod.DataError(f"max_length: {self.cfg.max_length} exceeds the model's "
                                     f"{config.max_position_embeddings} positions")
        if not had_head:
            counts = torch.zeros(config.vocab_size)
            for a, b, _ in self.train:
                counts += torch.bincount(torch.tensor(a + (b or [])), minlength=config.vocab_size).float()
            bias = _mlm_bias(model)
            with torch.no_grad():
                bias.copy_(torch.log(counts + 0.1) - torch.log(counts.sum() + 0.1 * config.vocab_size))
            log.info("%s: fresh MLM head tied to the word embeddings, bias = log unigram frequencies", init)
        return model

    def _encode(self, examples: Sequence[tuple[list[int], list[int] | None, int]]) -> Batch:
        cls, sep = self.tok.cls_id, self.tok.sep_id
        ids, types = [], []
        for a, b, _ in examples:
            seq = [cls, *a, sep]
            tt = [0] * len(seq)
            if b is not None:
                seq += [*b, sep]
                tt += [1] * (len(b) + 1)
            ids.append(seq)
            types.append(tt)
        input_ids = _pad(ids, self.tok.pad_id)
        return {
            "input_ids": input_ids,
            "token_type_ids": _pad(types, 0),
            "attention_mask": _pad([[1] * len(s) for s in ids], 0),
            "pair_labels": torch.tensor([lab for _, _, lab in examples], dtype=torch.long),
        }

    def _masked(self, examples: Sequence[tuple[list[int], list[int] | None, int]], seed: int,
                masking: MaskingConfig | None = None) -> Batch:
        batch = self._encode(examples)
        ids = batch["input_ids"]
        maskable = batch["attention_mask"].bool() & ~torch.isin(ids, torch.tensor(self.tok.special_ids))
        gen = torch.Generator().manual_seed(seed)
        batch["input_ids"], batch["labels"] = mask_tokens(ids, maskable, self.tok.mask_id, self.random_ids,
                                                          masking or self.cfg.masking, gen)
        return batch

    def make_batch(self, indices: Sequence[int], seed: int) -> Batch:
        return self._masked([self.train[i] for i in indices], seed)

    def _masked_logits(self, model: nn.Module, b: Batch, vocab_ids: torch.Tensor | None = None
                       ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """MLM logits at the selected positions only ([n_selected, vocab], or [n_selected, len(vocab_ids)]: the
        "corpus" softmax, BERT's head only) and the pair logits.

        The vocab projection is the costliest layer; running it on the 15% selected positions
        instead of all of them saves about a third of a step.
        """
        hidden, pooled = model.encode(b["input_ids"], b["attention_mask"], b["token_type_ids"])
        selected = hidden[b["labels"] != IGNORE_INDEX]
        logits = model.mlm_head(selected) if vocab_ids is None else model.mlm_head(selected, vocab_ids)
        rel = model.pair_head(pooled) if hasattr(model, "pair_head") else None
        return logits, rel

    def loss(self, model: nn.Module, batch: Batch, rows: slice, label_smoothing: float) -> torch.Tensor:
        n_masked = (batch["labels"] != IGNORE_INDEX).sum().clamp(min=1)
        local = {k: v[rows] for k, v in batch.items()}
        targets = local["labels"][local["labels"] != IGNORE_INDEX]
        if self.softmax_ids is not None:   # "corpus": targets renumbered into the training text's token types
            logits, rel = self._masked_logits(model, local, self.softmax_ids.to(targets.device))
            targets = self.softmax_index.to(targets.device)[targets]
        else:
            logits, rel = self._masked_logits(model, local)
        loss = F.cross_entropy(logits, targets, reduction="sum", label_smoothing=label_smoothing) / n_masked
        if rel is not None:
            n = batch["pair_labels"].numel()
            loss = loss + F.cross_entropy(rel, local["pair_labels"], reduction="sum") / n
        return loss

    @torch.inference_mode()
    def evaluate(self, model: nn.Module, split: str, device: torch.device) -> dict[str, Any] | None:
        examples = self.held.get(split) or []
        if not examples:
            return None
        model.eval()
        nll, n, hits = 0.0, 0, {1: 0, 5: 0}
        bs = 64
        for start in range(0, len(examples), bs):
            # Fixed masks: the same positions are scored at every evaluation.
            b = self._masked(examples[start:start + bs], seed=10_007 + start, masking=EVAL_MASKING)
            b = {k: v.to(device) for k, v in b.items()}
            lg, _ = self._masked_logits(model, b)
            sel = b["labels"] != IGNORE_INDEX
            tg = b["labels"][sel]
            nll += float(F.cross_entropy(lg, tg, reduction="sum"))
            n += int(sel.sum())
            for k, v in topk_hits(lg, tg, (1, 5)).items():
                hits[k] += v
        return {"loss": nll / max(n, 1), "top1": hits[1] / max(n, 1), "top5": hits[5] / max(n, 1),
                "masked_tokens": n, "examples": len(examples)}

    def save(self, model: nn.Module, out_dir: Path, extra_files: dict[str, bytes]) -> None:
        save_model(model, out_dir, tokenizer_files=_tokenizer_files(self.tokenizer_copy), extra_files=extra_files)

    def summary(self) -> dict[str, Any]:
        return {"corpus": self.corpus_source, "train_examples": len(self.train),
                "heldout_examples": {k: len(v) for k, v in self.held.items()}, "arch": self.cfg.arch,
                "pair_objective": self.cfg.pair_objective, "vocab_size": self.tok.vocab_size,
                "init": self.cfg.init}

    tokenizer_copy: Path  # set by the trainer: a cleaned copy of the tokenizer dir


def _mlm_bias(model: nn.Module) -> nn.Parameter:
    """The output bias of an MLM head (per family, HF names)."""
    family = model.config.to_hf_dict()["model_type"]
    return {"bert": lambda: model.cls.predictions.bias, "roberta": lambda: model.lm_head.bias,
            "albert": lambda: model.predictions.bias, "distilbert": lambda: model.vocab_projector.bias}[family]()


def from_scratch_mlm(init: str | Path) -> bool:
    """True when `init` is an MLM checkpoint that `python -m training mlm` pre-trained from random weights
    (its training_args.json has no --init): fine-tuning it takes the "scratch" recipe, anything else (MiniLM,
    an MLM continued from it, any HF checkpoint) the "pretrained" one."""
    try:
        args = json.loads((Path(init) / "training_args.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(args, dict) and args.get("command") == "mlm" and not (args.get("task") or {}).get("init")


# --------------------------------------------------------------------------- classification


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


class ClassifyTask:
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
        held = {k: _sample(splits[k], cfg.eval_examples, seed) for k in ("validation", "test") if k in splits}
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

    def num_examples(self) -> int:
        return len(self.train)

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
            "input_ids": _pad([e[0] for e in examples], self.tok.pad_id),
            "token_type_ids": _pad([e[1] for e in examples], 0),
            "attention_mask": _pad([[1] * len(e[0]) for e in examples], 0),
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

    @torch.inference_mode()
    def evaluate(self, model: nn.Module, split: str, device: torch.device) -> dict[str, Any] | None:
        examples = self.held.get(split) or []
        if not examples:
            return None
        model.eval()
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

    def save(self, model: nn.Module, out_dir: Path, extra_files: dict[str, bytes]) -> None:
        save_model(model, out_dir, tokenizer_files=_tokenizer_files(self.tokenizer_copy), extra_files=extra_files)

    def summary(self) -> dict[str, Any]:
        s: dict[str, Any] = {"data": self.source, "labels": self.labels, "class_counts": self.class_counts,
                             "init": str(self.cfg.init), "arch": self.kind.rsplit("-", 1)[0]}
        if self.plays is not None:
            s["plays"] = self.plays
        if self.baseline is not None:
            s["majority_baseline_test"] = self.baseline
        return s

    tokenizer_copy: Path


def _counts(exs: Sequence[data_mod.Example]) -> dict[str, int]:
    out: dict[str, int] = {}
    for e in exs:
        out[e.label] = out.get(e.label, 0) + 1
    return dict(sorted(out.items()))


# --------------------------------------------------------------------------- causal LM


@dataclass
class LMConfig:
    """Causal LM pre-training of a GPT-2 from a preset."""

    tokenizer: str
    corpus: list[str] = field(default_factory=list)
    preset: str = "small"
    max_length: int = 128          # block size
    eval_blocks: int = 128
    arch: str = "gpt2"             # gpt2 | llama


LM_ARCHS = {"gpt2": "gpt", "llama": "llama"}


class LMTask:
    name = "lm"
    kind = "gpt"  # per instance: gpt | llama
    eval_key = "perplexity"
    higher_is_better = False

    def __init__(self, cfg: LMConfig, seed: int) -> None:
        self.cfg = cfg
        self.seed = seed
        if cfg.arch not in LM_ARCHS:
            raise data_mod.DataError(f"arch: the LM takes one of {', '.join(LM_ARCHS)}, got {cfg.arch!r}")
        self.kind = LM_ARCHS[cfg.arch]
        self.tok = load_tokenizer(cfg.tokenizer)
        if self.tok.kind != "bpe" or self.tok.eos_id is None:
            raise data_mod.DataError(f"{cfg.tokenizer}: tokenizer: the LM needs a byte-level BPE tokenizer "
                                     "with <|endoftext|>")
        corpus = user_corpus(cfg.corpus, seed=seed) if cfg.corpus else default_corpus()
        self.corpus_source = corpus.source
        self.train = self._blocks(corpus.train)
        if not self.train:
            raise data_mod.DataError(f"corpus: fewer than {cfg.max_length + 1} tokens to train on")
        self.held = {"validation": _sample(self._blocks(corpus.validation), cfg.eval_blocks, seed),
                     "test": _sample(self._blocks(corpus.test), cfg.eval_blocks, seed + 1)}

    def _blocks(self, docs: Sequence[str]) -> list[list[int]]:
        """Documents joined by <|endoftext|>, cut into blocks of max_length + 1 ids (inputs + next)."""
        if not docs:
            return []
        stream: list[int] = []
        for enc in self.tok.tokenizer.encode_batch(list(docs), add_special_tokens=False):
            stream += enc.ids
            stream.append(self.tok.eos_id)
        w = self.cfg.max_length + 1
        return [stream[i:i + w] for i in range(0, len(stream) - w + 1, self.cfg.max_length)]

    def num_examples(self) -> int:
        return len(self.train)

    def build_model(self, resume: Path | None, dropout: float | None) -> nn.Module:
        if self.kind == "llama":
            over = {} if dropout is None else {"attention_dropout": dropout}
            if resume is not None:
                return load_model(resume, kind="llama", **over)[0]
            preset_pos = LlamaConfig.preset(self.cfg.preset, vocab_size=self.tok.vocab_size).max_position_embeddings
            # Tied head: at this vocab/width the head would otherwise be a third of the parameters.
            lconfig = LlamaConfig.preset(
                self.cfg.preset, vocab_size=self.tok.vocab_size, tie_word_embeddings=True,
                max_position_embeddings=max(preset_pos, self.cfg.max_length),
                bos_token_id=self.tok.bos_id, eos_token_id=self.tok.eos_id, **over)
            return LlamaForCausalLM(lconfig)
        over = {} if dropout is None else {"resid_pdrop": dropout, "embd_pdrop": dropout, "attn_pdrop": dropout}
        if resume is not None:
            model, _ = load_model(resume, kind="gpt", **over)
            return model
        preset_pos = GPTConfig.preset(self.cfg.preset, vocab_size=self.tok.vocab_size).n_positions
        config = GPTConfig.preset(
            self.cfg.preset, vocab_size=self.tok.vocab_size, n_positions=max(preset_pos, self.cfg.max_length),
            bos_token_id=self.tok.bos_id, eos_token_id=self.tok.eos_id, **over,
        )
        return GPT2LMHeadModel(config)

    def make_batch(self, indices: Sequence[int], seed: int) -> Batch:
        return {"ids": torch.tensor([self.train[i] for i in indices], dtype=torch.long)}

    def _nll(self, model: nn.Module, ids: torch.Tensor, label_smoothing: float = 0.0) -> torch.Tensor:
        x, y = ids[:, :-1], ids[:, 1:]
        logits, _ = model(x, torch.ones_like(x))
        return F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="sum", label_smoothing=label_smoothing)

    def loss(self, model: nn.Module, batch: Batch, rows: slice, label_smoothing: float) -> torch.Tensor:
        ids = batch["ids"]
        n = ids.shape[0] * (ids.shape[1] - 1)
        return self._nll(model, ids[rows], label_smoothing) / n

    @torch.inference_mode()
    def evaluate(self, model: nn.Module, split: str, device: torch.device) -> dict[str, Any] | None:
        blocks = self.held.get(split) or []
        if not blocks:
            return None
        model.eval()
        nll, n = 0.0, 0
        for start in range(0, len(blocks), 32):
            ids = torch.tensor(blocks[start:start + 32], dtype=torch.long, device=device)
            nll += float(self._nll(model, ids))
            n += ids.shape[0] * (ids.shape[1] - 1)
        # Perplexity depends on the vocabulary; bits per character of the predicted text does not, so runs with
        # different tokenizers compare on it.
        chars = sum(len(t) for t in self.tok.tokenizer.decode_batch([b[1:] for b in blocks],
                                                                    skip_special_tokens=False))
        return {"loss": nll / n, "perplexity": perplexity(nll, n), "bits_per_char": nll / math.log(2) / max(chars, 1),
                "tokens": n, "chars": chars, "blocks": len(blocks)}

    def save(self, model: nn.Module, out_dir: Path, extra_files: dict[str, bytes]) -> None:
        save_model(model, out_dir, tokenizer_files=_tokenizer_files(self.tokenizer_copy), extra_files=extra_files)

    def summary(self) -> dict[str, Any]:
        return {"corpus": self.corpus_source, "train_blocks": len(self.train), "arch": self.cfg.arch,
                "heldout_blocks": {k: len(v) for k, v in self.held.items()}, "vocab_size": self.tok.vocab_size}

    tokenizer_copy: Path


def prepare_tokenizer_copy(task: Any, src: str | Path, work: Path, model_max_length: int | None) -> None:
    """Give the task a cleaned copy of its tokenizer (padding/truncation off) to ship in checkpoints."""
    task.tokenizer_copy = copy_tokenizer_dir(src, work, model_max_length)
