"""One step of many beam searches at once: transformers' selection as array operations over [searches, ...].

Every search of an iteration with the same number of beams k steps in the same few numpy calls (beams.py gathers
their state into the arrays of `Before` and hands each its row of `After`): each search's 2k best candidates over
its k hypotheses' 2k best tokens (ties to the lower hypothesis, then the lower token), the k best unfinished ones
that run on, the finished ones merged with the k best finished so far, and whether each search may stop. The rules
are those of transformers' `_beam_search` (generation/utils.py, 5.x), row by row as beams.py's docstring gives
them; a row's arithmetic is the same float32 arithmetic whether it steps alone or beside others, so a search's
hypotheses do not depend on what else is running.

`assign_beams` then places each search's new hypotheses in its beams' slots: a hypothesis stays in its parent's
beam unless a better one took it, and the others take the beams whose hypotheses were dropped (with a copy of the
parent's cache rows).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

NEG = np.float32(-1e9)    # transformers' "not a candidate" score


@dataclass(frozen=True)
class Before:
    """The searches' state before the step (S searches of k beams; hypothesis order: best first)."""

    values: np.ndarray          # [S, k, >= 2k] float32: each hypothesis's best log-probabilities, best first
    tokens: np.ndarray          # [S, k, >= 2k] int64: their token ids
    scores: np.ndarray          # [S, k] float32: each running hypothesis's summed log-probabilities
    finished_scores: np.ndarray  # [S, k] float32: the k best finished so far (NEG where none), best first
    finished_flags: np.ndarray  # [S, k] bool: which of those are real
    improvable: np.ndarray      # [S] bool: a running hypothesis may still beat the worst finished one
    length: np.ndarray          # [S] int64: tokens each hypothesis holds after this step
    eos: np.ndarray             # [S] int64: the ending token (-1: none, only max_new ends)
    max_new: np.ndarray         # [S] int64
    penalty: np.ndarray         # [S] float64: length_penalty
    early: np.ndarray           # [S] bool: early_stopping is True
    never: np.ndarray           # [S] bool: early_stopping is "never" and length_penalty > 0


@dataclass(frozen=True)
class After:
    parent: np.ndarray          # [S, k] the hypothesis (old order) each new running hypothesis continues
    token: np.ndarray           # [S, k] its new token
    logprob: np.ndarray         # [S, k] that token's log-probability
    scores: np.ndarray          # [S, k] the new running scores
    candidates: np.ndarray      # [S, 2k] the step's candidates (index into each search's k x 2k block), best first
    candidate_parent: np.ndarray  # [S, 2k]
    candidate_token: np.ndarray   # [S, 2k]
    candidate_logprob: np.ndarray  # [S, 2k]
    merged: np.ndarray          # [S, k] the new finished hypotheses: < k an old one, else candidate merged - k
    finished_scores: np.ndarray
    finished_flags: np.ndarray
    improvable: np.ndarray      # [S] bool
    stopped: np.ndarray         # [S] bool: the search has ended


def normalised(scores: np.ndarray, length: np.ndarray, penalty: np.ndarray) -> np.ndarray:
    """scores / length ** penalty in float32 (length and penalty broadcast against scores), as transformers divides
    its float32 scores by the Python power. Any finite penalty is taken: the power may overflow to inf (a score of
    -0.0) or underflow to 0 (-inf) without raising, where Python's float power raises OverflowError (transformers'
    own scorer does: there is no answer of theirs to equal at such penalties)."""
    scores = scores.astype(np.float32)
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        out = scores / np.power(np.asarray(length, np.float64), penalty).astype(np.float32)
    # -inf / inf and 0 / 0 are NaN: a candidate ruled out (a forced step's -inf) stays out, a score of 0 stays 0.
    return np.where(np.isnan(out), np.where(np.isneginf(scores), scores, np.float32(0)), out).astype(np.float32)


def pick(x: np.ndarray, index: np.ndarray) -> np.ndarray:
    """x[i, index[i, j]] for each row i (np.take_along_axis on axis 1, without its per-call set-up)."""
    return x[np.arange(x.shape[0])[:, None], index]


def _best_first(scores: np.ndarray, n: int) -> np.ndarray:
    """Per row: the indices of the n largest scores, best first, ties to the lower index (-inf last)."""
    return np.argsort(-scores, axis=1, kind="stable")[:, :n]


