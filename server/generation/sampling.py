"""Next-token choice for one sequence from its last-position logits (numpy only).

Order of processing: the sequence's logits processors (logits_processors.py: logit bias -> min_tokens (eos and stop
ids masked) -> repetition penalty -> presence / frequency penalties) -> temperature -> min-p -> top-k -> top-p ->
draw. The logit bias is added to the model's logits (OpenAI's `logit_bias`); the repetition
penalty (CTRL's) counts the prompt's tokens too; the presence and frequency penalties (OpenAI's) count only the
generated ones: logit -= presence * [count > 0] + frequency * count.

Logprobs are the log-softmax of the logits after the bias, the masks, the penalties and the temperature (a
temperature of 0, greedy, counts as 1 here), taken BEFORE min-p/top-k/top-p truncation: the truncated
distribution would give -inf to every alternative, which says nothing. So they are <= 0 and the
chosen token's logprob is what the model (with the request's penalty and temperature) thought of it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from .logits_processors import (LogitBias, LogitsProcessor, MinTokens, PresenceFrequency, RepetitionPenalty,
                               apply_processors)
from .params import GenerationParams

if TYPE_CHECKING:
    from server.structured.row import ConstraintMasks, TokenConstraint


# Refused maxima a greedy constrained row passes over one by one before its whole row is masked (_masked_argmax).
GRAMMAR_TRIES = 8


@dataclass(frozen=True)
class Choice:
    token_id: int
    logprob: float | None
    top: tuple[tuple[int, float], ...]   # (token_id, logprob), best first; empty unless asked for
    rank: int | None = None              # scored tokens: 1 + how many tokens were likelier


# A choice with no scores is its token id alone: one shared immutable object per id (a greedy step makes one per
# row), made at the id's first use. Bounded so that a huge vocabulary cannot grow it without end.
_PLAIN: dict[int, Choice] = {}
_PLAIN_MOST = 1 << 18


def plain_choice(token_id: int) -> Choice:
    """Choice(token_id, None, ()), shared."""
    choice = _PLAIN.get(token_id)
    if choice is None:
        choice = Choice(token_id, None, ())
        if len(_PLAIN) < _PLAIN_MOST:
            _PLAIN[token_id] = choice
    return choice


class Sampler:
    """Sampling state of one sequence: its own random generator and its logits processors (the seam where a
    grammar's token mask joins: strategies.py).

    The generator belongs to the request, so a seed gives the same draws whatever else shares the batch.
    """

    def __init__(self, params: GenerationParams, vocab_size: int, prompt_ids: list[int],
                 eos_id: int | None = None, forced: dict[int, int] | None = None,
                 constraint: "TokenConstraint | None" = None) -> None:
        """forced: generated index -> the token chosen there whatever the logits (an encoder-decoder package's
        forced bos / eos, as transformers' logits processors force them: logprob 0, every other token -inf).
        constraint: the row's grammar (server/structured/), its first logits processor: masks the scores before each
        choice, advanced by it."""
        self.params = params
        self.vocab_size = vocab_size
        self.generated = 0
        self._forced = forced or {}
        self._rng: np.random.Generator | None = None    # made at the first draw: greedy never needs one
        # In the order they apply: bias -> min_tokens -> repetition -> presence / frequency.
        self.processors: list[LogitsProcessor] = []
        self.constraint = constraint
        if constraint is not None:    # first: the grammar's -inf stays -inf whatever the bias adds
            self.processors.append(constraint)
        if params.logit_bias:
            self.processors.append(LogitBias(params.logit_bias))
        self._min: MinTokens | None = None
        if params.min_tokens > 0:
            enders = sorted(t for t in {*params.stop_token_ids, eos_id} if t is not None and 0 <= t < vocab_size)
            if enders:
                self._min = MinTokens(np.array(enders, dtype=np.int64), params.min_tokens)
                self.processors.append(self._min)
        if params.repetition_penalty != 1.0:
            self.processors.append(RepetitionPenalty(params.repetition_penalty, vocab_size, prompt_ids))
        if params.presence_penalty != 0.0 or params.frequency_penalty != 0.0:
            self.processors.append(PresenceFrequency(params.presence_penalty, params.frequency_penalty, vocab_size))

    @property
    def rng(self) -> np.random.Generator:
        """The request's generator, made at its first draw from its seed (entropy from the OS without one, a cost
        a greedy request need not pay)."""
        if self._rng is None:
            self._rng = np.random.default_rng(self.params.seed)
        return self._rng

    @property
    def batch_greedy(self) -> bool:
        """Its next choice is the argmax of the logits with at most masked_enders set to -inf: greedy, no processor
        but min_tokens, no logprobs (choose_rows takes such rows together)."""
        p = self.params
        return (p.temperature == 0 and not p.wants_logprobs and self.generated not in self._forced
                and all(q is self._min for q in self.processors))

    @property
    def masking(self) -> "TokenConstraint | None":
        """The grammar that masks its next choice (None without one, or when that choice is forced)."""
        return self.constraint if self.generated not in self._forced else None

    @property
    def grammar_greedy(self) -> bool:
        """Its next choice is the argmax of the logits its grammar allows: greedy, the grammar its only processor,
        no logprobs (choose_rows takes such rows together)."""
        p = self.params
        return (p.temperature == 0 and not p.wants_logprobs and self.masking is not None
                and len(self.processors) == 1)

    @property
    def masked_enders(self) -> np.ndarray | None:
        """The ids masked from the next choice: the ending tokens while fewer than min_tokens are generated."""
        return self._min.masked if self._min is not None else None

    def observe(self, token_id: int) -> None:
        """Record a generated token (its processors advance)."""
        self.generated += 1
        for processor in self.processors:
            processor.advance(token_id)

    def choose(self, logits: np.ndarray) -> Choice:
        """Pick the next token from one row of logits, shape [V]."""
        p = self.params
        forced = self._forced.get(self.generated)
        if forced is not None:
            if not p.wants_logprobs:
                return plain_choice(forced)
            logp = forced_logprobs(self.vocab_size, forced)
            return Choice(forced, 0.0, top_n(logp, p.top_logprobs))
        scores = np.array(logits[: self.vocab_size], dtype=np.float64)   # our own copy: edited in place below
        apply_processors(self.processors, scores)
        if p.temperature > 0:
            scores = scores / p.temperature
        if p.temperature == 0:
            token = int(np.argmax(scores))   # first index on ties: deterministic
        elif p.min_p > 0:
            # p_i >= min_p * p_max  <=>  score_i >= max score + log(min_p)
            kept = np.where(scores >= np.max(scores) + np.log(p.min_p), scores, -np.inf)
            token = sample(kept, p.top_k, p.top_p, self.rng)
        else:
            token = sample(scores, p.top_k, p.top_p, self.rng)
        if not p.wants_logprobs:
            return plain_choice(token)
        logp = log_softmax(scores)
        return Choice(token, float(logp[token]), top_n(logp, p.top_logprobs))


def choose_rows(samplers: list[Sampler], logits: np.ndarray) -> list[Choice]:
    """The next token of each row of logits [rows, >= V], row i with samplers[i], each then observed. The rows
    whose sampler is greedy with nothing added to its logits take one argmax over all of them, the ending tokens
    of those still under min_tokens masked first (the same token `choose` would pick: the first index on ties, on
    the same values); so do the greedy rows whose only processor is their grammar, over the logits it allows, once
    every constrained row's mask is made (all at once: _grammar_rows); the others are chosen one by one."""
    choices: list[Choice | None] = [None] * len(samplers)
    batch = [i for i, s in enumerate(samplers) if s.batch_greedy]
    if batch:
        rows = logits[:, :samplers[batch[0]].vocab_size]     # a view: no copy of [rows, vocab]
        picks = np.argmax(rows, axis=1).tolist()
        for i in batch:
            enders = samplers[i].masked_enders
            # Masking changes the argmax only when it landed on a masked id: an unmasked first maximum stays the
            # first maximum once other ids are set to -inf. Then that row alone is copied and masked.
            if enders is not None and np.isin(picks[i], enders):
                row = rows[i].copy()
                row[enders] = -np.inf
                picks[i] = int(np.argmax(row))
            choices[i] = plain_choice(picks[i])
    _grammar_rows(samplers, logits, choices)
    out: list[Choice] = []
    for i, sampler in enumerate(samplers):
        choice = choices[i] or sampler.choose(logits[i])
        sampler.observe(choice.token_id)
        out.append(choice)
    return out


def _grammar_rows(samplers: list[Sampler], logits: np.ndarray, choices: list[Choice | None]) -> None:
    """The grammar masks of every constrained row, all rows of one model's grammars at once (one fill, one unpack:
    server/structured/masks.py), each row's `apply` then reading its own; the rows of grammar_greedy samplers are
    chosen here, by one argmax over their masked logits (the token `choose` would pick: the same values, the first
    index on ties)."""
    groups: dict[int, tuple["ConstraintMasks", list[tuple[int, "TokenConstraint"]]]] = {}
    for i, sampler in enumerate(samplers):
        if sampler.constraint is not None and (constraint := sampler.masking) is not None:
            groups.setdefault(id(constraint.masks), (constraint.masks, []))[1].append((i, constraint))
    for masks, members in groups.values():
        allowed = masks.allowed([c for _, c in members])
        greedy = [j for j, (i, _) in enumerate(members) if samplers[i].grammar_greedy]
        if greedy:
            rows = [members[j][0] for j in greedy]
            mask = allowed if len(greedy) == len(members) else allowed[greedy]
            picks = _masked_argmax(_rows_of(logits, rows, samplers[rows[0]].vocab_size), mask)
            for i, pick in zip(rows, picks):
                choices[i] = plain_choice(int(pick))


def _rows_of(logits: np.ndarray, rows: list[int], vocab: int) -> np.ndarray:
    """logits[rows, :vocab]: a view when the rows are consecutive (a decode call's usually are), else a copy."""
    if rows == list(range(rows[0], rows[0] + len(rows))):
        return logits[rows[0]:rows[0] + len(rows), :vocab]
    return logits[rows, :vocab]


def _masked_argmax(scores: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """Each row's first maximum among its allowed ids ([rows, vocab] scores and bool mask; scores are not written).
    An unmasked first maximum that is allowed stays the first maximum once the others are set to -inf: only the rows
    whose maximum the mask refuses go on (_allowed_argmax)."""
    picks = scores.argmax(axis=1)
    for i, pick in enumerate(picks.tolist()):
        if not allowed[i, pick]:
            picks[i] = _allowed_argmax(scores[i], allowed[i], pick)
    return picks


def _allowed_argmax(scores: np.ndarray, allowed: np.ndarray, pick: int) -> int:
    """The first maximum among the allowed ids of one row whose first maximum `pick` is refused: its next maxima in
    turn, each refused one set to -inf in a copy, until one is allowed (all it passed over were refused, so that one
    is the first maximum among the allowed). A model's likeliest tokens are mostly allowed by a grammar or mostly
    refused together, and setting -inf outside a mixed mask costs far more than a few argmax passes; after
    GRAMMAR_TRIES passes the row is masked whole."""
    row = scores.copy()
    for _ in range(GRAMMAR_TRIES):
        row[pick] = -np.inf
        pick = int(row.argmax())
        if allowed[pick]:
            return pick
    return int(np.where(allowed, row, -np.inf).argmax())


def forced_logprobs(vocab_size: int, token: int) -> np.ndarray:
    """The distribution of a forced step: all mass on `token` (logprob 0), -inf elsewhere."""
    logp = np.full(vocab_size, -np.inf)
    logp[token] = 0.0
    return logp


def log_softmax(scores: np.ndarray) -> np.ndarray:
    """Over the last axis: one row [V], or each row of [L, V]."""
    shifted = scores - np.max(scores, axis=-1, keepdims=True)
    return shifted - np.log(np.sum(np.exp(shifted), axis=-1, keepdims=True))


def score_tokens(logits: np.ndarray, token_ids: np.ndarray, top: int) -> list[Choice]:
    """Row i of logits [L, V] scores token_ids[i]: its log-softmax probability and rank, and the `top` likeliest
    tokens (best first, ties by lower id). The model's own distribution: no temperature, bias or penalty, as a prompt's
    logprobs are reported (a prompt is given, not sampled)."""
    out: list[Choice] = []
    for lo in range(0, len(token_ids), 64):     # float64 temporaries of 64 rows, however long the prompt
        block = log_softmax(logits[lo:lo + 64].astype(np.float64))
        ids = np.asarray(token_ids[lo:lo + 64], dtype=np.int64)
        picked = block[np.arange(len(ids)), ids]
        ranks = (block > picked[:, None]).sum(axis=1) + 1
        tops: list[tuple[tuple[int, float], ...]] = [()] * len(ids)
        if top > 0:
            idx, vals = _best(block, min(top, block.shape[1]))
            tops = [tuple(zip(map(int, i), map(float, v))) for i, v in zip(idx, vals)]
        out.extend(Choice(int(t), float(lp), tp, int(r)) for t, lp, tp, r in zip(ids, picked, tops, ranks))
    return out


def _best(block: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The n largest entries of each row [rows, n] (ids, values), best first, ties by lower id. Overwrites block.

    n argmax passes (each takes the lowest id among ties): exact at the cut too, where argpartition picks any of
    the tied entries, and no slower for the n <= 20 asked of it (bench/FINDINGS.md)."""
    rows = np.arange(block.shape[0])
    idx = np.empty((block.shape[0], n), dtype=np.int64)
    vals = np.empty((block.shape[0], n), dtype=block.dtype)
    for j in range(n):
        idx[:, j] = block.argmax(axis=1)
        vals[:, j] = block[rows, idx[:, j]]
        block[rows, idx[:, j]] = -np.inf
    return idx, vals


def top_n(logp: np.ndarray, n: int) -> tuple[tuple[int, float], ...]:
    """The n most likely tokens, best first (ties by lower id)."""
    if n <= 0:
        return ()
    idx, vals = _best(logp[None, :].copy(), min(n, logp.shape[0]))
    return tuple(zip(map(int, idx[0]), map(float, vals[0])))


def sample(scores: np.ndarray, top_k: int, top_p: float, rng: np.random.Generator) -> int:
    """Draw one token from softmax(scores) restricted by top-k, then by nucleus top-p."""
    vocab = scores.shape[0]
    if (top_k == 0 or top_k >= vocab) and top_p >= 1.0:
        # No truncation: draw over the whole vocabulary in id order, no sort needed.
        probs = np.exp(scores - np.max(scores))
        cdf = np.cumsum(probs)
        pick = int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"))
        return min(pick, vocab - 1)
    if 0 < top_k < vocab:
        candidates = np.argpartition(-scores, top_k - 1)[:top_k]
    else:
        candidates = np.arange(vocab)
    probs = np.exp(scores[candidates] - np.max(scores[candidates]))
    probs /= probs.sum()
    if top_p < 1.0:
        candidates, probs = nucleus(candidates, probs, top_p)
    else:
        candidates, probs = _best_first(candidates, probs)
    cdf = np.cumsum(probs)
    pick = int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"))
    return int(candidates[min(pick, len(candidates) - 1)])


def _best_first(candidates: np.ndarray, probs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    # Ties by lower id, so the draw does not depend on argpartition's order.
    order = np.lexsort((candidates, -probs))
    return candidates[order], probs[order]


def nucleus(candidates: np.ndarray, probs: np.ndarray, top_p: float) -> tuple[np.ndarray, np.ndarray]:
    """The smallest best-first prefix whose mass reaches top_p (at least one token), renormalized.

    Exact, without sorting the whole vocabulary: the prefix lies inside the k most likely tokens as
    soon as their mass reaches top_p, so k grows until it does.
    """
    n = len(candidates)
    k = min(64, n)
    while True:
        top = np.argpartition(-probs, k - 1)[:k] if k < n else np.arange(n)
        if k == n or probs[top].sum() >= top_p:
            break
        k = min(k * 4, n)
    best, best_probs = _best_first(candidates[top], probs[top])
    keep = int(np.searchsorted(np.cumsum(best_probs), top_p, side="left")) + 1
    best, best_probs = best[:keep], best_probs[:keep]
    return best, best_probs / best_probs.sum()
