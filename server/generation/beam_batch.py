"""One step of many beam searches at once: BeamSearch.step's arithmetic over a [searches, ...] array per quantity.

A batch job's step holds tens of searches; stepping each alone is some forty small numpy calls a search, and on a
small vocabulary that Python and numpy overhead, not the decoder, was most of the worker thread (bench/FINDINGS.md).
Here every quantity of `BeamSearch.step` (the candidates' scores, the 2k best, the k that run on, the finished
hypotheses' normalised scores, the merge with those kept so far, whether any running one may still improve) is one
array over the searches, in the same float32 operations, so each search ends in the state its own `step` would
have left (tests/unit/test_beam_batch.py steps both side by side). What stays per search is its lists: the
hypotheses' tokens and log-probabilities, and the slot copies (`BeamSearch._reorder`).

Only searches whose step needs nothing else take this path (`batchable`): the same beam width and vocabulary, the
scores of every row given, no forced token at this step; the others step alone.
"""
from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from .scheduler import Copy


class BeamSearch(Protocol):
    """What a step reads and writes of a beams.BeamSearch (that module builds on this one)."""

    options: Any               # beams.BeamOptions
    vocab_size: int
    steps: int
    order: list[int]
    scores: np.ndarray
    tokens: list[list[int]]
    logprobs: list[list[float]]
    finished_scores: np.ndarray
    finished_flags: np.ndarray
    finished_tokens: list[list[int]]
    finished_logprobs: list[list[float]]
    improvable: bool
    stopped: bool

    def _reorder(self, parents: list[int], hypotheses: list[list[int]], logprobs: list[list[float]],
                 written: int) -> list[Copy]: ...

_NEG = np.float32(-1e9)    # beams._NEG: transformers' "not a candidate" score

Scored = dict[int, tuple[np.ndarray, np.ndarray]]   # beam index -> its row's best log-probabilities and ids


def batchable(search: BeamSearch, scored: Scored) -> bool:
    """Whether `search`'s step this iteration can run in `step_many`: its rows' scores are all there (beam 0's
    alone on its first step), at least 2k each, and no token is forced at this step."""
    k = search.options.num_beams
    beams = [0] if search.steps == 0 else range(k)
    return (search.options.forced.get(search.steps) is None and all(b in scored for b in beams)
            and all(len(scored[b][0]) >= 2 * k for b in beams))


def _stacked(searches: list[BeamSearch], scored: list[Scored], k: int, keep: int) -> tuple[np.ndarray, np.ndarray]:
    """values, tokens [searches, k, keep]: each search's hypotheses' best candidates in its running order (its
    first step: beam 0's row for every hypothesis, as BeamSearch.step reads it)."""
    rows = [s[0] if search.steps == 0 else s[b] for search, s in zip(searches, scored)
            for b in ([0] * k if search.steps == 0 else search.order)]
    values = np.stack([r[0][:keep] for r in rows]).reshape(len(searches), k, keep)
    tokens = np.stack([r[1][:keep] for r in rows]).reshape(len(searches), k, keep)
    return values, tokens


def _normalised(scores: np.ndarray, length: np.ndarray, penalty: np.ndarray) -> np.ndarray:
    """beams._normalised row by row: row i's scores / length[i] ** penalty[i], the same float32 division."""
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        denominators = np.power(np.asarray(length, np.float64), np.asarray(penalty, np.float64)).astype(np.float32)
        out = scores.astype(np.float32) / denominators[:, None]
    if not np.isnan(out).any():
        return out.astype(np.float32)
    return np.where(np.isnan(out), np.where(np.isneginf(scores), scores, np.float32(0)), out).astype(np.float32)


def _best(scores: np.ndarray, n: int) -> np.ndarray:
    """Per row, the indices of the n largest, best first, ties to the lower index (beams._top, row by row)."""
    return np.argsort(-scores, axis=1, kind="stable")[:, :n]


