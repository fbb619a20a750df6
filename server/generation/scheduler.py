"""The slot scheduler: plans each iteration of the in-place-cache engine. Pure Python, no onnxruntime.

A sequence owns one cache slot from admission to finish. Each iteration the scheduler says
  - which sequences decode one token (every DECODING one: running streams never wait), and
  - which prompt tokens are prefilled, in calls the graph can run:
      * a *first-prompt group*: new sequences (nothing cached yet) in one contiguous run of slots, their
        first chunks right-padded to the group's width — arrivals of the same instant go together;
      * a *continuation*: one partly prefilled sequence, its next chunk alone (the attention op takes a
        past only at batch 1 when more than one token is new).
The prefill budget is `chunk_tokens` while anyone decodes (so a long prompt is cut into chunks that
interleave with the running streams) and `max_prefill_tokens` otherwise (a lone prompt goes at once) — or when
more requests could be admitted than are decoding: then the waiting outnumber the streams one longer step
stalls, and prefilling them together (one pass over the weights for all, a wider decode batch from the next
step on) beats admitting them a chunk at a time while they wait (streams sent at once reach the engine in groups,
and the later ones waited long for their first tokens, one chunk at a time: docs/BENCHMARKS.md, bursts).
Padded positions count against the budget: they cost compute like real ones. A prompt longer than the
budget is cut into the fewest chunks that fit it, of equal size (no chunk over the budget, no tiny tail).

A prompt chunk of ONE token (a prompt whose rest after a reused prefix is its last token, a one-token
prompt) is not a call of its own: it rides the decode call as one more row (`Plan.tails`), since a decode row
is exactly a one-token step at the slot's next position, and a call of its own would pay a whole pass over the
weights for it.

Prefix reuse (with `prefix_reuse`): a slot set free keeps its keys/values, and the scheduler remembers the
tokens behind them; a running sequence's slot holds the keys/values of its computed tokens. A new sequence whose
prompt starts with tokens some slot holds (at least `min_reuse_tokens`) does not prefill them: the plan copies
that prefix into the sequence's slot (or finds it there already) and prefills the rest as a continuation. It is
exact for a causal decoder: the keys/values at a position depend only on the tokens up to it, and a running
owner only writes past its computed tokens. A prompt that shares more with a running sequence than that one has
computed yet (requests with one system prompt sent together, OpenAI's `n` completions of one prompt) waits
until it has, rather than computing the same prefix twice side by side. Slots are still taken lowest first, so
the decode calls stay as narrow as without reuse; a free slot's remembered prefix is dropped when the slot is
taken, and a decode call's throw-away writes land just past it (`free_write_positions`), never inside.

Encoder-decoder packages (seq2seq): a sequence may bring a *source* (`SeqState.source` tokens) that the encoder
graph turns into cross-attention keys/values when the sequence is admitted, before any call of that iteration
(`Plan.encode`: every sequence admitted this iteration with a source, encoded in one batch). The encoder's padded
tokens (rows x longest source) count against the same budget as prompt chunks; a source is never cut (the
encoder sees it whole), so the first arrival of an iteration is admitted whatever its source's length. Waiting
sources take `max_prefill_tokens` even while others decode: the chunk budget exists to cut long prompts into
pieces beside the running streams, and a source cannot be cut, so under it the free slots would fill one source
an iteration. The running streams pay one longer step instead (the encoder over the admitted sources). Its
decoder prompt (the start token) is a one-token first chunk: it rides the decode call. Prefix reuse does not
apply: a slot's keys/values depend on the source, so such sequences track no tokens.

A *gang* (`SeqState.gang` = n on the first of n consecutive waiting sequences: the beams of one beam search) is
admitted together or not at all, into n free slots at once, so all its beams step in the same iterations. Members
that `follow` (a decoder's beams but the first) prefill nothing: the gang's first carries the prompt, and its
strategy copies it into their slots.

The executor runs the plan; a sequence's status moves WAITING → PREFILLING → DECODING → FINISHED
through the methods below, which the engine calls as results come back.
"""
from __future__ import annotations

import enum
import itertools
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Iterable


class Status(enum.Enum):
    WAITING = "waiting"          # admitted to the queue, no slot yet
    PREFILLING = "prefilling"    # has a slot; part of its prompt is cached
    DECODING = "decoding"        # prompt cached; one token per iteration
    FINISHED = "finished"        # slot returned


