"""Beam search over the slot cache: one search per request, its beams in slots of their own (numpy only).

A search with k beams holds k cache slots from admission to its end (a scheduler *gang*: admitted together, so
every beam decodes in the same iterations, as rows of the one decode call shared with every other sequence). Each
step takes the k beams' logits and keeps the k best continuations; a continuation whose parent beam's slot went to
another continuation gets a copy of the parent's self-attention rows into a slot whose hypothesis was dropped
(`Copy`, made on the device by the executor right after the step: positions [0, written) of every layer and
kind, device_cache.copy_prefixes; every copy of a step at the longest such length, so one gather per buffer makes
them all). A continuation of a beam that no other continuation claimed stays in its
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
Python per step is a few assignments per search, not per beam or candidate. A search's state between steps is one
vector (its running and finished scores, beam order, where each finished hypothesis ended, its rules); its tokens
are the steps' records (`History`: each beam's new token and the beam it continues), walked back only for the
answers.

`step` runs in the engine's worker thread (it owns the search's state between the loop's prepare and apply);
`finish` runs on the event loop (it puts each request's final chunk on its queue).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterator

import numpy as np

from . import beam_select
from .beam_select import NEG, History
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


def _field(index: int, dtype: type) -> Any:
    """Field `index` of a search's state vector (k values), as an array of `dtype`."""
    return property(lambda self: self.state[index * self.k:(index + 1) * self.k].astype(dtype))


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
        self.k = k
        # Its state between steps, one float64 vector (exact for every field; one row of the array its step wrote):
        # the fields below of k values each, then improvable (transformers' is_early_stop_heuristic_unsatisfied)
        # and the rules.
        never = options.early_stopping == "never" and options.length_penalty > 0
        self.state = np.concatenate([np.arange(k), np.full(k, NEG), np.full(k, NEG), np.zeros(k), np.full(k, -1),
                                     np.zeros(3 * k), [1, -1 if options.eos_id is None else options.eos_id,
                                                       options.max_new_tokens, options.length_penalty,
                                                       options.early_stopping is True, never]]).astype(np.float64)
        self.state[k] = 0.0          # the first running score: beam 0 alone starts (the others at NEG)
        self.steps = 0               # tokens generated by every running hypothesis
        self.stopped = False         # the search ended (set by step, in the thread); finish() sends the answers
        self.history: list[tuple[History, int]] = []   # per step: its record and this search's row in it
        self.slots: np.ndarray | None = None            # each beam's slot (fixed from admission to the end)
        self.last: list[int] = []                      # each beam's last token (the next step's input)
        self._following = True       # beams but the first may still wait for the first step's copies (settle)

    # The state's fields of k values each. Hypothesis j (transformers' running order: best first) lives in beam
    # order[j] with score scores[j]; the k best finished hypotheses, best first: their scores, whether each is real,
    # and where each ended (the step, its parent's beam before that step, its last token and that token's
    # log-probability; step -1: none).
    order = _field(0, np.int64)
    scores = _field(1, np.float32)
    finished_scores = _field(2, np.float32)
    finished_flags = _field(3, bool)
    ended = _field(4, np.int64)
    ended_beam = _field(5, np.int64)
    ended_token = _field(6, np.int64)
    ended_logprob = _field(7, np.float32)

    @property
    def improvable(self) -> bool:
        return bool(self.state[8 * self.k])

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

    def walk(self, beam: int, step: int) -> tuple[list[int], list[float]]:
        """The tokens and log-probabilities of the hypothesis in `beam` after step `step` (0-based; -1: none yet),
        followed back through each step's record of where a beam's hypothesis came from."""
        tokens, logprobs = [], []
        for record, i in reversed(self.history[:step + 1]):
            tokens.append(int(record.token[i, beam]))
            logprobs.append(float(record.logprob[i, beam]))
            beam = int(record.source[i, beam])
        return tokens[::-1], logprobs[::-1]

    @property
    def tokens(self) -> list[list[int]]:
        """The running hypotheses' tokens, by beam."""
        return [self.walk(b, self.steps - 1)[0] for b in range(self.options.num_beams)]

    @property
    def logprobs(self) -> list[list[float]]:
        return [self.walk(b, self.steps - 1)[1] for b in range(self.options.num_beams)]

    def _ended(self, f: int) -> tuple[list[int], list[float]]:
        if self.ended[f] < 0:
            return [], []
        tokens, logprobs = self.walk(int(self.ended_beam[f]), int(self.ended[f]) - 1)
        return tokens + [int(self.ended_token[f])], logprobs + [float(self.ended_logprob[f])]

    @property
    def finished_tokens(self) -> list[list[int]]:
        """The k best finished hypotheses' tokens, best first (empty where there is none)."""
        return [self._ended(f)[0] for f in range(self.options.num_beams)]

    @property
    def finished_logprobs(self) -> list[list[float]]:
        return [self._ended(f)[1] for f in range(self.options.num_beams)]

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
        values, tokens = top(np.stack([rows[b][:v] for b in range(k)]), 2 * k)
        return advance([self], np.arange(k)[None], values, tokens, [written], top)[0]

    # ------------------------------------------------------------------ the answers (event loop)

    def finish(self, reason: str | None = None) -> None:
        """Each request gets the hypothesis of its rank among the finished ones, best first. A search cut short
        (`reason`: a deadline, the engine stopping) answers with what it has: finished hypotheses, then running
        ones."""
        ranked = [(True, f) for f in np.flatnonzero(self.finished_flags).tolist()]
        ranked += [(False, b) for b in self.order.tolist()]
        for request in self.requests:
            if request.done:
                continue
            ended, at = ranked[request.params.beam_rank]
            tokens, logprobs = self._ended(at) if ended else self.walk(at, self.steps - 1)
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


