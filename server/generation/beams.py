"""Beam search over the slot cache: one search per request, its beams in slots of their own (numpy only).

A search with k beams holds k cache slots from admission to its end (a scheduler *gang*: admitted together, so
every beam decodes in the same iterations, as rows of the one decode call shared with every other sequence). Each
step takes the k beams' logits and keeps the k best continuations; a continuation whose parent beam's slot went to
another continuation gets a copy of the parent's self-attention rows into a slot whose hypothesis was dropped
(`Copy`, made on the device by the executor right after the step: positions [0, written) of every layer and
kind, device_cache.copy_prefix). A continuation of a beam that no other continuation claimed stays in its
parent's slot: most steps copy little. The cross-attention buffers need no copy: every beam reads the same
source, written into each of its slots when the request was admitted.

The prompt is prefilled ONCE, in beam 0's slot; the other beams take their slots with the gang but prefill nothing
(`SeqState.follows`). The first step reads beam 0's logits alone (the others' candidates score -1e9 whatever their
logits, as in transformers), and every continuation it keeps but the best is homeless, so that step's copies put
the prompt's rows into every other beam's slot — the copy a prefill of each beam would have made redundant, at the
cost of a slot-to-slot copy instead of k - 1 prompts' compute. An encoder-decoder's prompt (its start token) goes
the same way: beam 0 writes it, the copies of the first step bring it to the others.

The selection is `transformers`' (generation/utils.py `_beam_search`, 5.x), step by step, so the hypotheses equal
its `generate(num_beams=k)`: scores are float32 sums of log-softmax; the first step counts beam 0 only (the
others start at -1e9); each step keeps the 2k best candidates over all beams; a candidate ending in eos (or
reaching max_new_tokens) among the best k becomes a finished hypothesis scored sum / length ** length_penalty
(length = generated tokens, eos included); the k best unfinished ones run on. The search ends when it reaches
max_new_tokens, when k hypotheses are finished and early_stopping is true, or when no running beam can beat the
worst finished one (early_stopping false: judged at the current length; "never": at max_new_tokens when
length_penalty > 0). The n best finished hypotheses answer the n requests of the search, best first.

Each iteration steps every search of the same width together (beam_select.py: one ranking over [searches, k x 2k]
candidates, one merge of the finished ones, one placement of the new hypotheses in the beams' slots), so the
Python per step is a few array writes per search, not per beam or candidate. A search keeps its hypotheses as
arrays: the running ones by beam ([k, length] tokens and log-probabilities, the rows of a beam's slot), the k best
finished ones by rank; lists are made only for the answers.

`step` runs in the engine's worker thread (it owns the search's state between the loop's prepare and apply);
`finish` runs on the event loop (it puts each request's final chunk on its queue).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from . import beam_select
from .beam_select import NEG
from .beam_scores import numpy_top, score_rows
from .params import GenerationParams
from .results import FINISH_EOS, FINISH_LENGTH
from .sampling import Choice, forced_logprobs
from .scheduler import Chunk, Copy, SeqState, Status
from .sequence import to_generated_token
from .strategies import Planned, StepContext, StepRow, TopLogprobs

if TYPE_CHECKING:
    from tokenizers import Tokenizer

    from .scheduler import Scheduler
    from .sequence import Sequence

MAX_BEAMS = 8


@dataclass(frozen=True)
class BeamOptions:
    num_beams: int
    length_penalty: float
    early_stopping: bool | str      # True, False, or "never"
    max_new_tokens: int
    eos_id: int | None              # None: only max_new_tokens ends a hypothesis (ignore_eos)
    forced: dict[int, int] = field(default_factory=dict)   # generated index -> forced token (seq2seq_spec)


class BeamSearch:
    """One request's beam search, answering `requests` (each with the hypothesis of its params.beam_rank)."""

    def __init__(self, requests: list["Sequence"], options: BeamOptions, vocab_size: int,
                 tokenizer: "Tokenizer") -> None:
        k = options.num_beams
        if not requests or any(not 0 <= r.params.beam_rank < k for r in requests):
            raise ValueError(f"parameters.beam_rank: a search of {k} beams answers ranks 0..{k - 1}")
        self.requests = requests
        self.options = options
        self.vocab_size = vocab_size
        self.tokenizer = tokenizer
        self.prompt_ids = requests[0].prompt_ids
        self.beams = [Beam(self, b) for b in range(k)]
        # Hypothesis j (transformers' running order: best first) lives in beam order[j].
        self.order = np.arange(k)
        self.scores = np.full(k, NEG, np.float32)                 # running score of hypothesis j
        self.scores[0] = 0.0
        self.finished_scores = np.full(k, NEG, np.float32)
        self.finished_flags = np.zeros(k, bool)
        self.improvable = True       # transformers' is_early_stop_heuristic_unsatisfied
        self.steps = 0               # tokens generated by every running hypothesis
        self.stopped = False         # the search ended (set by step, in the thread); finish() sends the answers
        self._following = True       # beams but the first may still wait for the first step's copies (settle)
        never = options.early_stopping == "never" and options.length_penalty > 0
        self.rules = (-1 if options.eos_id is None else options.eos_id, options.max_new_tokens,
                      options.length_penalty, options.early_stopping is True, never)
        # The hypotheses' tokens and log-probabilities: running ones by beam, the k best finished ones by rank
        # (each with its length). Grown as the search goes (max_new_tokens may be far beyond what it generates).
        width = max(1, min(options.max_new_tokens, 16))
        self._tokens = np.zeros((k, width), np.int64)
        self._logprobs = np.zeros((k, width), np.float32)
        self._finished_tokens = np.zeros((k, width), np.int64)
        self._finished_logprobs = np.zeros((k, width), np.float32)
        self._finished_length = np.zeros(k, np.int64)

    # ------------------------------------------------------------------ the request side

    @property
    def states(self) -> list[SeqState]:
        return [b.state for b in self.beams if b.state is not None]

    @property
    def cancelled(self) -> bool:
        """Every consumer went away. (Asked for every beam of every step: a plain loop, no generator.)"""
        for request in self.requests:
            if not request.cancelled:
                return False
        return True

    @property
    def done(self) -> bool:
        for request in self.requests:
            if not request.done:
                return False
        return True

    def generated_of(self, beam: int) -> np.ndarray:
        """The tokens of the hypothesis in `beam`'s slot (a view: read it before the next step)."""
        return self._tokens[beam, :self.steps]

    @property
    def tokens(self) -> list[list[int]]:
        """The running hypotheses' tokens, by beam."""
        return [self._tokens[b, :self.steps].tolist() for b in range(self.options.num_beams)]

    @property
    def logprobs(self) -> list[list[float]]:
        return [self._logprobs[b, :self.steps].tolist() for b in range(self.options.num_beams)]

    @property
    def finished_tokens(self) -> list[list[int]]:
        """The k best finished hypotheses' tokens, best first (empty where there is none)."""
        return [self._finished_tokens[i, :n].tolist() for i, n in enumerate(self._finished_length)]

    @property
    def finished_logprobs(self) -> list[list[float]]:
        return [self._finished_logprobs[i, :n].tolist() for i, n in enumerate(self._finished_length)]

    # ------------------------------------------------------------------ one step (worker thread)

    def step(self, rows: dict[int, np.ndarray], written: int, top: "TopLogprobs | None" = None) -> list[Copy]:
        """This search alone (BeamStrategy steps all of an iteration's searches together, the same way). rows: beam
        index -> its logits [>= V] this step; written: positions each beam's slot holds after this step's write;
        top: each row's n best log-probabilities (numpy's by default). Returns the slot copies that put each kept
        hypothesis's self-attention rows in its beam's slot (none once the search has ended)."""
        top = top or numpy_top
        k, v = self.options.num_beams, self.vocab_size
        if self.steps == 0 and 0 in rows:
            rows = {b: rows[0] for b in range(k)}
        if sorted(rows) != list(range(k)):
            raise RuntimeError(f"beam search: {len(rows)} of its {k} beams stepped")
        values, tokens = top(np.stack([rows[b][:v] for b in self.order]), 2 * k)
        return advance([self], values[None], tokens[None], [written], top)[0]

    def _grow(self, width: int) -> None:
        if width <= self._tokens.shape[1]:
            return
        width = min(max(width, 2 * self._tokens.shape[1]), max(width, self.options.max_new_tokens))
        for name in ("_tokens", "_logprobs", "_finished_tokens", "_finished_logprobs"):
            old = getattr(self, name)
            new = np.zeros((old.shape[0], width), old.dtype)
            new[:, :old.shape[1]] = old
            setattr(self, name, new)

    def _finished(self, i: int, after: beam_select.After, old_order: np.ndarray) -> None:
        """The k best finished hypotheses after step i's merge (only called when new ones came in): each either an
        old finished one or a candidate of this step, its parent's tokens (from the beams, before they move) and
        its own."""
        k, t = self.options.num_beams, self.steps
        merged = after.merged[i]
        old = merged < k
        tokens, logprobs = np.zeros_like(self._finished_tokens), np.zeros_like(self._finished_logprobs)
        length = np.zeros(k, np.int64)
        tokens[old], logprobs[old] = self._finished_tokens[merged[old]], self._finished_logprobs[merged[old]]
        length[old] = self._finished_length[merged[old]]
        new = ~old
        candidate = merged[new] - k
        beams = old_order[after.candidate_parent[i, candidate]]
        tokens[new, :t], logprobs[new, :t] = self._tokens[beams, :t], self._logprobs[beams, :t]
        tokens[new, t], logprobs[new, t] = after.candidate_token[i, candidate], after.candidate_logprob[i, candidate]
        length[new] = t + 1
        self._finished_tokens, self._finished_logprobs, self._finished_length = tokens, logprobs, length

    # ------------------------------------------------------------------ the answers (event loop)

    def finish(self, reason: str | None = None) -> None:
        """Each request gets the hypothesis of its rank among the finished ones, best first. A search cut short
        (`reason`: a deadline, the engine stopping) answers with what it has: finished hypotheses, then running
        ones."""
        ranked = [(self._finished_tokens[i], self._finished_logprobs[i], self._finished_length[i])
                  for i in np.flatnonzero(self.finished_flags)]
        ranked += [(self._tokens[b], self._logprobs[b], self.steps) for b in self.order]
        for request in self.requests:
            if request.done:
                continue
            row, row_logprobs, n = ranked[request.params.beam_rank]
            tokens, logprobs = row[:n].tolist(), row_logprobs[:n].tolist()
            request.generated = list(tokens)
            ended = reason or (FINISH_EOS if tokens and tokens[-1] == self.options.eos_id else FINISH_LENGTH)
            shown = tokens[:-1] if tokens and tokens[-1] == self.options.eos_id else tokens
            text = "".join(request.detokenizer.push(t) for t in shown)
            # With logprobs: each token's log-softmax where it was chosen (the score's terms: sum / length ** penalty).
            scores = logprobs if request.params.logprobs else [None] * len(tokens)
            request.finish(ended, text, [to_generated_token(Choice(t, lp, ()), self.tokenizer)
                                         for t, lp in zip(tokens, scores)])

    def fail(self, error: BaseException) -> None:
        for request in self.requests:
            request.fail(error)

    def settle(self, scheduler: "Scheduler", count_token: Callable[[Any], None]) -> None:
        """On the loop, after a step: beams whose prompt came by this step's copies decode from now on (a
        decoder's beams but the first: they prefilled nothing), each request counts its token, and a search that
        ended answers."""
        if self.stopped:
            self.finish()
            return
        if self._following:
            self._following = False
            for state in self.states:
                if state.status is Status.PREFILLING:
                    scheduler.prefilled(Chunk(state, 0, state.prompt_len))
        for request in self.requests:
            if not (request.done or request.cancelled):
                count_token(request)


