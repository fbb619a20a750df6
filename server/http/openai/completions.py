"""POST /v1/completions: prompt (text or token ids, one or a list), the sampling fields, n, logprobs, echo (with
logprobs: the prompt's tokens scored too, as lm-eval's loglikelihood requests ask), stream (server-sent events),
and vLLM's prompt_logprobs (each prompt token's logprob, rank and alternatives).

One pass: the body decoded into a CompletionRequest, its GenerationParams per choice, the data-plane calls,
the answer encoded.
"""
from __future__ import annotations

import dataclasses
import time
import uuid
from typing import Any, AsyncIterator

from starlette.requests import Request
from starlette.responses import Response

from server.protocol.errors import ServingError
from server.generation import GeneratedToken, GenerationParams, Usage
from server.generation.params import MAX_TOP_LOGPROBS
from server.http.body import deadline_from_headers
from server.http.decode import typed_body
from server.http.guard import OPENAI, Door, route
from server.http.openai.answers import FINISH, json_answer, usage
from server.http.openai.params import choices, generation_params, include_usage
from server.http.openai.protocol import CompletionRequest, refuse_unsupported
from server.http.openai.stream import event_stream, merged, opened, sse
from server.protocol.types import GenerateResult, PartStream, StreamPart

MAX_LOGPROBS = 5                  # OpenAI's limit for completions' logprobs


@dataclasses.dataclass(frozen=True)
class _Asked:
    """What a /v1/completions body asks for beyond the sampling parameters."""

    logprobs: int | None          # alternatives per generated token (and per prompt token, with echo)
    echo: bool
    stream: bool
    prompt_logprobs: int | None   # vLLM's: the prompt scored, in its own shape, with this many alternatives
    score_only: bool              # echo with max_tokens 0: the prompt scored, nothing generated


@route("Completions", OPENAI)
async def completions(door: Door, request: Request) -> Response:
    body = await typed_body(request, door.max_body_bytes, CompletionRequest)
    model, prompts = body.model, _prompts(body.prompt)
    refuse_unsupported(body)
    ask, params = _ask(body)
    per_prompt = choices(body, params)
    n = len(per_prompt)
    # Choice k answers prompt k // n with the parameters of completion k % n (OpenAI's order).
    jobs = [(prompt, params) for prompt in prompts for params in per_prompt]
    deadline = deadline_from_headers(request)
    ident, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
    if ask.stream:
        streams = await door.plane.generate_streams(model, 0, jobs, deadline, ask.echo, field="prompt")
        firsts = await opened(streams)
        events = _events(streams, firsts, ident, created, ask, include_usage(body), n)
        return event_stream(events, streams, "Completions")
    results = await door.plane.generate_many(model, 0, jobs, deadline, ask.echo, field="prompt")
    if ask.score_only:
        results = [_nothing_generated(r) for r in results]
    answers = [_choice(k, r, ask) for k, r in enumerate(results)]
    return json_answer({"id": ident, "object": "text_completion", "created": created, "model": model,
                        "choices": answers, "usage": usage([r.output.usage for r in results], n)})