def advance(searches: list[BeamSearch], rows: np.ndarray, values: np.ndarray, tokens: np.ndarray,
            written: list[int], top: TopLogprobs) -> list[list[Copy]]:
    """One step of `searches` (all of one width and vocabulary) together. rows [S, k]: where each search's beams'
    scores are in values / tokens [rows, >= 2k] (the best log-probabilities of each row, and their ids); written:
    each search's slot length after this step. Returns each search's slot copies (none for a search that ended)."""
    k, vocab = searches[0].k, searches[0].vocab_size
    state = np.stack([s.state for s in searches])
    order = state[:, :k].astype(np.int64)
    steps = np.fromiter((s.steps for s in searches), np.int64, len(searches))
    at = beam_select.pick(rows, order)                       # hypothesis order
    values, tokens = values[at], tokens[at]
    for i, s in enumerate(searches):
        forced = s.options.forced.get(s.steps) if s.options.forced else None
        if forced is not None:   # transformers' forced bos / eos: processed log-probs 0 for it, -inf for the rest
            values[i], tokens[i] = top(forced_logprobs(vocab, forced).astype(np.float32)[None], values.shape[2])
    rules = state[:, 8 * k + 1:]
    field = [state[:, f * k:(f + 1) * k] for f in range(8)]
    before = beam_select.Before(values, tokens, field[1].astype(np.float32), field[2].astype(np.float32),
                                field[3] > 0, state[:, 8 * k] > 0, steps + 1, rules[:, 0].astype(np.int64),
                                rules[:, 1].astype(np.int64), rules[:, 2], rules[:, 3] > 0, rules[:, 4] > 0)
    after = beam_select.step(before, vocab)
    new_order, parent_beam, homeless = beam_select.assign_beams(order, after.parent)
    record = History(*(np.empty_like(a) for a in (new_order, after.token, after.logprob)))
    by_row = np.arange(len(searches))[:, None]
    for into, what in zip((record.source, record.token, record.logprob), (parent_beam, after.token, after.logprob)):
        into[by_row, new_order] = what
    # Where each of the k best finished hypotheses ended: an old one's record, or a candidate of this step's.
    m, keep = after.merged, after.candidates.shape[1]
    ended = [beam_select.pick(np.concatenate([old, new], 1), m) for old, new in zip(field[4:], (
        np.repeat(steps[:, None], keep, 1), beam_select.pick(order, after.candidate_parent),
        after.candidate_token, after.candidate_logprob))]
    new_state = np.concatenate([new_order, after.scores, after.finished_scores, after.finished_flags, *ended,
                                after.improvable[:, None], state[:, 8 * k + 1:]], 1, dtype=np.float64)
    slots = np.stack([s.slots if s.slots is not None else _slots(s) for s in searches])
    row, j = np.nonzero(homeless & ~after.stopped[:, None])
    moves = zip(row.tolist(), slots[row, parent_beam[row, j]].tolist(), slots[row, new_order[row, j]].tolist())
    out: list[list[Copy]] = [[] for _ in searches]
    # Every copy of the step at the longest length any needs: one gather per buffer for all of them (the positions
    # a shorter one copies past its own length are written by its next steps before anything reads them).
    length = max((written[i] for i in row.tolist()), default=0)
    for i, source, target in moves:
        out[i].append(Copy(source, target, length))
    stopped, last = after.stopped.tolist(), record.token.tolist()
    for i, search in enumerate(searches):
        search.history.append((record, i))
        search.state, search.stopped, search.steps, search.last = new_state[i], stopped[i], search.steps + 1, last[i]
    return out