@dataclass(eq=False)
class SeqState:
    """What the scheduler tracks of one sequence. `owner` is the engine's request object."""

    prompt_len: int
    owner: Any = None
    status: Status = Status.WAITING
    slot: int | None = None
    computed: int = 0            # tokens whose keys/values are in the slot
    # The ids written (or to be written) into the slot: the prompt, then every decoded input token. Empty =
    # not tracked: the slot's contents are not remembered and no prefix is reused for it.
    tokens: list[int] = field(default_factory=list)
    reused: int = 0              # prompt tokens found cached at admission (not prefilled)
    source: int = 0              # source tokens the encoder runs at admission (seq2seq; 0 = none)
    gang: int = 1                # this and the next gang - 1 waiting sequences are admitted together (beams)
    reserve: int = 0             # tokens its request may hold (prompt + max_new_tokens + source): admission's count
    # A gang member whose prompt comes by a copy from the gang's first (a decoder's beam search: beams.py): it
    # takes its slot with the gang and prefills nothing; its strategy makes it DECODING (`prefilled`).
    follows: bool = False

    @classmethod
    def of(cls, prompt: list[int], owner: Any = None) -> "SeqState":
        return cls(prompt_len=len(prompt), owner=owner, tokens=list(prompt))

    @property
    def remaining_prompt(self) -> int:
        return self.prompt_len - self.computed


@dataclass(frozen=True)
class Chunk:
    """Prompt tokens [start, start + length) of `seq`, written into its slot at those positions."""

    seq: SeqState
    start: int
    length: int

    @property
    def completes_prompt(self) -> bool:
        return self.start + self.length == self.seq.prompt_len


@dataclass(frozen=True)
class PrefillCall:
    """One graph call: chunks in consecutive slots (first slot = `first_slot`), padded to `width`."""

    chunks: tuple[Chunk, ...]
    first_prompt: bool           # every chunk starts at 0 (several rows allowed); else exactly one chunk

    @property
    def first_slot(self) -> int:
        return min(c.seq.slot for c in self.chunks)  # type: ignore[type-var]

    @property
    def width(self) -> int:
        return max(c.length for c in self.chunks)

    @property
    def padded_tokens(self) -> int:
        return self.width * len(self.chunks)


@dataclass(frozen=True)
class Copy:
    """Positions [0, length) of slot `source` copied into slot `target` before the iteration's calls."""

    source: int
    target: int
    length: int


@dataclass(frozen=True)
class Plan:
    decode: tuple[SeqState, ...] = ()
    prefill: tuple[PrefillCall, ...] = ()
    copies: tuple[Copy, ...] = ()
    reused_tokens: int = 0       # prompt tokens admitted sequences found cached (copied or in place)
    tails: tuple[Chunk, ...] = ()   # one-token prompt chunks, run as rows of the decode call
    encode: tuple[SeqState, ...] = ()   # admitted with a source: encoded before the iteration's calls

    @property
    def empty(self) -> bool:
        return not self.decode and not self.prefill and not self.tails

    @property
    def encode_tokens(self) -> int:
        """The encoder call's padded tokens (rows x longest source)."""
        return max((s.source for s in self.encode), default=0) * len(self.encode)

    @property
    def prefill_tokens(self) -> int:
        return sum(c.length for call in self.prefill for c in call.chunks) + len(self.tails)


@dataclass
class SchedulerConfig:
    num_slots: int
    chunk_tokens: int = 32           # prefill tokens per iteration while some sequence decodes
    max_prefill_tokens: int = 1024   # prefill tokens (padded) per iteration when none decodes
    prefix_reuse: bool = False       # prompts starting with tokens a slot holds (free or running) copy them
    # A reused prefix runs its remaining prompt as a continuation, alone (a first-prompt group is one call for
    # several rows): below this many tokens that extra call costs more than the prefix saves.
    min_reuse_tokens: int = 16
    slot_length: int = 1 << 30       # positions per slot (a remembered prefix leaves the last one free)

    def __post_init__(self) -> None:
        for name in ("num_slots", "chunk_tokens", "max_prefill_tokens", "min_reuse_tokens", "slot_length"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name}: must be an integer >= 1, got {value!r}")


