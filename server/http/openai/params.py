"""A typed completion / chat request -> the GenerationParams of each completion it asks for (`n`).

OpenAI's defaults where they differ from the engine's (max_tokens 16, temperature 1), its limits (n), and
its field names in refusals (GenerationParams names its fields "parameters.<name>").
"""
from __future__ import annotations

import dataclasses

import msgspec

from server.protocol.errors import Code, ServingError
from server.generation import GenerationParams
from server.http.openai.protocol import SamplingRequest
from server.http.openai.structured import request_constraint
from server.structured import Constraint

DEFAULT_MAX_TOKENS = 16           # OpenAI's default for /v1/completions
DEFAULT_TEMPERATURE = 1.0         # OpenAI's (the engine's own default is greedy)
MAX_CHOICES = 16                  # n: completions per prompt
_RENAMED = {"parameters.top_logprobs": "logprobs", "parameters.stop": "stop", "parameters.": ""}


def generation_params(request: SamplingRequest, logprobs: int | None, max_tokens: int | None,
                      max_tokens_field: str = "max_tokens", forced: Constraint | None = None) -> GenerationParams:
    """logprobs: alternatives per generated token (None: no logprobs); max_tokens: the token budget asked for
    (None: OpenAI's default), named `max_tokens_field` in a refusal; forced: the constraint of a chat's tool choice
    (a request's own structured-output constraint may not come with it)."""
    constraint = request_constraint(request)
    if constraint is not None and forced is not None:
        raise ServingError.invalid(forced.field, f"a tool choice that forces a call cannot be combined with "
                                                 f"{constraint.field}")
    stop = [request.stop] if isinstance(request.stop, str) else request.stop
    if stop is not None and not all(isinstance(s, str) for s in stop):
        raise ServingError.invalid("stop", "must be a string or a list of strings")
    num_beams = beam_width(request)
    beams = num_beams is not None and num_beams > 1
    if beams and request.stream:
        name = "use_beam_search" if request.use_beam_search is True else "num_beams"
        raise ServingError.invalid(name, "a beam search's hypotheses are only known at its end, so it is not "
                                         "streamed; use num_beams 1 to stream, or stream false")
    # A beam search samples nothing: OpenAI's default temperature of 1 does not apply to it.
    temperature = request.temperature if request.temperature is not None else 0.0 if beams else DEFAULT_TEMPERATURE
    try:
        return GenerationParams.validate(
            max_new_tokens=DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens,
            temperature=temperature,
            top_p=request.top_p, top_k=request.top_k, repetition_penalty=request.repetition_penalty,
            presence_penalty=request.presence_penalty, frequency_penalty=request.frequency_penalty,
            logit_bias=request.logit_bias, min_p=request.min_p, min_tokens=request.min_tokens,
            stop_token_ids=request.stop_token_ids, stop=stop, seed=request.seed, logprobs=logprobs is not None,
            top_logprobs=logprobs or 0, ignore_eos=request.ignore_eos, num_beams=num_beams,
            length_penalty=request.length_penalty, early_stopping=request.early_stopping,
            target_language=request.target_language, source_language=request.source_language,
            constraint=constraint or forced, stream_interval=request.stream_interval)
    except ValueError as exc:
        raise _invalid(exc, max_tokens_field) from None


def beam_width(request: SamplingRequest) -> int | None:
    """The beams asked for: num_beams, or vLLM's spelling — use_beam_search true with best_of beams (n when
    best_of is absent), whose n best hypotheses are the choices."""
    if request.use_beam_search is msgspec.UNSET or request.use_beam_search is None \
            or request.use_beam_search is False:
        return request.num_beams
    if request.use_beam_search is not True:
        raise ServingError.invalid("use_beam_search", f"must be true or false, got {request.use_beam_search!r}")
    width = request.best_of if request.best_of is not None else (request.n or 1)
    if request.num_beams is not None and request.num_beams != width:
        raise ServingError.invalid("num_beams", f"with use_beam_search the beams are best_of (or n): {width}, "
                                                f"got num_beams {request.num_beams}")
    if width < 2:
        raise ServingError.invalid("best_of", f"use_beam_search needs at least 2 beams (best_of, or n), got {width}")
    return width


def _invalid(exc: ValueError, max_tokens_field: str) -> ServingError:
    message = str(exc)
    for ours, theirs in {"parameters.max_new_tokens": max_tokens_field, **_RENAMED}.items():
        if message.startswith(ours):
            message = theirs + message[len(ours):]
            break
    return ServingError(Code.INVALID_ARGUMENT, message)


def choices(request: SamplingRequest, params: GenerationParams) -> list[GenerationParams]:
    """One GenerationParams per completion asked of each prompt (`n`). With a seed, completion j draws with
    seed + j: reproducible, and not n copies of one draw."""
    n = 1 if request.n is None else request.n
    if not 1 <= n <= MAX_CHOICES:
        raise ServingError.invalid("n", f"must be in [1, {MAX_CHOICES}], got {n}")
    if request.best_of is not None and request.best_of != n and request.use_beam_search is not True:
        raise ServingError.invalid("best_of", f"only best_of = n is supported (no ranking), got {request.best_of}")
    if params.num_beams > 1:     # the n best hypotheses of one search, best first
        if n > params.num_beams:
            raise ServingError.invalid("n", f"the {n} best hypotheses of a beam search need at least {n} beams, "
                                            f"got num_beams {params.num_beams}")
        return [dataclasses.replace(params, beam_rank=j) for j in range(n)]
    if params.seed is None:
        return [params] * n
    return [dataclasses.replace(params, seed=(params.seed + j) % 2 ** 64) for j in range(n)]


def include_usage(request: SamplingRequest) -> bool:
    """stream_options.include_usage: a last event with the usage of the whole request."""
    return bool(request.stream_options is not None and request.stream_options.include_usage)
