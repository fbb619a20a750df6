"""Per-word labelled data for token classification: user JSONL files, and how words map onto sub-word tokens.

A file has one JSON object per line: `{"tokens": ["John", "lives", "in", "Paris"], "labels": ["B-PER", "O",
"O", "B-LOC"]}`, one label per word (BIO-style tags or plain labels alike: the label set is whatever the files
hold). Words are joined with single spaces into the text the model reads, so training sees exactly what a
served request of that text sees (the server tokenizes text, never pre-split words). Only the first sub-token
of a word carries its label; the other sub-tokens and the special tokens carry IGNORE (-100), as transformers'
token-classification examples do.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from tokenizers import Tokenizer

from training.errors import DataError
from training.userdata import jsonl_rows, read_data_file

IGNORE = -100


@dataclass(frozen=True)
class WordsExample:
    words: tuple[str, ...]
    labels: tuple[str, ...]
    source: str = ""

    @property
    def text(self) -> str:
        return " ".join(self.words)


@dataclass(frozen=True)
class AlignedExample:
    """Token ids with one label id per token (IGNORE off the first sub-token of a word), and how many of the
    example's words kept a labelled token within max_length."""

    ids: list[int]
    type_ids: list[int]
    labels: list[int]
    words_kept: int


def read_word_labels(path: str | Path, labels: Sequence[str] | None = None) -> list[WordsExample]:
    """Examples of a JSONL file with `tokens` and `labels`; DataError naming file:line and field otherwise."""
    p, raw = read_data_file(path)
    if p.suffix.lower() not in (".jsonl", ".json"):
        raise DataError(f"{p}: token-labelled data is JSONL (one object with 'tokens' and 'labels' per line)")
    known = set(labels) if labels is not None else None
    out: list[WordsExample] = []
    for lineno, row in jsonl_rows(p, raw):
        where = f"{p}:{lineno}"
        words, tags = row.get("tokens"), row.get("labels")
        if not isinstance(words, list) or not words:
            raise DataError(f"{where}: field 'tokens': missing or not a non-empty list of words")
        if not isinstance(tags, list) or len(tags) != len(words):
            raise DataError(f"{where}: field 'labels': must be a list of {len(words)} labels, one per token")
        for j, w in enumerate(words):
            if not isinstance(w, str) or not w or any(c.isspace() for c in w):
                raise DataError(f"{where}: field 'tokens[{j}]': must be a non-empty word without whitespace")
        for j, t in enumerate(tags):
            if isinstance(t, bool) or not isinstance(t, (str, int)) or not str(t).strip():
                raise DataError(f"{where}: field 'labels[{j}]': missing or not a string/integer")
            if known is not None and str(t).strip() not in known:
                raise DataError(f"{where}: field 'labels[{j}]': unknown label {str(t).strip()!r} "
                                f"(known: {', '.join(sorted(known))})")
        out.append(WordsExample(tuple(words), tuple(str(t).strip() for t in tags), where))
    if not out:
        raise DataError(f"{p}: file has no examples")
    return out


def word_label_set(train: Sequence[WordsExample], labels: Sequence[str] | None = None) -> list[str]:
    """--labels as given, else the train file's labels sorted with "O" (outside) first when present."""
    if labels:
        return list(labels)
    found = sorted({t for e in train for t in e.labels})
    return (["O"] + [t for t in found if t != "O"]) if "O" in found else found


def word_of_chars(words: Sequence[str]) -> list[int]:
    """For each character of " ".join(words), the index of its word (-1 on the separating spaces)."""
    out: list[int] = []
    for i, w in enumerate(words):
        if i:
            out.append(-1)
        out.extend([i] * len(w))
    return out


def token_words(offsets: Sequence[tuple[int, int]], special: Sequence[int], char_word: Sequence[int]) -> list[int]:
    """The word index of each token (-1: a special token, or one that covers no word character). A token whose
    offsets start on the space before its word (byte-level BPE without trimmed offsets) counts for that word."""
    out = []
    for (start, end), sp in zip(offsets, special):
        w = -1
        if not sp:
            for c in range(start, end):
                if 0 <= c < len(char_word) and char_word[c] >= 0:
                    w = char_word[c]
                    break
        out.append(w)
    return out


def align(tokenizer: Tokenizer, example: WordsExample, label_index: dict[str, int]) -> AlignedExample:
    """Encode the example's text (the tokenizer's own truncation applies) and label each word's first token."""
    enc = tokenizer.encode(example.text)
    words = token_words(enc.offsets, enc.special_tokens_mask, word_of_chars(example.words))
    labels, last = [], -1
    for w in words:
        if w >= 0 and w != last:
            labels.append(label_index[example.labels[w]])
        else:
            labels.append(IGNORE)
        if w >= 0:
            last = w
    return AlignedExample(list(enc.ids), list(enc.type_ids), labels, sum(1 for x in labels if x != IGNORE))


def majority_word_baseline(train: Sequence[WordsExample], golds: Sequence[int], labels: Sequence[str]) -> dict:
    """Every word given the train data's most frequent label, scored on `golds` (the label ids of the words the
    model is scored on): accuracy, macro-F1, per-class F1."""
    from training.metrics import classification_metrics

    counts: dict[str, int] = {}
    for e in train:
        for t in e.labels:
            counts[t] = counts.get(t, 0) + 1
    top = max(sorted(counts), key=lambda k: counts[k])
    out = classification_metrics([labels.index(top)] * len(golds), list(golds), labels)
    out["label"] = top
    return out