@dataclass
class Scheduler:
    config: SchedulerConfig
    waiting: deque[SeqState] = field(default_factory=deque)
    running: list[SeqState] = field(default_factory=list)     # PREFILLING and DECODING, admission order

    def __post_init__(self) -> None:
        self._free = list(range(self.config.num_slots))         # kept sorted: lowest slots first
        self._held: dict[int, list[int]] = {}                   # free slot -> tokens its keys/values hold
        self.reserved = 0    # the reserve of every waiting and running sequence (kept, not summed per request)

    # ------------------------------------------------------------------ membership

    @property
    def free_slots(self) -> int:
        return len(self._free)

    @property
    def occupied_slots(self) -> int:
        return self.config.num_slots - len(self._free)

    def add(self, seq: SeqState) -> None:
        if seq.status is not Status.WAITING:
            raise ValueError(f"only a waiting sequence can be added, got {seq.status.value}")
        self.waiting.append(seq)
        self.reserved += seq.reserve

    def finish(self, seq: SeqState, reusable: bool = True) -> None:
        """The sequence ends (done, cancelled, failed) in whatever state: its slot is free at once.

        reusable=False: what the slot holds is not to be trusted (a failed run), so it is not remembered."""
        if seq.status is Status.FINISHED:
            return
        self.reserved -= seq.reserve
        if seq.status is Status.WAITING:
            self.waiting.remove(seq)
        else:
            self.running.remove(seq)
            self._release(seq.slot)
            held = min(seq.computed, self.config.slot_length - 1)
            if reusable and self.config.prefix_reuse and held > 0 and len(seq.tokens) >= held:
                self._held[seq.slot] = seq.tokens[:held]   # type: ignore[index]
        seq.status, seq.slot = Status.FINISHED, None

    def prefilled(self, chunk: Chunk) -> None:
        """The executor wrote the chunk: advance the sequence (DECODING once its whole prompt is in)."""
        seq = chunk.seq
        if seq.status is Status.FINISHED:
            return
        seq.computed = chunk.start + chunk.length
        seq.status = Status.DECODING if seq.computed >= seq.prompt_len else Status.PREFILLING

    def decoded(self, seq: SeqState, token: int | None = None) -> None:
        """One more token (`token`, when the sequence's tokens are tracked) is in the slot."""
        if seq.status is Status.DECODING:
            if token is not None and len(seq.tokens) == seq.computed:
                seq.tokens.append(token)
            seq.computed += 1

    def free_write_positions(self) -> dict[int, int]:
        """Free slots holding a remembered prefix -> the first position past it (where a decode call's
        throw-away row may write without touching the prefix). Other free slots take position 0."""
        return {slot: len(tokens) for slot, tokens in self._held.items()}

    # ------------------------------------------------------------------ planning

    def plan(self) -> Plan:
        decode = tuple(s for s in self.running if s.status is Status.DECODING)
        admittable = min(len(self.waiting), len(self._free))
        # Sources (an encoder-decoder's arrivals) always take the large budget: one is never cut, so the chunk
        # budget would admit ONE source an iteration however many slots are free, and the decode calls would run
        # narrow while the queue trickles in (bench/FINDINGS.md, "Figures moved out of server/generation").
        sources_wait = bool(self.waiting) and self.waiting[0].source > 0
        budget = self.config.chunk_tokens if decode and admittable <= len(decode) and not sources_wait \
            else self.config.max_prefill_tokens
        calls: list[PrefillCall] = []
        # 1. Sequences already part-way through their prompt go first (first come, first served).
        for seq in self.running:
            if budget <= 0:
                break
            if seq.status is Status.PREFILLING and not seq.follows:
                n = _chunk(seq.remaining_prompt, budget)
                calls.append(PrefillCall((Chunk(seq, seq.computed, n),), first_prompt=False))
                budget -= n
        # 2. New arrivals into free slots, as many as the budget (counting padding) allows. One whose prompt
        #    starts with tokens a slot holds skips them: its rest runs as a continuation. A gang (beams) comes in
        #    whole or waits; sources to encode count their padded tokens too.
        admitted: list[Chunk] = []
        copies: list[Copy] = []
        encode: list[SeqState] = []
        reused_tokens = width = source_width = 0
        while self.waiting and self._free and budget - width * len(admitted) - source_width * len(encode) > 0:
            seq = self.waiting[0]
            gang = list(itertools.islice(self.waiting, seq.gang))
            if len(gang) > len(self._free):
                break    # a beam search waits for slots for all its beams
            source, reused, coming = self._cached_prefix(seq)
            if coming - reused >= self.config.min_reuse_tokens:
                break    # a running sequence is computing more of this prompt: wait for it, do not compute it twice
            encoding = [q for q in gang if q.source]
            filling = [q for q in gang if not q.follows]
            new_encode = max([source_width, *(q.source for q in encoding)]) * (len(encode) + len(encoding))
            if reused:
                rest = seq.prompt_len - reused
                n = _chunk(rest, budget - width * len(admitted))
                if n < rest and (calls or admitted):
                    break    # as below: a long rest waits for a budget of its own
            else:
                n = _chunk(seq.prompt_len, budget)
                cost = max(width, n) * (len(admitted) + len(filling)) + new_encode
                if (admitted or encode) and cost > budget:
                    break
                if not admitted and (n < seq.prompt_len or cost > budget) and calls:
                    break    # a new long prompt waits for a budget of its own rather than starting on scraps
            for member in gang:
                self.waiting.popleft()
                member.slot = self._take()
                member.status = Status.PREFILLING
                self.running.append(member)
            encode += encoding
            source_width = max([source_width, *(q.source for q in encoding)])
            if reused:
                if source != seq.slot:
                    copies.append(Copy(source, seq.slot, reused))
                seq.computed = seq.reused = reused
                reused_tokens += reused
                calls.append(PrefillCall((Chunk(seq, reused, n),), first_prompt=False))
                budget -= n
            else:
                for member in filling:
                    admitted.append(Chunk(member, 0, _chunk(member.prompt_len, budget)))
                width = max(width, *(c.length for c in admitted[-len(filling):]))
        if admitted:
            budget -= width * len(admitted)
            calls.extend(_contiguous_groups(admitted))
        # One-token chunks ride the decode call: a continuation's last token, a one-token first prompt (a seq2seq
        # start token), or a group of them (the call's rows are exactly decode rows at the slots' next positions).
        tails = tuple(c for call in calls if call.width == 1 for c in call.chunks)
        return Plan(decode=decode, prefill=tuple(call for call in calls if call.width != 1),
                    copies=tuple(copies), reused_tokens=reused_tokens, tails=tails, encode=tuple(encode))

    # ------------------------------------------------------------------ slots

    def _cached_prefix(self, seq: SeqState) -> tuple[int, int, int]:
        """(slot, tokens): the longest prefix of seq's prompt that a slot holds now, a free slot's remembered
        tokens or a running sequence's computed ones; (-1, 0) when none is long enough. Third: the longest
        prefix running sequences will hold once their prompts are in. At most prompt_len - 1 tokens each: the
        last prompt token is always run, for its logits."""
        if not self.config.prefix_reuse or not seq.tokens:
            return -1, 0, 0
        best, best_slot, coming = 0, -1, 0
        for slot, held in self._held.items():
            n = _common_prefix(seq.tokens, held)     # a waiting sequence's tokens are its prompt
            if n > best:
                best, best_slot = n, slot
        for other in self.running:
            if not other.tokens:
                continue
            n = _common_prefix(seq.tokens, other.tokens)
            coming = max(coming, n)
            if min(n, other.computed) > best:
                best, best_slot = min(n, other.computed), other.slot  # type: ignore[assignment]
        cap = seq.prompt_len - 1
        best, coming = min(best, cap), min(coming, cap)
        return (best_slot, best, coming) if best >= self.config.min_reuse_tokens else (-1, 0, coming)

    def _take(self) -> int:
        slot = self._free.pop(0)
        self._held.pop(slot, None)      # its owner overwrites it from now on
        return slot

    def _release(self, slot: int | None) -> None:
        if slot is None:
            return
        self._free.append(slot)
        self._free.sort()


