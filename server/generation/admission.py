"""Admission: a request's sequences into the scheduler's queue together, or none of them.

A request is its jobs (prompt, parameters): prompts x n, or one beam search answering n identical jobs (its k beams
hold k slots). Admission checks what can never fit (ValueError naming the field) before any prompt is tokenized,
tokenizes the prompts (long ones off the event loop: inputs.py / source.py), then checks the token budget and the
room in the queue (OverloadedError: it could fit later), and only then queues every sequence. A consumer that goes
away (`abandon`) takes its waiting sequence out of the queue at once; a running one leaves at the loop's next
iteration.
"""
from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Callable

from server.structured.matcher import Grammars, RowMatcher, constraint_rows

from .beams import BeamOptions, BeamSearch
from .factory import EngineParts
from .params import GenerationConfig, GenerationParams
from .results import FINISH_CANCELLED, EngineStoppedError, OverloadedError
from .scheduler import Scheduler, SeqState, Status
from .sequence import Sequence

Job = tuple[str | list[int], GenerationParams]   # one sequence of a request: its prompt and parameters
# Characters of text prompts (or ids of token prompts) in one request above which they are tokenized and checked
# in a worker thread: below it that is cheap enough for the event loop.
INLINE_PROMPT_SIZE = 16_384


class Admission:
    """The engine's door into its scheduler. `running` says whether the engine serves; `changed` is called after
    the queue changed (the engine records its gauges and wakes its loop)."""

    def __init__(self, scheduler: Scheduler, parts: EngineParts, config: GenerationConfig, label: str,
                 running: Callable[[], bool], changed: Callable[[], None]) -> None:
        self._scheduler, self._config, self._label = scheduler, config, label
        self._inputs, self._tokenizer = parts.inputs, parts.tokenizer
        self._spec, self._source = parts.spec, parts.source
        self._running, self._changed = running, changed
        self.admitting = 0        # requests inside admit() (their prompts tokenized): load not yet in the queues
        self._grammars = Grammars(parts.tokenizer, parts.spec.vocab_size, parts.spec.eos_id)   # structured outputs

    async def admit(self, jobs: list[Job], deadline: float | None = None, field: str = "prompt") -> list[Sequence]:
        """A request's sequences (one per job) admitted together, or none of them: a request is refused before
        any of its sequences starts, never after some have (their tokens would be generated for nobody).

        What can never fit, whatever the load, is ValueError naming `field` (more sequences than the queue plus
        the running batch, more tokens than the whole budget); what could fit later is OverloadedError. The count
        is checked before any prompt is tokenized, and long prompts are tokenized off the event loop. A beam
        search counts its beams (each holds a slot)."""
        if not self._running():
            raise EngineStoppedError(f"generation engine {self._label} is not running")
        cfg = self._config
        if not jobs:
            raise ValueError(f"{field}: at least one prompt is required")
        jobs = [(prompt, self._inputs.fit(params)) for prompt, params in jobs]
        groups = self._groups(jobs)
        slots = sum(width for _, width in groups)
        most = cfg.max_waiting + cfg.max_batch_size
        if slots > most:
            raise ValueError(f"{field}: {slots} sequences in one request exceed the {most} this engine can ever "
                             f"hold at once (max_queued_requests {cfg.max_waiting} waiting + max_sequences "
                             f"{cfg.max_batch_size} running): this request can never be admitted; send fewer "
                             "prompts (or a lower n or num_beams) per request")
        # A constraint that cannot compile is refused before any prompt is tokenized.
        rows = await constraint_rows(self._grammars, [p.constraint for _, p in jobs], self._source is None)
        self.admitting += 1
        try:
            prompts = await self._encode(jobs)
        finally:
            self.admitting -= 1
        if not self._running():     # stopped while the prompts were tokenized
            raise EngineStoppedError(f"generation engine {self._label} is not running")
        if deadline is not None and deadline <= time.monotonic():
            raise TimeoutError("deadline passed before generation started")
        # An encoder-decoder's prompts are sources: each sequence also holds its decoder's start token.
        extra = 0 if self._source is None else 1
        need = sum((len(prompts[members[0]]) + extra + jobs[members[0]][1].max_new_tokens) * width
                   for members, width in groups)
        self._check_load(jobs, prompts, slots, need, field)
        seqs: dict[int, Sequence] = {}
        for members, width in groups:
            created = [self._sequence(prompts[i], jobs[i][1], deadline, rows[i]) for i in members]
            seqs.update(zip(members, (seq for seq, _ in created)))
            if width == 1 and jobs[members[0]][1].num_beams == 1:
                self._scheduler.add(created[0][1])
            else:
                self._add_search([seq for seq, _ in created])
        self._changed()
        return [seqs[i] for i in range(len(jobs))]

    def abandon(self, seq: Sequence) -> None:
        """The consumer went away: a waiting request leaves now, a running one at the next iteration."""
        seq.cancelled = True
        if seq.search is not None:     # a beam search stops when every request it answers went away
            if seq.search.cancelled and all(s.status is Status.WAITING for s in seq.search.states):
                for state in seq.search.states:
                    self._scheduler.finish(state)
                for request in seq.search.requests:
                    request.finish_reason = request.finish_reason or FINISH_CANCELLED
        elif seq.state is not None and seq.state.status is Status.WAITING:
            self._scheduler.finish(seq.state)
            seq.finish_reason = FINISH_CANCELLED
        self._changed()

    def _check_load(self, jobs: list[Job], prompts: list[list[int]], slots: int, need: int, field: str) -> None:
        """ValueError when `need` tokens exceed the whole budget; OverloadedError when the queue has no room for
        `slots` sequences now, or the tokens in flight leave no room for `need`."""
        cfg = self._config
        if need > cfg.max_tokens_in_flight:   # would be refused whatever the load: not worth a retry
            if len(jobs) == 1:
                raise ValueError(f"parameters.max_new_tokens: prompt {len(prompts[0])} tokens + max_new_tokens "
                                 f"{jobs[0][1].max_new_tokens} = {need} exceed max_tokens_in_flight "
                                 f"{cfg.max_tokens_in_flight} (this request can never be admitted; lower "
                                 "max_new_tokens or shorten the prompt)")
            raise ValueError(f"{field}: {len(jobs)} sequences need {need} tokens (prompt + max_new_tokens each), "
                             f"more than max_tokens_in_flight {cfg.max_tokens_in_flight} (this request can never "
                             "be admitted; send fewer prompts per request or lower max_new_tokens)")
        waiting = len(self._scheduler.waiting)
        room = cfg.max_waiting - waiting + max(0, cfg.max_batch_size - len(self._scheduler.running))
        if slots > room:
            needs = "" if slots == 1 else f"; this request has {slots} sequences and there is room for {room}"
            raise OverloadedError(f"generation queue of {self._label} is full ({waiting} waiting, max_queued_requests "
                                  f"{cfg.max_waiting}{needs}); retry later")
        in_flight = self._scheduler.reserved
        if in_flight + need > cfg.max_tokens_in_flight:
            raise OverloadedError(f"generation of {self._label} is at capacity: {in_flight} tokens in flight, "
                                  f"this request needs {need}, the limit is {cfg.max_tokens_in_flight}")

    def _sequence(self, ids: list[int], params: GenerationParams, deadline: float | None,
                  constraint: RowMatcher | None = None) -> tuple[Sequence, SeqState]:
        """One job's sequence (a decoder's prompt, or an encoder-decoder's source) and its scheduler state."""
        spec = self._spec
        if self._source is None:
            seq = Sequence.create(ids, params, self._tokenizer, spec.vocab_size, deadline, spec.eos_id,
                                  stream_interval=self._stream_interval(params), constraint=constraint)
            # A request scoring its prompt needs the logits at every prompt position, so none may come from a
            # copied prefix: its state does not track tokens (no reuse for it, nothing remembered of its slot).
            state = SeqState.of(ids, owner=seq) if params.prompt_logprobs is None else SeqState(len(ids), owner=seq)
            state.reserve = seq.budget
            seq.state = state
            return seq, state
        prompt = [self._source.start_id]
        seq = Sequence.create(prompt, params, self._tokenizer, spec.vocab_size, deadline, spec.eos_id,
                              source_ids=ids,
                              forced=self._source.forced(params.max_new_tokens, params.target_language),
                              stream_interval=self._stream_interval(params))
        # Its keys/values depend on its source: no tokens tracked, nothing reused or remembered of its slot.
        seq.state = state = SeqState(len(prompt), owner=seq, source=len(ids), reserve=seq.budget)
        return seq, state

    def _stream_interval(self, params: GenerationParams) -> int:
        # A request may ask for fewer, larger messages than the server sends (vLLM's rule), not for more.
        return max(self._config.stream_interval, params.stream_interval or 1)

    def _add_search(self, requests: list[Sequence]) -> None:
        """One beam search answering `requests` (identical jobs): its beams wait as one gang of states."""
        params = requests[0].params
        forced = {} if self._source is None else self._source.forced(params.max_new_tokens, params.target_language)
        search = BeamSearch(requests, BeamOptions(num_beams=params.num_beams, length_penalty=params.length_penalty,
                                                  early_stopping=params.early_stopping,
                                                  max_new_tokens=params.max_new_tokens,
                                                  eos_id=None if params.ignore_eos else self._spec.eos_id,
                                                  forced=forced),
                            self._spec.vocab_size, self._tokenizer)
        for request in requests:
            request.search, request.state = search, None
        source = len(requests[0].source_ids or ())
        for beam in search.beams:
            first = beam.index == 0
            # The prompt is prefilled once, in beam 0's slot; the first step's copies bring it to the others
            # (beams.py). The source is encoded into every beam's slot (the encoder step's row names them all).
            beam.state = SeqState(len(search.prompt_ids), owner=beam, source=source if first else 0,
                                  gang=params.num_beams if first else 1, reserve=beam.budget, follows=not first)
            self._scheduler.add(beam.state)

    def _groups(self, jobs: list[Job]) -> list[tuple[list[int], int]]:
        """The request's jobs as (job indices, slots): one each, except beam searches — consecutive jobs with
        num_beams > 1 that differ only in beam_rank (OpenAI's n: ranks 0..n-1; seeds aside) are one search of
        num_beams slots answering them all. ValueError naming parameters.num_beams where beams cannot be served."""
        groups: list[tuple[list[int], int]] = []
        for i, (prompt, params) in enumerate(jobs):
            if self._source is not None and params.prompt_logprobs is not None:
                raise ValueError("parameters.prompt_logprobs: an encoder-decoder's prompt is its source, which its "
                                 f"decoder does not score ({self._label} scores only what it writes: logprobs)")
            k = params.num_beams
            if k == 1:
                groups.append(([i], 1))
                continue
            if k > self._config.max_batch_size:
                raise ValueError(f"parameters.num_beams: {k} beams need {k} cache slots, this engine has "
                                 f"max_sequences {self._config.max_batch_size}")
            if groups and groups[-1][1] > 1:
                first_prompt, first_params = jobs[groups[-1][0][0]]
                ranks = {jobs[j][1].beam_rank for j in groups[-1][0]}
                if prompt == first_prompt and _same_search(params, first_params) and params.beam_rank not in ranks:
                    groups[-1][0].append(i)
                    continue
            groups.append(([i], k))
        return groups

    async def _encode(self, jobs: list[Job]) -> list[list[int]]:
        """Each job's prompt ids (checked); a request with much text to tokenize (or many ids to check) is
        processed in a worker thread (tokenizers' encode_batch releases the GIL), not on the event loop."""
        size = sum(len(prompt) for prompt, _ in jobs)
        if size <= INLINE_PROMPT_SIZE:
            return self._inputs.encode_many(jobs, batched=False)
        return await asyncio.get_running_loop().run_in_executor(None, self._inputs.encode_many, jobs)


def _same_search(a: GenerationParams, b: GenerationParams) -> bool:
    """Two jobs answered by one beam search: the same parameters but the rank answered and the seed (a search
    draws nothing)."""
    return dataclasses.replace(a, seed=None, beam_rank=0) == dataclasses.replace(b, seed=None, beam_rank=0)
