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

`step` runs in the engine's worker thread (it owns the search's state between the loop's prepare and apply);
`finish` runs on the event loop (it puts each request's final chunk on its queue).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from .beam_batch import batchable, step_many
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
_NEG = np.float32(-1e9)    # transformers' "not a candidate" score


def _normalised(scores: np.ndarray, length: int, penalty: float) -> np.ndarray:
    """scores / length ** penalty in float32, as transformers divides its float32 scores by the Python power. Any
    finite penalty is taken: the power may overflow to inf (a score of -0.0) or underflow to 0 (-inf) without
    raising, where Python's float power raises OverflowError (transformers' own scorer does: there is no answer
    of theirs to equal at such penalties)."""
    scores = scores.astype(np.float32)
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        out = scores / np.float32(np.power(np.float64(length), penalty))
    # -inf / inf and 0 / 0 are NaN: a candidate ruled out (a forced step's -inf) stays out, a score of 0 stays 0.
    return np.where(np.isnan(out), np.where(np.isneginf(scores), scores, np.float32(0)), out).astype(np.float32)


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
        self.tokens: list[list[int]] = [[] for _ in range(k)]     # the hypothesis in each beam's slot
        self.logprobs: list[list[float]] = [[] for _ in range(k)]  # ... and each of its tokens' log-probability
        # Hypothesis j (transformers' running order: best first) lives in beam order[j].
        self.order = list(range(k))
        self.scores = np.full(k, _NEG, np.float32)                # running score of hypothesis j
        self.scores[0] = 0.0
        self.finished_scores = np.full(k, _NEG, np.float32)
        self.finished_tokens: list[list[int]] = [[] for _ in range(k)]
        self.finished_logprobs: list[list[float]] = [[] for _ in range(k)]
        self.finished_flags = np.zeros(k, bool)
        self.improvable = True       # transformers' is_early_stop_heuristic_unsatisfied
        self.steps = 0               # tokens generated by every running hypothesis
        self.stopped = False         # the search ended (set by step, in the thread); finish() sends the answers

    # ------------------------------------------------------------------ the request side

    @property
    def states(self) -> list[SeqState]:
        return [b.state for b in self.beams if b.state is not None]

    @property
    def cancelled(self) -> bool:
        """Every consumer went away."""
        return all(r.cancelled for r in self.requests)

    @property
    def done(self) -> bool:
        return all(r.done for r in self.requests)

    # ------------------------------------------------------------------ one step (worker thread)

    def step(self, rows: dict[int, np.ndarray], written: int, top: "TopLogprobs | None" = None,
             scored: "dict[int, tuple[np.ndarray, np.ndarray]] | None" = None) -> list[Copy]:
        """rows: beam index -> its logits [>= V] this step; written: positions each beam's slot holds after this
        step's write; top: each row's n best log-probabilities (the engine's onnxruntime graph, beam_scores.py;
        numpy's otherwise); scored: beam index -> top's answer for its row, when the caller computed it (the
        executor does, for every search's rows in a few calls), at least 2k values each. Returns the slot copies
        that put each kept hypothesis's self-attention rows in its beam's slot (none once the search has ended)."""
        top = top or numpy_top
        opts, k, v = self.options, self.options.num_beams, self.vocab_size
        if self.steps == 0 and 0 in rows:
            # The first step reads beam 0 alone: every beam holds the prompt alone (a decoder's other beams get
            # it by this step's copies), and the others' candidates score -1e9 whatever their logits.
            rows = {b: rows[0] for b in range(k)}
            scored = {b: scored[0] for b in range(k)} if scored is not None and 0 in scored else None
        if sorted(rows) != list(range(k)):
            raise RuntimeError(f"beam search: {len(rows)} of its {k} beams stepped")
        keep = 2 * k                                     # max(2, 1 + eos ids) * k
        # Each hypothesis's 2k best tokens hold the 2k best candidates over all of them: the best of those k x 2k,
        # ties to the lower (hypothesis, token) as over the whole block.
        forced = opts.forced.get(self.steps)
        if forced is not None:     # transformers' forced bos / eos: processed log-probs are 0 for it, -inf for the rest
            values, tokens = top(np.tile(forced_logprobs(v, forced).astype(np.float32), (k, 1)), keep)
        elif scored is not None:   # sorted best first: the first 2k of more are the 2k best
            values = np.stack([scored[b][0][:keep] for b in self.order])
            tokens = np.stack([scored[b][1][:keep] for b in self.order])
        else:
            values, tokens = top(np.stack([rows[b][:v] for b in self.order]), keep)
        flat = (np.arange(k)[:, None] * v + tokens).reshape(-1)
        by_index = np.argsort(flat, kind="stable")
        flat, scores = flat[by_index], (values + self.scores[:, None]).reshape(-1)[by_index].astype(np.float32)
        best_of = _top(scores, keep)
        top_scores, parent, token = scores[best_of], flat[best_of] // v, flat[best_of] % v
        step_logprobs = values.reshape(-1)[by_index][best_of]
        length = self.steps + 1
        hits = (token == opts.eos_id) if opts.eos_id is not None else np.zeros(keep, bool)
        if length >= opts.max_new_tokens:
            hits = np.ones(keep, bool)
        candidates = [self.tokens[self.order[p]] + [int(t)] for p, t in zip(parent, token)]
        candidate_logprobs = [self.logprobs[self.order[p]] + [float(lp)] for p, lp in zip(parent, step_logprobs)]
        # The k best candidates that go on.
        running = (top_scores + hits.astype(np.float32) * _NEG).astype(np.float32)
        chosen = _top(running, k)
        # Finished hypotheses: candidates among the best k that ended, if they beat the worst kept one.
        scored = _normalised(top_scores, length, opts.length_penalty)
        if self.finished_flags.all() and opts.early_stopping is True:
            scored = scored + _NEG
        if not self.improvable:
            scored = scored + _NEG
        just = hits & (np.arange(keep) < k)
        scored = (scored + (~just).astype(np.float32) * _NEG).astype(np.float32)
        merged = np.concatenate([self.finished_scores, scored])
        best = _top(merged, k)
        merged_tokens = self.finished_tokens + candidates
        merged_logprobs = self.finished_logprobs + candidate_logprobs
        merged_flags = np.concatenate([self.finished_flags, just])
        self.finished_scores = merged[best]
        self.finished_tokens = [merged_tokens[i] for i in best]
        self.finished_logprobs = [merged_logprobs[i] for i in best]
        self.finished_flags = merged_flags[best]
        copies = self._reorder([int(parent[c]) for c in chosen], [candidates[c] for c in chosen],
                               [candidate_logprobs[c] for c in chosen], written)
        self.scores = running[chosen]
        self.steps = length
        # Whether any running hypothesis may still beat the worst finished one.
        hypothetical = opts.max_new_tokens if (opts.early_stopping == "never" and opts.length_penalty > 0) else length
        best_possible = _normalised(self.scores[:1], hypothetical, opts.length_penalty)[0]
        worst = np.where(self.finished_flags, self.finished_scores.min(), _NEG)
        self.improvable = self.improvable and bool((best_possible > worst).any())
        full = bool(self.finished_flags.all()) and opts.early_stopping is True
        self.stopped = not self.improvable or full or bool(hits.all())
        return [] if self.stopped else copies

    def _reorder(self, parents: list[int], hypotheses: list[list[int]], logprobs: list[list[float]],
                 written: int) -> list[Copy]:
        """Hypothesis j continues hypothesis parents[j]: it stays in that one's beam when no better continuation
        took it, else it takes a beam whose hypothesis was dropped, with a copy of the parent's rows."""
        k = self.options.num_beams
        claimed: dict[int, int] = {}                     # beam -> new hypothesis
        homeless = []
        for j, p in enumerate(parents):
            beam = self.order[p]
            if beam in claimed:
                homeless.append(j)
            else:
                claimed[beam] = j
        free = [b for b in range(k) if b not in claimed]
        copies = []
        for j, beam in zip(homeless, free):
            source = self.beams[self.order[parents[j]]].slot
            copies.append(Copy(source, self.beams[beam].slot, written))
            claimed[beam] = j
        order = [0] * k
        for beam, j in claimed.items():
            order[j] = beam
            self.tokens[beam], self.logprobs[beam] = hypotheses[j], logprobs[j]
        self.order = order
        return copies

    # ------------------------------------------------------------------ the answers (event loop)

    def finish(self, reason: str | None = None) -> None:
        """Each request gets the hypothesis of its rank among the finished ones, best first. A search cut short
        (`reason`: a deadline, the engine stopping) answers with what it has: finished hypotheses, then running
        ones."""
        ranked = [(self.finished_tokens[i], self.finished_logprobs[i]) for i in range(len(self.finished_tokens))
                  if self.finished_flags[i]]
        ranked += [(self.tokens[b], self.logprobs[b]) for b in self.order]
        for request in self.requests:
            tokens, logprobs = ranked[request.params.beam_rank]
            if request.done:
                continue
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
        for state in self.states:
            if state.status is Status.PREFILLING:
                scheduler.prefilled(Chunk(state, 0, state.prompt_len))
        for request in self.requests:
            if not (request.done or request.cancelled):
                count_token(request)


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
    def generated(self) -> list[int]:
        return self.search.tokens[self.index]

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


# Logits per call of the beam scores' graph (beam_scores.py), as rows x vocabulary: rows of a large vocabulary stay
# in a core's cache in small blocks (four rows of the OPUS-MT shape's) and not in large ones, while a small
# vocabulary's rows are better scored many to a call, each call's own cost being the larger part (bench/FINDINGS.md
# has the sizes tried).
BEAM_BLOCK = 4 * 65_536


class BeamStrategy:
    """Every beam search's rows of a step: their top log-probabilities scored together (in blocks of at most
    BEAM_BLOCK logits over slices of the logits, no copy where the rows are consecutive, as a batch of searches' decode rows
    are), then each search's step; the copies of all of them returned together (searches never share a slot)."""

    runs_ahead = False

    def plan(self, rows: list[StepRow], context: StepContext) -> Planned:
        searches: dict[BeamSearch, dict[int, StepRow]] = {}
        for row in rows:
            searches.setdefault(row.state.owner.search, {})[row.state.owner.index] = row
        out = Planned()
        try:
            scored = _scores([r for s, beams in searches.items() for b, r in beams.items() if s.steps or b == 0],
                             context.top)
        except Exception as exc:   # onnxruntime's own exception types: those searches fail, nothing else
            out.failed += [(s.states, "beam search step failed", exc) for s in searches]
            return out
        given = {search: {b: scored[id(r)] for b, r in beams.items() if id(r) in scored}
                 for search, beams in searches.items()}
        together: dict[tuple[int, int], list[BeamSearch]] = {}
        for search, beams in searches.items():
            stepped = [0] if search.steps == 0 else list(range(search.options.num_beams))   # as step() reads
            if sorted(beams)[:len(stepped)] == stepped and len(beams) >= len(stepped) \
                    and batchable(search, given[search]):
                together.setdefault((search.options.num_beams, search.vocab_size), []).append(search)
        alone = [s for s in searches if not any(s in group for group in together.values())]
        for group in together.values():
            try:
                copies = step_many(group, [searches[s][min(searches[s])].written for s in group],
                                   [given[s] for s in group])
            except Exception as exc:
                out.failed += [(s.states, "beam search step failed", exc) for s in group]
                continue
            out.copies += [(s.states, c) for s, c in zip(group, copies)]
            out.settles += group
        for search in alone:
            beams = searches[search]
            try:
                copies = search.step({b: r.logits for b, r in beams.items()}, beams[min(beams)].written,
                                     context.top, given[search])
            except Exception as exc:
                out.failed.append((search.states, "beam search step failed", exc))
                continue
            out.copies.append((search.states, copies))
            out.settles.append(search)
        return out


BEAMS = BeamStrategy()


def _scores(rows: list[StepRow], top: TopLogprobs) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """id(row) -> the row's 2k best log-probabilities and ids, k the widest search's; in calls of at most
    BEAM_BLOCK logits, each a slice of one block where the rows are consecutive in it (bench/FINDINGS.md)."""
    if not rows:
        return {}
    search = max((r.state.owner.search for r in rows), key=lambda s: s.options.num_beams)
    vocab, keep = search.vocab_size, 2 * search.options.num_beams
    per_call = max(1, BEAM_BLOCK // vocab)
    ordered = sorted(rows, key=lambda r: (id(r.block), r.index))
    out: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for lo in range(0, len(ordered), per_call):
        part = ordered[lo:lo + per_call]
        block, first = part[0].block, part[0].index
        if all(r.block is block and r.index == first + i for i, r in enumerate(part)):
            values, ids = top(block[first:first + len(part), :vocab], keep)
        else:
            values, ids = top(np.stack([r.logits[:vocab] for r in part]), keep)
        out.update((id(r), (values[i], ids[i])) for i, r in enumerate(part))
    return out


def numpy_top(logits: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Per row: the n largest log-softmax values and their ids, best first, ties to the lower id (beam_scores'
    graph does the same in one onnxruntime call)."""
    x = logits.astype(np.float32)
    shifted = x - x.max(axis=1, keepdims=True)
    logp = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    ids = np.argsort(-logp, axis=1, kind="stable")[:, :n]
    return np.take_along_axis(logp, ids, axis=1), ids


def _top(scores: np.ndarray, n: int) -> np.ndarray:
    """Indices of the n largest scores, best first, ties by lower index. Over beams x vocabulary (as it once ran)
    a full sort was most of a beam step (bench/FINDINGS.md): partition first, then sort the few that reach the
    n-th largest score (all of them, so ties at the edge still go to the lower index)."""
    if n >= scores.size:
        return np.argsort(-scores, kind="stable")[:n]
    edge = np.partition(scores, scores.size - n)[scores.size - n]      # the n-th largest
    near = np.flatnonzero(scores >= edge)                               # ascending indices
    return near[np.argsort(-scores[near], kind="stable")][:n]