def step_many(searches: list[BeamSearch], written: list[int], scored: list[Scored]) -> list[list[Copy]]:
    """BeamSearch.step of each search (all `batchable`, one beam width and vocabulary), the arrays computed for all
    of them together. Returns each search's slot copies, in order."""
    first = searches[0]
    k, v = first.options.num_beams, first.vocab_size
    keep = 2 * k
    n = len(searches)
    values, tokens = _stacked(searches, scored, k, keep)
    flat = (np.arange(k)[:, None] * v + tokens).reshape(n, -1)
    by_index = np.argsort(flat, axis=1, kind="stable")
    flat = np.take_along_axis(flat, by_index, 1)
    running_scores = np.stack([s.scores for s in searches])
    scores = np.take_along_axis((values + running_scores[:, :, None]).reshape(n, -1), by_index, 1).astype(np.float32)
    best_of = _best(scores, keep)
    top_scores = np.take_along_axis(scores, best_of, 1)
    picked = np.take_along_axis(flat, best_of, 1)
    parent, token = picked // v, picked % v
    step_logprobs = np.take_along_axis(np.take_along_axis(values.reshape(n, -1), by_index, 1), best_of, 1)
    length = np.array([s.steps + 1 for s in searches])
    eos = np.array([-1 if s.options.eos_id is None else s.options.eos_id for s in searches])
    hits = (token == eos[:, None]) | (length >= np.array([s.options.max_new_tokens for s in searches]))[:, None]
    running = (top_scores + hits.astype(np.float32) * _NEG).astype(np.float32)
    chosen = _best(running, k)
    penalty = np.array([s.options.length_penalty for s in searches], np.float64)
    normalised = _normalised(top_scores, length, penalty)
    old_flags = np.stack([s.finished_flags for s in searches])
    early = np.array([s.options.early_stopping is True for s in searches])
    for mask in (old_flags.all(axis=1) & early, np.array([not s.improvable for s in searches])):
        if mask.any():
            normalised[mask] = normalised[mask] + _NEG
    just = hits & (np.arange(keep) < k)
    normalised = (normalised + (~just).astype(np.float32) * _NEG).astype(np.float32)
    merged = np.concatenate([np.stack([s.finished_scores for s in searches]), normalised], axis=1)
    best = _best(merged, k)
    finished_scores = np.take_along_axis(merged, best, 1)
    finished_flags = np.take_along_axis(np.concatenate([old_flags, just], axis=1), best, 1)
    kept_scores = np.take_along_axis(running, chosen, 1)
    copies = [_settle_lists(search, i, parent, token, step_logprobs, chosen, best, written[i])
              for i, search in enumerate(searches)]
    for i, search in enumerate(searches):
        search.finished_scores, search.finished_flags = finished_scores[i], finished_flags[i]
        search.scores = kept_scores[i]
        search.steps = int(length[i])
    improvable = _improvable(searches, penalty, kept_scores, finished_scores, finished_flags)
    stopped = ~improvable | (finished_flags.all(axis=1) & early) | hits.all(axis=1)
    for i, (search, more, ended) in enumerate(zip(searches, improvable.tolist(), stopped.tolist())):
        search.improvable, search.stopped = more, ended
        if ended:
            copies[i] = []
    return copies


def _settle_lists(search: BeamSearch, i: int, parent: np.ndarray, token: np.ndarray, step_logprobs: np.ndarray,
                  chosen: np.ndarray, best: np.ndarray, written: int) -> list[Copy]:
    """Search i's lists after the step (its finished hypotheses' tokens and log-probabilities, its running ones by
    beam) and its slot copies."""
    order = search.order
    candidates = [search.tokens[order[p]] + [t] for p, t in zip(parent[i].tolist(), token[i].tolist())]
    logprobs = [search.logprobs[order[p]] + [lp] for p, lp in zip(parent[i].tolist(), step_logprobs[i].tolist())]
    kept = best[i].tolist()
    merged_tokens = search.finished_tokens + candidates
    merged_logprobs = search.finished_logprobs + logprobs
    search.finished_tokens = [merged_tokens[j] for j in kept]
    search.finished_logprobs = [merged_logprobs[j] for j in kept]
    going = chosen[i].tolist()
    parents = parent[i].tolist()
    return search._reorder([parents[c] for c in going], [candidates[c] for c in going],
                           [logprobs[c] for c in going], written)


def _improvable(searches: list[BeamSearch], penalty: np.ndarray, scores: np.ndarray, finished_scores: np.ndarray,
                finished_flags: np.ndarray) -> np.ndarray:
    """Per search after its step (`scores` its running hypotheses' best first, the finished ones' scores and
    flags): whether its best running hypothesis may still beat its worst finished one, as BeamSearch.step's last
    test, and it still could before."""
    hypothetical = np.array([s.options.max_new_tokens if (s.options.early_stopping == "never"
                                                           and s.options.length_penalty > 0) else s.steps
                             for s in searches])
    best_possible = _normalised(scores[:, :1], hypothetical, penalty)[:, 0]
    worst = np.where(finished_flags, finished_scores.min(axis=1)[:, None], _NEG)
    better = (best_possible[:, None] > worst).any(axis=1)
    return np.array([s.improvable for s in searches]) & better