def step(b: Before, vocab: int) -> After:
    """The step of every search in `b` (all of k beams)."""
    s, k = b.scores.shape
    keep = 2 * k                                         # max(2, 1 + eos ids) * k
    values, tokens = b.values[:, :, :keep], b.tokens[:, :, :keep]
    # Each hypothesis's 2k best tokens hold the 2k best candidates over all of them: ranked by score, ties to the
    # lower (hypothesis, token) as over the whole k x vocabulary block.
    flat = (np.arange(k)[None, :, None] * vocab + tokens).reshape(s, -1)
    total = (values + b.scores[:, :, None]).reshape(s, -1).astype(np.float32)
    ranked = np.lexsort((flat, -total), axis=-1)[:, :keep]
    top_scores = pick(total, ranked)
    picked = pick(flat, ranked)
    parent, token = picked // vocab, picked % vocab
    step_logprobs = pick(values.reshape(s, -1), ranked)
    hits = (token == b.eos[:, None]) | (b.length >= b.max_new)[:, None]
    # The k best candidates that go on.
    running = (top_scores + hits.astype(np.float32) * NEG).astype(np.float32)
    chosen = _best_first(running, k)
    # Finished hypotheses: candidates among the best k that ended, if they beat the worst kept one.
    scored = normalised(top_scores, b.length[:, None], b.penalty[:, None])
    scored = np.where((b.finished_flags.all(1) & b.early)[:, None], scored + NEG, scored)
    scored = np.where(~b.improvable[:, None], scored + NEG, scored)
    just = hits & (np.arange(keep) < k)[None, :]
    scored = (scored + (~just).astype(np.float32) * NEG).astype(np.float32)
    merged_scores = np.concatenate([b.finished_scores, scored], 1)
    merged = _best_first(merged_scores, k)
    finished_scores = pick(merged_scores, merged)
    finished_flags = pick(np.concatenate([b.finished_flags, just], 1), merged)
    scores = pick(running, chosen)
    # Whether any running hypothesis may still beat the worst finished one.
    hypothetical = np.where(b.never, b.max_new, b.length)
    best_possible = normalised(scores[:, :1], hypothetical[:, None], b.penalty[:, None])
    worst = np.where(finished_flags, finished_scores.min(1, keepdims=True), NEG)
    improvable = b.improvable & (best_possible > worst).any(1)
    full = finished_flags.all(1) & b.early
    return After(pick(parent, chosen), pick(token, chosen),
                 pick(step_logprobs, chosen), scores, ranked, parent, token, step_logprobs, merged,
                 finished_scores, finished_flags, improvable, ~improvable | full | hits.all(1))


def assign_beams(order: np.ndarray, parent: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """order [S, k]: old hypothesis j -> its beam; parent [S, k]: new hypothesis j -> the old one it continues.
    Returns (new order, each new hypothesis's parent's beam, homeless [S, k]: it takes a free beam and needs a copy
    of its parent's rows). The first new hypothesis (best first) continuing a beam's hypothesis stays in that beam;
    the others take the beams no new hypothesis continued, lowest beam to the best homeless one."""
    s, k = parent.shape
    beam = pick(order, parent)
    earlier = np.tril(np.ones((k, k), bool), -1)[None]                  # [j, i]: i < j
    homeless = ((beam[:, :, None] == beam[:, None, :]) & earlier).any(2)
    claimed = np.zeros((s, k), bool)
    np.put_along_axis(claimed, beam, True, 1)
    movers = np.argsort(~homeless, axis=1, kind="stable")              # homeless hypotheses first, best first
    free = np.argsort(claimed, axis=1, kind="stable")                  # unclaimed beams first, lowest first
    row, m = np.nonzero(np.arange(k)[None, :] < homeless.sum(1)[:, None])
    new_order = beam.copy()
    new_order[row, movers[row, m]] = free[row, m]
    return new_order, beam, homeless


@dataclass(frozen=True)
class History:
    """One step of a group of searches, by beam: the beam whose hypothesis each beam's new one continues, and its
    new token and log-probability. A search keeps (record, its row) per step and walks them back for its answers,
    so a step writes nothing per search but that pair."""

    source: np.ndarray     # [S, k]
    token: np.ndarray
    logprob: np.ndarray