def _chunk(remaining: int, budget: int) -> int:
    """Tokens to prefill now: all that remain if they fit the budget; else the rest cut into the fewest pieces
    that fit, of equal size. Never more than the budget (a step carrying a chunk is what stalls the running
    streams, so its size is the bound), and no tiny last piece (every run pays a whole pass over the weights):
    900 tokens at a budget of 28 go as 33 chunks of 27-28, not 32 of 28 and one of 4."""
    if remaining <= budget:
        return remaining
    pieces = -(-remaining // budget)
    return -(-remaining // pieces)


def _common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix; list slices compare in C, so bisect over them."""
    n = min(len(a), len(b))
    if n == 0 or a[0] != b[0]:
        return 0
    if a[:n] == b[:n]:
        return n
    lo, hi = 1, n          # a[:lo] == b[:lo] and a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def _contiguous_groups(chunks: Iterable[Chunk]) -> list[PrefillCall]:
    """First-prompt chunks split into runs of consecutive slots (one graph call binds one slice)."""
    ordered = sorted(chunks, key=lambda c: c.seq.slot)
    groups: list[list[Chunk]] = []
    for c in ordered:
        if groups and groups[-1][-1].seq.slot + 1 == c.seq.slot:
            groups[-1].append(c)
        else:
            groups.append([c])
    return [PrefillCall(tuple(g), first_prompt=True) for g in groups]
