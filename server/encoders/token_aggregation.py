"""Per-token logits -> the entities a token-classification answer lists (pure numpy, no tokenizer inside).

The rules are those of transformers' token-classification pipeline, so a served answer equals
`pipeline("token-classification", aggregation_strategy=...)` on the same checkpoint and text:
- scores are the softmax of each token's logits; special tokens are skipped;
- `none`: every token with its best label (`index` = the token's position);
- `simple`: tokens grouped into entities: a token joins the group before it when its tag (the label without a
  `B-`/`I-` prefix) is the same and it is not a `B-`;
- `first` / `average` / `max`: sub-tokens are first merged into words (the first token's label, the mean of
  the tokens' scores, or the label of the single most confident token), then words are grouped as `simple` does;
- labels in `ignore_labels` (default `O`) are left out of the answer.
A token continues the word before it when the tokenizer is word-aware (its model has a continuing-subword prefix,
WordPiece's `##`: the token's text is longer than the characters it covers) or, for other tokenizers, when the
character before it is not a space (the pipeline's fallback). Offsets are character offsets (Unicode code points)
into the text, end exclusive.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple, Sequence

import numpy as np

from protos.results import TokenEntity   # the client's too (protos/results.py)
from server.protocol.errors import ServingError

STRATEGIES = ("none", "simple", "first", "average", "max")
DEFAULT_IGNORE = ("O",)
# Entities in one answer above which the doors build and encode it in a worker thread (a 1,024-text answer can hold
# one per token: seconds of Python the event loop would wait for).
INLINE_ENTITIES = 2048


@dataclass(frozen=True)
class TokenRow:
    """One text's tokens as the model saw them."""

    text: str
    ids: Sequence[int]
    tokens: Sequence[str]                 # the vocabulary strings of `ids`
    offsets: Sequence[tuple[int, int]]    # character span of each token in `text`
    special: Sequence[int]                # 1 for special tokens ([CLS], <s>, ...)


class _Piece(NamedTuple):   # a tuple: hundreds are made per request, and a frozen dataclass costs more to make
    token: str
    index: int          # the token's position in the sequence (its row of scores)
    start: int
    end: int
    is_subword: bool


class _Tagged(NamedTuple):   # a token or word with its label, before grouping (fields as TokenEntity's)
    label: str
    score: float
    word: str
    start: int
    end: int


def softmax(logits: np.ndarray) -> np.ndarray:
    """Row softmax in the logits' own precision (float32 from the graph), as the pipeline computes it."""
    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)


def check_strategy(strategy: str, field: str = "aggregation_strategy") -> str:
    s = (strategy or "none").lower()
    if s not in STRATEGIES:
        raise ServingError.invalid(field, f"must be one of {', '.join(STRATEGIES)}, got {strategy[:40]!r}")
    return s


def pieces(row: TokenRow, word_aware: bool, unk_id: int | None) -> list[_Piece]:
    """The non-special tokens with their spans and whether each continues the word before it."""
    out = []
    text = row.text
    for idx, (token_id, token, (start, end), special) in enumerate(zip(row.ids, row.tokens, row.offsets, row.special)):
        if special:
            continue
        if word_aware:
            is_subword = len(token) != end - start
        else:
            is_subword = start > 0 and " " not in text[start - 1:start + 1]
        if unk_id is not None and token_id == unk_id:
            token, is_subword = text[start:end], False
        out.append(_Piece(token, idx, start, end, is_subword))
    return out


def _tag(label: str) -> tuple[str, str]:
    if label.startswith("B-"):
        return "B", label[2:]
    if label.startswith("I-"):
        return "I", label[2:]
    return "I", label   # no B-/I- prefix: a continuation of the same label


class _Scores:
    """A row's softmax scores with each token's best label and its score, read once as Python numbers (the per-token
    work below is Python: numpy scalars there cost more than the arithmetic)."""

    def __init__(self, scores: np.ndarray) -> None:
        self.rows = scores
        self.best: list[int] = scores.argmax(axis=-1).tolist() if scores.size else []
        self.top: list[float] = scores.max(axis=-1).tolist() if scores.size else []