def advance(searches: list[BeamSearch], values: np.ndarray, tokens: np.ndarray, written: list[int],
            top: TopLogprobs) -> list[list[Copy]]:
    """One step of `searches` (all of one width and vocabulary) together. values / tokens [S, k, >= 2k]: each
    search's hypotheses' best log-probabilities and ids, in hypothesis order; written: each search's slot length
    after this step. Returns each search's slot copies (none for a search that ended)."""
    k, vocab = searches[0].options.num_beams, searches[0].vocab_size
    forced = [(i, s.options.forced.get(s.steps)) for i, s in enumerate(searches) if s.options.forced]
    if any(f is not None for _, f in forced):
        values, tokens = np.array(values), np.array(tokens)
        for i, token in forced:
            if token is not None:   # transformers' forced bos / eos: processed log-probs 0 for it, -inf for the rest
                values[i], tokens[i] = top(forced_logprobs(vocab, token).astype(np.float32)[None], values.shape[2])
    rules = np.array([s.rules for s in searches], np.float64)
    order = np.stack([s.order for s in searches])
    before = beam_select.Before(
        values, tokens, np.stack([s.scores for s in searches]), np.stack([s.finished_scores for s in searches]),
        np.stack([s.finished_flags for s in searches]), np.fromiter((s.improvable for s in searches), bool),
        np.fromiter((s.steps + 1 for s in searches), np.int64), rules[:, 0].astype(np.int64),
        rules[:, 1].astype(np.int64), rules[:, 2], rules[:, 3] > 0, rules[:, 4] > 0)
    after = beam_select.step(before, vocab)
    new_order, parent_beam, homeless = beam_select.assign_beams(order, after.parent)
    # By beam: where its new hypothesis's tokens come from, and its new token.
    source, token, logprob = (np.empty_like(new_order), np.empty_like(after.token), np.empty_like(after.logprob))
    np.put_along_axis(source, new_order, parent_beam, 1)
    np.put_along_axis(token, new_order, after.token, 1)
    np.put_along_axis(logprob, new_order, after.logprob, 1)
    moved = (source != np.arange(k)).any(1)
    merged = (after.merged != np.arange(k)).any(1)
    copying = homeless.any(1) & ~after.stopped
    out: list[list[Copy]] = []
    for i, search in enumerate(searches):
        t = search.steps
        search._grow(t + 1)
        if merged[i]:
            search._finished(i, after, order[i])
        if moved[i]:
            search._tokens[:, :t], search._logprobs[:, :t] = search._tokens[source[i], :t], search._logprobs[source[i], :t]
        search._tokens[:, t], search._logprobs[:, t] = token[i], logprob[i]
        search.order, search.scores = new_order[i], after.scores[i]
        search.finished_scores, search.finished_flags = after.finished_scores[i], after.finished_flags[i]
        search.improvable, search.stopped, search.steps = bool(after.improvable[i]), bool(after.stopped[i]), t + 1
        beams = search.beams
        out.append([Copy(beams[parent_beam[i, j]].slot, beams[new_order[i, j]].slot, written[i])
                    for j in np.flatnonzero(homeless[i])] if copying[i] else [])
    return out