def _slots(search: BeamSearch) -> np.ndarray:
    search.slots = np.array([b.slot for b in search.beams], np.int64)
    return search.slots


class Beam:
    """The owner of one beam's scheduler state: the engine and executor see it where a Sequence would be."""

    def __init__(self, search: BeamSearch, index: int) -> None:
        self.search, self.index = search, index
        self.state: SeqState | None = None
        self.prompt_tokens = None
        self.generated = Generated(search, index)

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


class Generated:
    """The tokens of the hypothesis in a beam's slot, as the executor and loop read a Sequence's `generated`: its
    length and last token at once (what they read every step), the rest walked from the search's records."""

    __slots__ = ("search", "beam")

    def __init__(self, search: BeamSearch, beam: int) -> None:
        self.search, self.beam = search, beam

    def __len__(self) -> int:
        return self.search.steps

    def __getitem__(self, index: int) -> int:
        if index == -1 and self.search.steps:
            return self.search.last[self.beam]
        return self.search.walk(self.beam, self.search.steps - 1)[0][index]

    def __iter__(self) -> Iterator[int]:
        return iter(self.search.walk(self.beam, self.search.steps - 1)[0])


class BeamStrategy:
    """Every beam search's rows of a step: their top log-probabilities scored together (beam_scores.score_rows: as
    few calls as the rows' size allows, slices of the decode call's logits where the rows are consecutive), then
    the searches of each width stepped together (`advance`); the copies of all of them returned together (searches
    never share a slot)."""

    runs_ahead = False

    def plan(self, rows: list[StepRow], context: StepContext) -> Planned:
        out = Planned()
        searches: dict[int, tuple[BeamSearch, list[StepRow | None]]] = {}
        for row in rows:
            owner = row.state.owner
            entry = searches.get(id(owner.search))
            if entry is None:
                entry = searches[id(owner.search)] = (owner.search, [None] * owner.search.k)
            entry[1][owner.index] = row
        count = Counter(id(row.state.owner.search) for row in rows)
        scored: list[StepRow] = []                 # the rows whose logits are read, each once
        groups: dict[tuple[int, int], list[tuple[BeamSearch, list[int], int]]] = {}
        for key, (search, beams) in searches.items():
            # The first step reads beam 0 alone: every beam holds the prompt alone (a decoder's other beams get it
            # by this step's copies), and the others' candidates score -1e9 whatever their logits.
            first = search.steps == 0
            needed = beams[:1] if first else beams
            if needed[0] is None or not first and count[key] < len(beams):
                error = RuntimeError(f"beam search: {count[key]} of its {len(beams)} beams stepped")
                out.failed.append((search.states, "beam search step failed", error))
                continue
            at = len(scored)
            scored += needed                           # type: ignore[arg-type]
            by_beam = [at] * len(beams) if first else list(range(at, at + len(beams)))
            groups.setdefault((search.k, search.vocab_size), []).append(
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
            try:
                copies = advance(members, np.array([p for _, p, _ in group]), values, ids, [w for _, _, w in group],
                                 context.top)
            except Exception as exc:
                out.failed += [(s.states, "beam search step failed", exc) for s in members]
                continue
            out.copies += [(s.states, c) for s, c in zip(members, copies) if c]
            out.settles += members
        return out


BEAMS = BeamStrategy()