def _is_token(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _prompts(prompt: str | list[Any]) -> list[str | list[int]]:
    """OpenAI's prompt: a string, a list of strings, a list of token ids, or a list of such lists."""
    if isinstance(prompt, str):
        return [prompt]
    if not prompt:
        raise ServingError.invalid("prompt", "must not be an empty list")
    if all(isinstance(p, str) for p in prompt):
        return list(prompt)
    if all(_is_token(t) for t in prompt):
        return [list(prompt)]
    if all(isinstance(p, list) and all(_is_token(t) for t in p) for p in prompt):
        return [list(p) for p in prompt]
    raise ServingError.invalid("prompt", "must be a string, a list of strings, a list of token ids, or a list of "
                                         "lists of token ids")


def _ask(body: CompletionRequest) -> tuple[_Asked, GenerationParams]:
    logprobs = body.logprobs
    if logprobs is not None and not 0 <= logprobs <= MAX_LOGPROBS:
        raise ServingError.invalid("logprobs", f"must be in [0, {MAX_LOGPROBS}], got {logprobs}")
    echo, stream = bool(body.echo), bool(body.stream)
    vllm_scores = body.prompt_logprobs
    if vllm_scores is not None and not 0 <= vllm_scores <= MAX_TOP_LOGPROBS:
        raise ServingError.invalid("prompt_logprobs", f"must be in [0, {MAX_TOP_LOGPROBS}], got {vllm_scores}")
    if vllm_scores is not None and stream:
        raise ServingError.invalid("prompt_logprobs", "is not supported with stream (echo with logprobs is)")
    # max_tokens 0 with echo scores the prompt and generates nothing (as older lm-evaluation-harness asks): one token
    # is generated anyway, since the prompt's last logits come with it, and left out of the answer.
    if body.max_tokens == 0 and not echo:
        raise ServingError.invalid("max_tokens", "must be >= 1 (0 only with echo, to score the prompt), got 0")
    score_only = echo and body.max_tokens == 0
    if score_only and stream:
        raise ServingError.invalid("max_tokens", "0 (score the echoed prompt only) is not supported with stream")
    params = generation_params(body, logprobs, 1 if score_only else body.max_tokens)
    # With echo, logprobs scores the prompt's tokens too; the engine computes the most alternatives either asks for.
    scores = [k for k in (logprobs if echo else None, vllm_scores) if k is not None]
    if scores:
        params = dataclasses.replace(params, prompt_logprobs=max(scores))
    return _Asked(logprobs, echo, stream, vllm_scores, score_only), params


class Logprobs:
    """OpenAI's completion logprobs object, built token by token (each token's text came with it)."""

    def __init__(self, offset: int = 0) -> None:
        self.offset = offset

    def of(self, tokens: list[GeneratedToken]) -> dict[str, Any]:
        texts = [t.token for t in tokens]
        offsets = []
        for text in texts:
            offsets.append(self.offset)
            self.offset += len(text)
        # A prompt's first token has no logprob (nothing precedes it): null, as OpenAI's echo gives it.
        return {"tokens": texts, "token_logprobs": [t.logprob for t in tokens],
                "top_logprobs": [None if t.logprob is None else {a.token: a.logprob for a in t.top_logprobs}
                                 for t in tokens],
                "text_offset": offsets}

    def of_echo(self, prompt: list[GeneratedToken], tokens: list[GeneratedToken]) -> dict[str, Any]:
        """The scored prompt's entries, then the completion's, in one object (offsets run on across both)."""
        first, then = self.of(prompt), self.of(tokens)
        return {key: first[key] + then[key] for key in first}


def _nothing_generated(result: GenerateResult) -> GenerateResult:
    """The answer of a request that only scores its prompt: its one generated token left out."""
    out = result.output
    return dataclasses.replace(result, output=dataclasses.replace(
        out, text="", tokens=[], finish_reason="length", usage=dataclasses.replace(out.usage, completion_tokens=0)))


def _choice(index: int, result: GenerateResult, ask: _Asked) -> dict[str, Any]:
    """With echo the prompt's text leads the answer, and with logprobs its tokens are scored too."""
    out = result.output
    scored: dict[str, Any] | None = None
    if ask.logprobs is not None:
        prompt = [_fewer(t, ask.logprobs) for t in out.prompt_tokens]
        scored = Logprobs().of_echo(prompt, out.tokens) if ask.echo else Logprobs().of(out.tokens)
    choice = {"index": index, "text": (result.prompt_text or "") + out.text,
              "finish_reason": FINISH[out.finish_reason], "logprobs": scored}
    if ask.prompt_logprobs is not None:
        choice["prompt_logprobs"] = _vllm_prompt_logprobs(out.prompt_tokens, ask.prompt_logprobs)
    return choice


def _fewer(token: GeneratedToken, alternatives: int) -> GeneratedToken:
    return dataclasses.replace(token, top_logprobs=token.top_logprobs[:alternatives])


def _vllm_prompt_logprobs(prompt: list[GeneratedToken], alternatives: int) -> list[dict[str, Any] | None]:
    """vLLM's shape: null for the first prompt token, then per token {token id: {logprob, rank, decoded_token}} for
    the token itself and its `alternatives` likeliest ones (ranks 1..n)."""
    out: list[dict[str, Any] | None] = [None]
    for token in prompt[1:]:
        entry = {str(token.token_id): {"logprob": token.logprob, "rank": token.rank, "decoded_token": token.token}}
        for rank, alt in enumerate(token.top_logprobs[:alternatives], start=1):
            entry.setdefault(str(alt.token_id), {"logprob": alt.logprob, "rank": rank, "decoded_token": alt.token})
        out.append(entry)
    return out


async def _events(streams: list[PartStream], firsts: list[StreamPart | None], ident: str,
                  created: int, ask: _Asked, with_usage: bool, n: int) -> AsyncIterator[bytes]:
    """One `text_completion` chunk per text delta of each choice (choices[0].index = the choice's index); with echo,
    each choice's prompt first."""
    model = next((f.model for f in firsts if f is not None), "")
    logprobs = ask.logprobs is not None
    lps = [Logprobs() for _ in firsts]
    usages: dict[int, Usage] = {}

    def event(choices: list[dict[str, Any]], **extra: Any) -> bytes:
        return sse({"id": ident, "object": "text_completion", "created": created, "model": model,
                    "choices": choices, **extra})
    if ask.echo:     # with logprobs, the scored prompt came with the first token
        for i, first in enumerate(firsts):
            text = (first.prompt_text or "") if first is not None else ""
            scored = lps[i].of(first.chunk.prompt_tokens) if logprobs and first is not None else None
            yield event([{"index": i, "text": text, "logprobs": scored, "finish_reason": None}])
    async for i, part in merged(firsts, streams):
        chunk = part.chunk
        if not chunk.text and not chunk.final and not (logprobs and chunk.tokens):
            continue
        yield event([{"index": i, "text": chunk.text, "logprobs": lps[i].of(chunk.tokens) if logprobs else None,
                      "finish_reason": FINISH[chunk.finish_reason or "length"] if chunk.final else None}])
        if chunk.final and chunk.usage is not None:
            usages[i] = chunk.usage
    if with_usage and len(usages) == len(streams):
        yield event([], usage=usage([usages[k] for k in range(len(streams))], n))