class Beam:
    """The owner of one beam's scheduler state: the engine and executor see it where a Sequence would be."""

    def __init__(self, search: BeamSearch, index: int) -> None:
        self.search, self.index = search, index
        self.state: SeqState | None = None
        self.prompt_tokens = None

    @property
    def strategy(self) -> "BeamStrategy":
        return BEAMS

    @property
    def source_ids(self) -> list[int] | None:
        return self.search.requests[0].source_ids

    @property
    def source_states(self) -> list[SeqState]:
        """The states that read this beam's source: every beam of its search (each slot holds the source)."""
        return self.search.states

    @property
    def slot(self) -> int:
        if self.state is None or self.state.slot is None:
            raise RuntimeError("beam search: a beam without a slot stepped")
        return self.state.slot

    @property
    def generated(self) -> np.ndarray:
        return self.search.generated_of(self.index)

    @property
    def prompt_ids(self) -> list[int]:
        return self.search.prompt_ids

    @property
    def params(self) -> GenerationParams:
        return self.search.requests[0].params

    @property
    def deadline(self) -> float | None:
        return self.search.requests[0].deadline

    @property
    def cancelled(self) -> bool:
        return self.search.cancelled

    @property
    def done(self) -> bool:
        return self.search.done

    @property
    def finish_reason(self) -> str | None:
        return self.search.requests[0].finish_reason

    @finish_reason.setter
    def finish_reason(self, reason: str) -> None:
        for request in self.search.requests:     # nobody listens (every consumer left): no chunk
            if not request.done:
                request.finish_reason = reason

    @property
    def budget(self) -> int:
        return self.search.requests[0].budget

    def fail(self, error: BaseException) -> None:
        self.search.fail(error)

    def finish(self, reason: str) -> None:
        self.search.finish(reason)