def _word(group: list[_Piece], strategy: str, s: _Scores, labels: Sequence[str],
          join: Callable[[list[str]], str]) -> TokenEntity:
    if strategy == "average":
        mean = np.nanmean(s.rows[[p.index for p in group]], axis=0)
        best = int(mean.argmax())
        score = float(mean[best])
    else:
        chosen = group[0] if strategy == "first" else max(group, key=lambda p: s.top[p.index])
        best, score = s.best[chosen.index], s.top[chosen.index]
    return TokenEntity(labels[best], score, join([p.token for p in group]), group[0].start, group[-1].end)


def _words(ps: list[_Piece], strategy: str, s: _Scores, labels: Sequence[str],
           join: Callable[[list[str]], str]) -> list[TokenEntity]:
    out: list[TokenEntity] = []
    group: list[_Piece] = []
    for p in ps:
        if group and not p.is_subword:
            out.append(_word(group, strategy, s, labels, join))
            group = []
        group.append(p)
    if group:
        out.append(_word(group, strategy, s, labels, join))
    return out


def _mean(values: list[float]) -> float:
    """np.nanmean of a few Python floats, without numpy: NaNs left out, NaN when nothing is left."""
    kept = [v for v in values if v == v]
    return sum(kept) / len(kept) if kept else float("nan")


def _grouped(entities: Sequence[TokenEntity | _Tagged], join: Callable[[list[str]], str],
             ignored: frozenset[str] | set[str] = frozenset()) -> list[TokenEntity]:
    """Adjacent entities of the same tag (not starting a new B-) merged: tag, mean score, decoded words. Groups
    whose tag is `ignored` are dropped unbuilt (the answer filters them anyway; decoding their words, often most
    of the text, was most of the work)."""
    def close(run: list[TokenEntity | _Tagged]) -> None:
        label = run[0].label.split("-", 1)[-1]
        if label in ignored:
            return
        score = run[0].score if len(run) == 1 else _mean([e.score for e in run])
        out.append(TokenEntity(label, score, join([e.word for e in run]), run[0].start, run[-1].end))

    out: list[TokenEntity] = []
    run: list[TokenEntity | _Tagged] = []
    run_tag = ""
    for e in entities:
        bi, tag = _tag(e.label)
        if run and tag == run_tag and bi != "B":
            run.append(e)
            continue
        if run:
            close(run)
        run, run_tag = [e], tag
    if run:
        close(run)
    return out


def aggregate(row: TokenRow, logits: np.ndarray, labels: Sequence[str], strategy: str,
              join: Callable[[list[str]], str], word_aware: bool, unk_id: int | None,
              ignore_labels: Sequence[str] = DEFAULT_IGNORE) -> list[TokenEntity]:
    """One text's entities from its logits [tokens, labels] (rows past len(row.ids) are ignored)."""
    s = _Scores(softmax(np.asarray(logits)[:len(row.ids)]))
    ps = pieces(row, word_aware, unk_id)
    ignored = set(ignore_labels)
    if strategy == "none":
        return [TokenEntity(label, s.top[p.index], p.token, p.start, p.end, p.index)
                for p in ps if (label := labels[s.best[p.index]]) not in ignored]
    if strategy == "simple":
        return _grouped([_Tagged(labels[s.best[p.index]], s.top[p.index], p.token, p.start, p.end)
                         for p in ps], join, ignored)
    return _grouped(_words(ps, strategy, s, labels, join), join, ignored)


def as_pipeline_dict(entity: TokenEntity, strategy: str) -> dict:
    """An entity under the pipeline's keys: `entity` and `index` for "none", `entity_group` for the others."""
    if strategy == "none":
        return {"entity": entity.label, "score": entity.score, "index": entity.index, "word": entity.word,
                "start": entity.start, "end": entity.end}
    return {"entity_group": entity.label, "score": entity.score, "word": entity.word, "start": entity.start,
            "end": entity.end}
