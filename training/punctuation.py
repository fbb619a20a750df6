"""Punctuation and capitalisation restoration data, labels taken from the corpus text itself.

Every scene of the Shakespeare corpus (the genre task's play split: test plays stay unseen) is cut into runs of
words. The model reads each word lowercased with its punctuation removed, and learns, per word, how the text
wrote it: its casing (lowercase or a capital first letter; the corpus' few all-capital words count as capitalised)
and the punctuation mark that follows it (comma, period, question or exclamation mark; `;`, `:` and dashes count
as a comma). A label is the two joined, e.g. `Cap+COMMA`; a lowercase word followed by no mark is `O`. The others carry a `B-` prefix in the
checkpoint, so that the pipeline's grouping (and the server's) keeps every word its own entity while showing the
bare tag (`Cap+COMMA`).

What the labels mean follows the corpus: verse capitalises the first word of every line, so "Cap" also marks
where a line of verse began.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field

from training import data as data_mod
from training.token_data import WordsExample

CASES = ("", "Cap")
MARKS = ("", "COMMA", "PERIOD", "QUESTION", "EXCLAIM")
_MARK_OF = {",": "COMMA", ";": "COMMA", ":": "COMMA", "-": "COMMA", ".": "PERIOD", "?": "QUESTION", "!": "EXCLAIM"}
_STRIP = "\"()[]{}`-_,.;:?!*&"   # not the apostrophe: 'tis and o' keep theirs


def tag(case: str, mark: str) -> str:
    """The bare tag of a casing and a mark ("" = none): O, Cap, COMMA, Cap+COMMA, ..."""
    return "+".join(x for x in (case, mark) if x) or "O"


LABELS = ["O"] + [f"B-{tag(c, m)}" for c in CASES for m in MARKS if c or m]


@dataclass(frozen=True)
class PunctuationConfig:
    words_per_example: int = 40
    genre: data_mod.GenreDataConfig = field(default_factory=data_mod.GenreDataConfig)


@dataclass(frozen=True)
class PunctuationData:
    splits: dict[str, list[WordsExample]]
    labels: tuple[str, ...]
    source: str


def word_label(raw: str) -> tuple[str, str] | None:
    """(the bare lowercased word, its label) of one whitespace-separated piece of text; None for a piece with no
    letter or digit (a lone dash)."""
    core = raw.strip(_STRIP)
    if not any(ch.isalnum() for ch in core):
        return None
    trailing = raw[len(raw) - len(raw.lstrip(_STRIP)) + len(core):]
    mark = next((_MARK_OF[ch] for ch in trailing if ch in _MARK_OF), "")
    letters = [ch for ch in core if ch.isalpha()]
    case = "Cap" if letters and letters[0].isupper() else ""   # (all capitals: 31 words of 540,000; as Cap)
    label = tag(case, mark)
    return core.lower(), (label if label == "O" else f"B-{label}")


def bare_text(text: str) -> str:
    """The text as the restorer is trained to read it: words lowercased, marks stripped (word_label's words)."""
    return " ".join(w for w, _ in (p for p in map(word_label, text.replace("--", " ").split()) if p is not None))


def examples_of(text: str, words_per_example: int, source: str) -> list[WordsExample]:
    """A document cut into runs of words_per_example words (the last run may be shorter)."""
    # "--" joins words in the corpus ("master?--O my"): a word boundary, the mark before it stays the word's
    pairs = [p for p in (word_label(w) for w in text.replace("--", " ").split()) if p is not None]
    out = []
    for i in range(0, len(pairs), words_per_example):
        run = pairs[i:i + words_per_example]
        out.append(WordsExample(tuple(w for w, _ in run), tuple(t for _, t in run), source))
    return out


def restore(words: list[str], labels: list[str]) -> str:
    """Words written back with their predicted casing and marks (the inverse of word_label)."""
    marks = {"COMMA": ",", "PERIOD": ".", "QUESTION": "?", "EXCLAIM": "!"}
    out = []
    for w, label in zip(words, labels):
        parts = label.removeprefix("B-").split("+")
        if "Cap" in parts:
            w = w[:1].upper() + w[1:]
        out.append(w + "".join(marks[p] for p in parts if p in marks))
    return " ".join(out)


def punctuation_data(config: PunctuationConfig | None = None, seed: int = 0) -> PunctuationData:
    """Train / validation / test examples from the corpus scenes of the genre split's plays (shuffled train)."""
    config = config or PunctuationConfig()
    texts = data_mod.pretraining_texts(config.genre)
    splits = {split: [e for i, doc in enumerate(docs) for e in examples_of(doc, config.words_per_example,
                                                                           f"{split} scene {i}")]
              for split, docs in texts.items()}
    random.Random(seed).shuffle(splits["train"])
    return PunctuationData(splits, tuple(LABELS), "shakespeare punctuation and casing (labels from the text; "
                                                  "held-out plays)")
