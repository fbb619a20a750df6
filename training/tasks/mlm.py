"""Masked-LM pre-training of a BERT, RoBERTa or ALBERT encoder (with NSP / SOP pair objectives), from a preset
or continued from a pretrained encoder (`python -m training mlm`)."""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from training import data as data_mod
from training.albert import AlbertConfig, AlbertForMaskedLM, AlbertForPreTraining
from training.bert import BertConfig, BertForMaskedLM, BertForPreTraining
from training.checkpoint import checkpoint_kind, load_model
from training.masking import IGNORE_INDEX, MaskingConfig, build_pairs, mask_tokens, non_special_ids
from training.metrics import topk_hits
from training.roberta import RobertaConfig, RobertaForMaskedLM
from training.tokenizer import TokenizerInfo, load_tokenizer

from .base import Batch, HeldOutTask, default_corpus, pad_ids, sample_capped, user_corpus

log = logging.getLogger(__name__)

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


class MLMTask(HeldOutTask):
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
            "validation": sample_capped(self._examples(corpus.validation, pairs=False), cfg.eval_examples, seed),
            "test": sample_capped(self._examples(corpus.test, pairs=False), cfg.eval_examples, seed + 1),
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
        input_ids = pad_ids(ids, self.tok.pad_id)
        return {
            "input_ids": input_ids,
            "token_type_ids": pad_ids(types, 0),
            "attention_mask": pad_ids([[1] * len(s) for s in ids], 0),
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

    def score(self, model: nn.Module, examples: list, device: torch.device) -> dict[str, Any]:
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

    def summary(self) -> dict[str, Any]:
        return {"corpus": self.corpus_source, "train_examples": len(self.train),
                "heldout_examples": {k: len(v) for k, v in self.held.items()}, "arch": self.cfg.arch,
                "pair_objective": self.cfg.pair_objective, "vocab_size": self.tok.vocab_size,
                "init": self.cfg.init}


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
