"""Per-request generation parameters and the engine's configuration, validated up front.

Every error is a ValueError whose message starts with the offending field
("parameters.top_p: must be in (0, 1]"), so the gRPC layer can answer INVALID_ARGUMENT verbatim.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from server.structured import Constraint, check_constraint

# Defaults and limits mirror protos/ortserve.proto (GenerationParameters).
DEFAULT_MAX_NEW_TOKENS = 32
MAX_TOP_LOGPROBS = 20
MAX_STOP_SEQUENCES = 16
MAX_STOP_LENGTH = 256
MAX_STOP_TOKEN_IDS = 64
MAX_LOGIT_BIAS = 300        # entries (OpenAI's own limit)
PENALTY_RANGE = 2.0         # presence / frequency penalties lie in [-2, 2], as OpenAI's
BIAS_RANGE = 100.0          # a logit bias lies in [-100, 100], as OpenAI's
_UINT64_LIMIT = 2 ** 64
MAX_BEAMS = 8
EARLY_STOPPING_NEVER = "never"
MAX_LANGUAGE_LENGTH = 64


def _is_int(value: Any) -> bool:
    # bool is an int subclass; True as a token count is a caller bug, not a 1.
    return isinstance(value, int) and not isinstance(value, bool)


def _int(name: str, value: Any, default: int, minimum: int, maximum: int | None = None) -> int:
    if value is None:
        return default
    if not _is_int(value):
        raise ValueError(f"parameters.{name}: must be an integer, got {type(value).__name__}")
    if value < minimum or (maximum is not None and value > maximum):
        bound = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
        raise ValueError(f"parameters.{name}: must be {bound}, got {value}")
    return int(value)


def _float(name: str, value: Any, default: float) -> float:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"parameters.{name}: must be a number, got {type(value).__name__}")
    if not math.isfinite(value):
        raise ValueError(f"parameters.{name}: must be finite, got {value}")
    return float(value)


def _bool(name: str, value: Any) -> bool:
    if value is None:
        return False
    if not isinstance(value, bool):
        raise ValueError(f"parameters.{name}: must be a boolean, got {type(value).__name__}")
    return value


@dataclass(frozen=True)
class GenerationParams:
    """What one request asks for. Build it with `validate`, which applies defaults and checks ranges."""

    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    temperature: float = 0.0          # 0 = greedy (argmax)
    top_k: int = 0                    # 0 = off
    top_p: float = 1.0                # 1 = off
    min_p: float = 0.0                # keep tokens at least min_p x the likeliest one's probability (0 = off)
    min_tokens: int = 0               # eos and stop_token_ids cannot be chosen before this many tokens
    repetition_penalty: float = 1.0   # 1 = off
    presence_penalty: float = 0.0     # subtracted once from every token generated so far (0 = off)
    frequency_penalty: float = 0.0    # subtracted per time a token was generated so far (0 = off)
    logit_bias: tuple[tuple[int, float], ...] = ()   # (token id, added to its logit), sorted by id
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None           # None = fresh entropy per request
    logprobs: bool = False
    top_logprobs: int = 0
    # Each prompt token's logprob given the ones before it, with this many top alternatives (None = off): what
    # OpenAI's echo + logprobs and vLLM's prompt_logprobs return, and what scoring a text needs.
    prompt_logprobs: int | None = None
    truncate_prompt: bool = False
    ignore_eos: bool = False
    # Beam search (server/generation/beams.py): beams per request (1 = off), the score's
    # length penalty (sum of logprobs / length ** length_penalty) and when a search ends (True: once num_beams
    # hypotheses are finished; False: when no running beam can beat them at its current length; "never": nor at
    # max_new_tokens), as transformers' generate takes them.
    num_beams: int = 1
    length_penalty: float = 1.0
    early_stopping: bool | str = False
    # Which hypothesis of the search answers (0 = the best): jobs of one request that differ only in it are ONE
    # search (OpenAI's n asks ranks 0..n-1 of a prompt: its n best hypotheses).
    beam_rank: int = 0
    # Translation models: the language token forced as the first generated token (None: the model's default);
    # checked against the model's languages by its input processing (source.SourceProcessor).
    target_language: str | None = None
    # ... and the language token of the source text (None: the tokenizer's default), put where the tokenizer puts it.
    source_language: str | None = None
    # max_new_tokens was not asked for: an encoder-decoder whose target length is shorter than the default
    # generates what its target length holds instead of refusing (source.SourceProcessor.fit).
    default_max_new_tokens: bool = False
    # Structured output (server/structured/): every generated token is one the constraint's grammar allows, and the
    # answer ends (end-of-text) only where the grammar accepts it. None: unconstrained.
    constraint: Constraint | None = None
    # Streamed tokens per message after the first (vLLM's per-request stream_interval): raises the server's
    # --stream-interval for this request, never lowers it (None: the server's). The first token and the last
    # message go at once; a client that wants the first token early and the rest whole asks for max_new_tokens.
    stream_interval: int | None = None

    @classmethod
    def validate(cls, *, max_new_tokens: int | None = None, temperature: float | None = None,
                 top_k: int | None = None, top_p: float | None = None, min_p: float | None = None,
                 min_tokens: int | None = None, repetition_penalty: float | None = None,
                 presence_penalty: float | None = None,
                 frequency_penalty: float | None = None, logit_bias: Mapping[int | str, float] | None = None,
                 stop: Sequence[str] | None = None, stop_token_ids: Sequence[int] | None = None,
                 seed: int | None = None,
                 logprobs: bool | None = None, top_logprobs: int | None = None,
                 prompt_logprobs: int | None = None, truncate_prompt: bool | None = None,
                 ignore_eos: bool | None = None, num_beams: int | None = None, length_penalty: float | None = None,
                 early_stopping: bool | str | None = None, beam_rank: int | None = None,
                 target_language: str | None = None, source_language: str | None = None,
                 constraint: Constraint | None = None,
                 stream_interval: int | None = None) -> "GenerationParams":
        """None means the default. Raises ValueError naming the first bad field."""
        temp = _float("temperature", temperature, 0.0)
        if temp < 0:
            raise ValueError(f"parameters.temperature: must be >= 0, got {temp}")
        p = _float("top_p", top_p, 1.0)
        if not 0 < p <= 1:
            raise ValueError(f"parameters.top_p: must be in (0, 1], got {p}")
        penalty = _float("repetition_penalty", repetition_penalty, 1.0)
        if penalty <= 0:
            raise ValueError(f"parameters.repetition_penalty: must be > 0, got {penalty}")
        minimum_p = _float("min_p", min_p, 0.0)
        if not 0 <= minimum_p <= 1:
            raise ValueError(f"parameters.min_p: must be in [0, 1], got {minimum_p}")
        new_tokens = _int("max_new_tokens", max_new_tokens, DEFAULT_MAX_NEW_TOKENS, 1)
        at_least = _int("min_tokens", min_tokens, 0, 0)
        if at_least > new_tokens:
            raise ValueError(f"parameters.min_tokens: must not exceed the tokens asked for ({new_tokens}), got {at_least}")
        if seed is not None and (not _is_int(seed) or not 0 <= seed < _UINT64_LIMIT):
            raise ValueError(f"parameters.seed: must be an integer in [0, 2**64), got {seed!r}")
        if early_stopping is not None and not isinstance(early_stopping, bool) \
                and early_stopping != EARLY_STOPPING_NEVER:
            raise ValueError(f"parameters.early_stopping: must be true, false or {EARLY_STOPPING_NEVER!r}, "
                             f"got {early_stopping!r}")
        params = cls(
            max_new_tokens=new_tokens,
            temperature=temp,
            top_k=_int("top_k", top_k, 0, 0),
            top_p=p,
            min_p=minimum_p,
            min_tokens=at_least,
            repetition_penalty=penalty,
            presence_penalty=_penalty("presence_penalty", presence_penalty),
            frequency_penalty=_penalty("frequency_penalty", frequency_penalty),
            logit_bias=_logit_bias(logit_bias),
            stop=_stop_sequences(stop),
            stop_token_ids=_stop_token_ids(stop_token_ids),
            seed=seed,
            logprobs=_bool("logprobs", logprobs),
            top_logprobs=_int("top_logprobs", top_logprobs, 0, 0, MAX_TOP_LOGPROBS),
            prompt_logprobs=None if prompt_logprobs is None
            else _int("prompt_logprobs", prompt_logprobs, 0, 0, MAX_TOP_LOGPROBS),
            truncate_prompt=_bool("truncate_prompt", truncate_prompt),
            ignore_eos=_bool("ignore_eos", ignore_eos),
            num_beams=_int("num_beams", num_beams, 1, 1, MAX_BEAMS),
            length_penalty=_float("length_penalty", length_penalty, 1.0),
            early_stopping=False if early_stopping is None else early_stopping,
            default_max_new_tokens=max_new_tokens is None,
            beam_rank=_int("beam_rank", beam_rank, 0, 0),
            target_language=_language("target_language", target_language),
            source_language=_language("source_language", source_language),
            constraint=_constraint(constraint),
            stream_interval=None if stream_interval is None else _int("stream_interval", stream_interval, 1, 1),
        )
        if params.beam_rank >= params.num_beams:
            raise ValueError(f"parameters.beam_rank: a search of {params.num_beams} beams has hypotheses 0.."
                             f"{params.num_beams - 1}, got {params.beam_rank}")
        if params.num_beams > 1:
            _check_beam_params(params)
        if params.constraint is not None:
            _check_constrained(params)
        return params

    @property
    def wants_logprobs(self) -> bool:
        # Asking for top-n alternatives implies the chosen token's logprob too.
        return self.logprobs or self.top_logprobs > 0


# What beam search takes besides its own fields: the rest changes how one token is drawn, and a beam search draws
# none (its selection is over every beam's log-softmax; transformers' logits processors are not served here).
_NOT_WITH_BEAMS = (("temperature", 0.0), ("top_k", 0), ("top_p", 1.0), ("min_p", 0.0), ("min_tokens", 0),
                   ("repetition_penalty", 1.0), ("presence_penalty", 0.0), ("frequency_penalty", 0.0),
                   ("logit_bias", ()), ("stop", ()), ("stop_token_ids", ()),
                   ("top_logprobs", 0), ("prompt_logprobs", None))


def _check_beam_params(params: "GenerationParams") -> None:
    for name, off in _NOT_WITH_BEAMS:
        if getattr(params, name) != off:
            raise ValueError(f"parameters.{name}: not served with num_beams > 1 (beam search keeps the likeliest "
                             f"hypotheses; it samples nothing), got {getattr(params, name)!r}")


def _constraint(value: Any) -> Constraint | None:
    if value is not None:
        check_constraint(value)
    return value


def _check_constrained(params: "GenerationParams") -> None:
    # A constrained answer ends where its grammar accepts it, with the end-of-text token: what would forbid or
    # ignore that token, or choose among beams, leaves the grammar no way to end.
    field = params.constraint.field     # type: ignore[union-attr]
    for name, off in (("ignore_eos", False), ("min_tokens", 0), ("num_beams", 1)):
        if getattr(params, name) != off:
            raise ValueError(f"parameters.{name}: not served with a structured-output constraint ({field}): the "
                             f"answer ends where the grammar accepts it, got {getattr(params, name)!r}")


def _language(name: str, value: Any) -> str | None:
    """A language token's spelling; "" (proto3's unset string) is no language."""
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ValueError(f"{name}: must be a string (a language token such as \"fra_Latn\"), "
                         f"got {type(value).__name__}")
    if len(value) > MAX_LANGUAGE_LENGTH:
        raise ValueError(f"{name}: at most {MAX_LANGUAGE_LENGTH} characters, got {len(value)}")
    return value


def _penalty(name: str, value: Any) -> float:
    penalty = _float(name, value, 0.0)
    if not -PENALTY_RANGE <= penalty <= PENALTY_RANGE:
        raise ValueError(f"parameters.{name}: must be in [-{PENALTY_RANGE:g}, {PENALTY_RANGE:g}], got {penalty}")
    return penalty


def _logit_bias(bias: Mapping[int | str, float] | None) -> tuple[tuple[int, float], ...]:
    """Keys are token ids, as ints or as the decimal strings a JSON object's keys are (OpenAI's "50256")."""
    if bias is None:
        return ()
    if not isinstance(bias, Mapping):
        raise ValueError(f"parameters.logit_bias: must be a map of token id to bias, got {type(bias).__name__}")
    if len(bias) > MAX_LOGIT_BIAS:
        raise ValueError(f"parameters.logit_bias: at most {MAX_LOGIT_BIAS} entries, got {len(bias)}")
    out = []
    for key, value in bias.items():
        token = int(key) if isinstance(key, str) and key.isascii() and key.isdigit() else key
        if not _is_int(token) or token < 0:
            raise ValueError(f"parameters.logit_bias: keys must be non-negative token ids, got {key!r}")
        b = _float(f"logit_bias[{token}]", value, 0.0)
        if not -BIAS_RANGE <= b <= BIAS_RANGE:
            raise ValueError(f"parameters.logit_bias[{token}]: must be in [-{BIAS_RANGE:g}, {BIAS_RANGE:g}], got {b}")
        out.append((int(token), b))
    return tuple(sorted(out))


def _stop_sequences(stop: Sequence[str] | None) -> tuple[str, ...]:
    if stop is None:
        return ()
    if isinstance(stop, str):
        raise ValueError("parameters.stop: must be a list of strings, got a single string")
    items = tuple(stop)
    if len(items) > MAX_STOP_SEQUENCES:
        raise ValueError(f"parameters.stop: at most {MAX_STOP_SEQUENCES} sequences, got {len(items)}")
    for i, s in enumerate(items):
        if not isinstance(s, str):
            raise ValueError(f"parameters.stop[{i}]: must be a string, got {type(s).__name__}")
        if not s:
            raise ValueError(f"parameters.stop[{i}]: must not be empty")
        if len(s) > MAX_STOP_LENGTH:
            raise ValueError(f"parameters.stop[{i}]: at most {MAX_STOP_LENGTH} characters, got {len(s)}")
    return items


def _stop_token_ids(ids: Sequence[int] | None) -> tuple[int, ...]:
    if ids is None:
        return ()
    items = tuple(ids)
    if len(items) > MAX_STOP_TOKEN_IDS:
        raise ValueError(f"parameters.stop_token_ids: at most {MAX_STOP_TOKEN_IDS} ids, got {len(items)}")
    for i, t in enumerate(items):
        if not _is_int(t) or t < 0:
            raise ValueError(f"parameters.stop_token_ids[{i}]: must be a non-negative integer, got {t!r}")
    return items


@dataclass(frozen=True)
class GenerationConfig:
    """Capacity of one engine (one loaded decoder). Requests beyond it get OverloadedError."""

    max_batch_size: int = 16         # sequences decoded together; = KV-cache slots of an in-place-cache model
    max_waiting: int = 64            # admitted requests not yet prefilled
    max_tokens_in_flight: int = 65536  # sum of (prompt + max_new_tokens) over waiting and active requests
    max_prefill_tokens: int = 1024   # padded prompt tokens (rows x longest chunk) per iteration when none decodes
    prefill_chunk_tokens: int = 20   # prompt tokens per iteration while others decode (in-place-cache models)
    arrival_window_ms: float = 5.0   # waking from idle: longest wait for simultaneous arrivals (0 = none)
    arrival_quiet_ms: float = 1.0    # ... which ends sooner once no request came for this long
    prefix_caching: bool = True      # new prompts starting with tokens a slot holds copy their keys/values
    # Tokens per streamed chunk after the first (1 = each token as it comes; n: the tokens of n steps in one chunk,
    # the last chunk whatever is left): each chunk costs a message on the door and the client (Sequence.send).
    stream_interval: int = 1
    # Decode steps one iteration may run back to back in the worker thread (executor.py) while no request waits,
    # no prompt is part-way in and no beam search runs: the loop's planning, hand-off and output work then comes
    # once per run instead of once per token. A request arriving (or leaving) stops the run after its current
    # step, so it waits at most one step longer than with 1. A run also stops before a step that would take it
    # past decode_run_ms (judged by the step before): a bound on how long a stream's tokens wait for their message.
    # 250, not less: every run sends each stream a message, and with a bound of about one fp32 step a run served
    # tokens/s fell against 250 (bench/FINDINGS.md).
    decode_steps: int = 16
    decode_run_ms: float = 250.0
    # When an iteration cannot run several steps (a request waits, a prompt goes in) and its step is short, the
    # worker thread computes the step after it while the loop applies its outcome, as vLLM's asynchronous
    # scheduling does (loop.py): the loop's work per step (outputs, admission, the doors' messages) overlaps the
    # step instead of taking turns with it, which is what limits a small model's steps. The price: a request that
    # arrives meanwhile waits one step more, and a row a stop string or a leaving consumer ends meanwhile computes
    # one token that is dropped. So it applies while the step before took under overlap_step_ms: a short step's
    # wait costs little, and on a long one the loop's work is a small part anyway. 0: never. Off with
    # decode_steps = 1 (one step an iteration). The server passes 0 where the onnxruntime threads take every core
    # (server/runtime_config.py): the loop's work then has no core of its own to overlap the step on.
    overlap_step_ms: float = 5.0
    # The served context (cache slot length) of each generation model: at most its package's max_length (the
    # self cache's, max_target_length, for an encoder-decoder), which a larger cap refuses at load; 0: the
    # package's. Smaller slots: less cache memory per slot (server/generation/context_cap.py).
    max_model_len: int = 0

    def __post_init__(self) -> None:
        for name in ("max_batch_size", "max_waiting", "max_tokens_in_flight", "max_prefill_tokens",
                     "prefill_chunk_tokens", "stream_interval", "decode_steps"):
            value = getattr(self, name)
            if not _is_int(value) or value < 1:
                raise ValueError(f"generation.{name}: must be an integer >= 1, got {value!r}")
        if not _is_int(self.max_model_len) or self.max_model_len < 0:
            raise ValueError(f"generation.max_model_len: must be an integer >= 0, got {self.max_model_len!r}")
        for name, top in (("decode_run_ms", 10_000), ("overlap_step_ms", 10_000), ("arrival_window_ms", 1000),
                          ("arrival_quiet_ms", 1000)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= top:
                raise ValueError(f"generation.{name}: must be in [0, {top}], got {value!r}")
        if not isinstance(self.prefix_caching, bool):
            raise ValueError(f"generation.prefix_caching: must be a boolean, got {self.prefix_caching!r}")