class BeamStrategy:
    """Every beam search's rows of a step: their top log-probabilities scored together (in blocks of about
    beam_scores.SCORE_FLOATS logits, slices of the decode call's logits where the rows are consecutive), then the searches of
    each width stepped together (`advance`); the copies of all of them returned together (searches never share a
    slot)."""

    runs_ahead = False

    def plan(self, rows: list[StepRow], context: StepContext) -> Planned:
        out = Planned()
        searches: dict[int, tuple[BeamSearch, list[StepRow | None]]] = {}
        for row in rows:
            owner = row.state.owner
            entry = searches.get(id(owner.search))
            if entry is None:
                entry = searches[id(owner.search)] = (owner.search, [None] * owner.search.options.num_beams)
            entry[1][owner.index] = row
        scored: list[StepRow] = []                 # the rows whose logits are read, each once
        groups: dict[tuple[int, int], list[tuple[BeamSearch, list[int], int]]] = {}
        for search, beams in searches.values():
            first = search.steps == 0
            # The first step reads beam 0 alone: every beam holds the prompt alone (a decoder's other beams get it
            # by this step's copies), and the others' candidates score -1e9 whatever their logits.
            needed = beams[:1] if first else beams
            if any(r is None for r in needed):
                error = RuntimeError(f"beam search: {sum(r is not None for r in beams)} of its "
                                     f"{len(beams)} beams stepped")
                out.failed.append((search.states, "beam search step failed", error))
                continue
            positions = list(range(len(scored), len(scored) + len(needed)))
            scored += needed                           # type: ignore[arg-type]
            by_beam = positions * len(beams) if first else positions
            groups.setdefault((search.options.num_beams, search.vocab_size), []).append(
                (search, by_beam, needed[0].written))   # type: ignore[union-attr]
        if not groups:
            return out
        try:
            keep = 2 * max(k for k, _ in groups)
            values, ids = score_rows(scored, context.top, max(v for _, v in groups), keep)
        except Exception as exc:   # onnxruntime's own exception types: those searches fail, nothing else
            out.failed += [(s.states, "beam search step failed", exc) for g in groups.values() for s, _, _ in g]
            return out
        for group in groups.values():
            members = [s for s, _, _ in group]
            at = np.take_along_axis(np.array([p for _, p, _ in group]), np.stack([s.order for s in members]), 1)
            try:
                copies = advance(members, values[at], ids[at], [w for _, _, w in group], context.top)
            except Exception as exc:
                out.failed += [(s.states, "beam search step failed", exc) for s in members]
                continue
            out.copies += [(s.states, c) for s, c in zip(members, copies) if c]
            out.settles += members
        return out


BEAMS = BeamStrategy()
