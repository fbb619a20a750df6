"""The OpenAI-compatible API (what the `openai` client, vLLM and TGI speak), converters over the data plane.

    GET  /v1/models, /v1/models/{model}
    POST /v1/completions         prompt (text or token ids, one or a list), max_tokens, temperature, top_p, stop, seed,
                                 presence_penalty, frequency_penalty, logit_bias, n,
                                 logprobs, echo (with logprobs: the prompt's tokens scored too, as lm-eval's
                                 loglikelihood requests ask), stream (server-sent events, `data: [DONE]`)
                                 prompt_logprobs (vLLM's: each prompt token's logprob, rank and alternatives)
    POST /v1/chat/completions    models whose package carries a chat template; 400 otherwise
    POST /v1/embeddings          embedding models (task "embed")
    POST /tokenize, /detokenize  generation models' tokenizer, as vLLM's endpoints (prompt <-> token ids)

Errors: OpenAI's JSON error shape, status from errors.py (400 / 401 / 404 / 429 / 503 ...).
Extra sampling fields beyond OpenAI's, as vLLM accepts them: top_k, min_p, min_tokens, repetition_penalty,
stop_token_ids, ignore_eos.
"""
from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import time
import uuid
from typing import Any, AsyncIterator, Awaitable

import numpy as np
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from server.errors import Code, ServingError
from server.generation import GeneratedToken, GenerationParams, Usage
from server.generation.params import MAX_TOP_LOGPROBS
from server.http.app import OPENAI, Door, route
from server.http.body import deadline_from_headers, field, json_object
from server.http.chat import render_chat
from server.http.errors import classify_error, openai_body
from server.types import GenerateResult, ModelState, ModelStatus, StreamPart

FINISH = {"eos": "stop", "stop": "stop", "length": "length", "cancelled": "stop"}
DEFAULT_MAX_TOKENS = 16           # OpenAI's default for /v1/completions
MAX_CHOICES = 16                  # n: completions per prompt
MAX_LOGPROBS = 5                  # OpenAI's limit for completions' logprobs
# GenerationParams names its fields "parameters.<name>"; OpenAI's names for them:
_RENAMED = {"parameters.max_new_tokens": "max_tokens", "parameters.top_logprobs": "logprobs",
            "parameters.stop": "stop", "parameters.": ""}


def _invalid(exc: ValueError) -> ServingError:
    message = str(exc)
    for ours, theirs in _RENAMED.items():
        if message.startswith(ours):
            message = theirs + message[len(ours):]
            break
    return ServingError(Code.INVALID_ARGUMENT, message)


def _refuse_unsupported(body: dict[str, Any]) -> None:
    """Fields we do not implement are refused when they would change the answer, never ignored."""
    if field(body, "suffix", str, ""):
        raise ServingError.invalid("suffix", "is not supported")


def _choices(body: dict[str, Any], params: GenerationParams) -> list[GenerationParams]:
    """One GenerationParams per completion asked of each prompt (`n`). With a seed, completion j draws with
    seed + j: reproducible, and not n copies of one draw."""
    n = field(body, "n", int, 1)
    if not 1 <= n <= MAX_CHOICES:
        raise ServingError.invalid("n", f"must be in [1, {MAX_CHOICES}], got {n}")
    best_of = field(body, "best_of", int, None)
    if best_of is not None and best_of != n:
        raise ServingError.invalid("best_of", f"only best_of = n is supported (no ranking), got {best_of}")
    if params.seed is None:
        return [params] * n
    return [dataclasses.replace(params, seed=(params.seed + j) % 2 ** 64) for j in range(n)]


def _stop(body: dict[str, Any]) -> list[str]:
    stop = field(body, "stop", (str, list), [])
    if isinstance(stop, str):
        return [stop]
    if not all(isinstance(s, str) for s in stop):
        raise ServingError.invalid("stop", "must be a string or a list of strings")
    return stop


def _params(body: dict[str, Any], max_tokens_field: str, logprobs: int | None) -> GenerationParams:
    try:
        return GenerationParams.validate(
            max_new_tokens=field(body, max_tokens_field, int, DEFAULT_MAX_TOKENS),
            temperature=field(body, "temperature", float, 1.0), top_p=field(body, "top_p", float, 1.0),
            top_k=field(body, "top_k", int, 0), repetition_penalty=field(body, "repetition_penalty", float, 1.0),
            presence_penalty=field(body, "presence_penalty", float, 0.0),
            frequency_penalty=field(body, "frequency_penalty", float, 0.0),
            logit_bias=field(body, "logit_bias", dict, None),   # JSON keys: token ids as strings
            min_p=field(body, "min_p", float, 0.0), min_tokens=field(body, "min_tokens", int, 0),
            stop_token_ids=field(body, "stop_token_ids", list, None),
            stop=_stop(body), seed=field(body, "seed", int, None), logprobs=logprobs is not None,
            top_logprobs=logprobs or 0, ignore_eos=field(body, "ignore_eos", bool, False))
    except ValueError as exc:
        raise _invalid(exc) from None


def _stream_options(body: dict[str, Any]) -> bool:
    options = field(body, "stream_options", dict, {})
    return bool(field(options, "include_usage", bool, False, prefix="stream_options."))


def _usage(usages: list[Usage], n: int = 1) -> dict[str, Any]:
    """OpenAI's usage object over a request's completions, in choice order, n per prompt: each prompt counts
    once (as OpenAI counts it), every completion's tokens count; cached_tokens = prompt tokens found in the
    cache."""
    firsts = usages[::n]
    prompt, completion = sum(u.prompt_tokens for u in firsts), sum(u.completion_tokens for u in usages)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": sum(u.cached_prompt_tokens for u in firsts)}}


def _sse(payload: Any) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


DONE = b"data: [DONE]\n\n"


# ---------------------------------------------------------------------- models


def _serving(door: Door) -> dict[str, ModelStatus]:
    """name -> the status of its latest SERVING version (the one a request without a version reaches)."""
    return {s.name: s for s in door.plane.list_models() if s.state is ModelState.SERVING}   # ascending versions


def _model_json(s: ModelStatus) -> dict[str, Any]:
    # task, version and variant (fp32, w4, ...) are ortserve's additions to OpenAI's model object
    return {"id": s.name, "object": "model", "created": 0, "owned_by": "ortserve", "task": s.task,
            "version": s.version, "variant": s.variant}


@route("ListModels", OPENAI)
async def list_models(door: Door, request: Request) -> Response:
    return JSONResponse({"object": "list", "data": [_model_json(s) for _, s in sorted(_serving(door).items())]})


@route("ModelInfo", OPENAI)
async def get_model(door: Door, request: Request) -> Response:
    name = request.path_params["model"]
    status = _serving(door).get(name)
    if status is None:
        raise ServingError(Code.NOT_FOUND, f"model: no SERVING model {name!r}")
    return JSONResponse(_model_json(status))


# ---------------------------------------------------------------------- completions


class Logprobs:
    """OpenAI's completion logprobs object, built token by token (texts from the model's tokenizer)."""

    def __init__(self, door: Door, model: str, version: int, offset: int = 0) -> None:
        self.door, self.model, self.version, self.offset = door, model, version, offset

    def of(self, tokens: list[GeneratedToken]) -> dict[str, Any]:
        texts = self.door.plane.token_texts(self.model, self.version, [t.token_id for t in tokens])
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


def _is_token(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _prompts(body: dict[str, Any]) -> list[str | list[int]]:
    """OpenAI's prompt: a string, a list of strings, a list of token ids, or a list of such lists."""
    prompt = field(body, "prompt", (str, list))
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


@dataclasses.dataclass(frozen=True)
class _Asked:
    """What a /v1/completions body asks for beyond the sampling parameters."""

    logprobs: int | None          # alternatives per generated token (and per prompt token, with echo)
    echo: bool
    stream: bool
    prompt_logprobs: int | None   # vLLM's: the prompt scored, in its own shape, with this many alternatives
    score_only: bool              # echo with max_tokens 0: the prompt scored, nothing generated


def _completion_ask(body: dict[str, Any]) -> tuple[_Asked, GenerationParams]:
    logprobs = field(body, "logprobs", int, None)
    if logprobs is not None and not 0 <= logprobs <= MAX_LOGPROBS:
        raise ServingError.invalid("logprobs", f"must be in [0, {MAX_LOGPROBS}], got {logprobs}")
    echo, stream = field(body, "echo", bool, False), field(body, "stream", bool, False)
    vllm_scores = field(body, "prompt_logprobs", int, None)
    if vllm_scores is not None and not 0 <= vllm_scores <= MAX_TOP_LOGPROBS:
        raise ServingError.invalid("prompt_logprobs", f"must be in [0, {MAX_TOP_LOGPROBS}], got {vllm_scores}")
    if vllm_scores is not None and stream:
        raise ServingError.invalid("prompt_logprobs", "is not supported with stream (echo with logprobs is)")
    # max_tokens 0 with echo scores the prompt and generates nothing (as older lm-evaluation-harness asks): one token
    # is generated anyway, since the prompt's last logits come with it, and left out of the answer.
    max_tokens_zero = field(body, "max_tokens", int, DEFAULT_MAX_TOKENS) == 0
    if max_tokens_zero and not echo:
        raise ServingError.invalid("max_tokens", "must be >= 1 (0 only with echo, to score the prompt), got 0")
    score_only = echo and max_tokens_zero
    if score_only and stream:
        raise ServingError.invalid("max_tokens", "0 (score the echoed prompt only) is not supported with stream")
    params = _params({**body, "max_tokens": 1} if score_only else body, "max_tokens", logprobs)
    # With echo, logprobs scores the prompt's tokens too; the engine computes the most alternatives either asks for.
    scores = [k for k in (logprobs if echo else None, vllm_scores) if k is not None]
    if scores:
        params = dataclasses.replace(params, prompt_logprobs=max(scores))
    return _Asked(logprobs, echo, stream, vllm_scores, score_only), params


@route("Completions", OPENAI)
async def completions(door: Door, request: Request) -> Response:
    body = await json_object(request, door.max_body_bytes)
    model = request.state.model = field(body, "model", str)
    prompts = _prompts(body)
    _refuse_unsupported(body)
    ask, params = _completion_ask(body)
    choices = _choices(body, params)
    n = len(choices)
    # Choice k answers prompt k // n with the parameters of completion k % n (OpenAI's order).
    jobs = [(prompt, params) for prompt in prompts for params in choices]
    deadline = deadline_from_headers(request)
    ident, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
    if ask.stream:
        streams, firsts = await _opened([door.plane.generate_stream(model, 0, p, params, deadline)
                                         for p, params in jobs])
        echoed = [_echo_text(door, model, p) for p, _ in jobs] if ask.echo else []   # token ids: checked by now
        return _event_stream(_completion_events(door, streams, firsts, ident, created, echoed,
                                                ask.logprobs is not None, _stream_options(body), n))
    results = await _all([door.plane.generate(model, 0, p, params, deadline) for p, params in jobs])
    if ask.score_only:
        results = [_nothing_generated(r) for r in results]
    answers = [_completion_choice(door, k, r, _echo_text(door, model, jobs[k][0]) if ask.echo else None, ask)
               for k, r in enumerate(results)]
    usage = _usage([r.output.usage for r in results], n)
    return JSONResponse({"id": ident, "object": "text_completion", "created": created, "model": model,
                         "choices": answers, "usage": usage})


def _nothing_generated(result: GenerateResult) -> GenerateResult:
    """The answer of a request that only scores its prompt: its one generated token left out."""
    out = result.output
    return dataclasses.replace(result, output=dataclasses.replace(
        out, text="", tokens=[], finish_reason="length", usage=dataclasses.replace(out.usage, completion_tokens=0)))


def _echo_text(door: Door, model: str, prompt: str | list[int]) -> str:
    return prompt if isinstance(prompt, str) else door.plane.detokenize(model, 0, prompt)


def _completion_choice(door: Door, index: int, result: GenerateResult, echo: str | None, ask: _Asked
                       ) -> dict[str, Any]:
    """echo: the prompt's text when it is echoed (None: not echoed); with logprobs its tokens are scored too."""
    out = result.output
    scored: dict[str, Any] | None = None
    if ask.logprobs is not None:
        lp = Logprobs(door, result.model, result.version)
        prompt = [_fewer(t, ask.logprobs) for t in out.prompt_tokens]
        scored = lp.of(out.tokens) if echo is None else lp.of_echo(prompt, out.tokens)
    choice = {"index": index, "text": (echo or "") + out.text, "finish_reason": FINISH[out.finish_reason],
              "logprobs": scored}
    if ask.prompt_logprobs is not None:
        choice["prompt_logprobs"] = _vllm_prompt_logprobs(door, result, ask.prompt_logprobs)
    return choice


def _fewer(token: GeneratedToken, alternatives: int) -> GeneratedToken:
    return dataclasses.replace(token, top_logprobs=token.top_logprobs[:alternatives])


def _vllm_prompt_logprobs(door: Door, result: GenerateResult, alternatives: int) -> list[dict[str, Any] | None]:
    """vLLM's shape: null for the first prompt token, then per token {token id: {logprob, rank, decoded_token}} for
    the token itself and its `alternatives` likeliest ones (ranks 1..n)."""
    prompt = result.output.prompt_tokens
    texts = door.plane.token_texts(result.model, result.version, [t.token_id for t in prompt])
    out: list[dict[str, Any] | None] = [None]
    for token, text in zip(prompt[1:], texts[1:]):
        entry = {str(token.token_id): {"logprob": token.logprob, "rank": token.rank, "decoded_token": text}}
        for rank, alt in enumerate(token.top_logprobs[:alternatives], start=1):
            entry.setdefault(str(alt.token_id), {"logprob": alt.logprob, "rank": rank, "decoded_token": alt.token})
        out.append(entry)
    return out


async def _all(calls: list[Awaitable[GenerateResult]]) -> list[GenerateResult]:
    """Every completion of a request, or the first error: then the others are cancelled, not left generating
    for an answer nobody will read (one completion refused with 429 fails the request)."""
    tasks = [asyncio.ensure_future(c) for c in calls]
    try:
        return await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


async def _opened(streams: list[AsyncIterator[StreamPart]]
                  ) -> tuple[list[AsyncIterator[StreamPart]], list[StreamPart | None]]:
    """The streams of a request with their first parts. Admission and parameter errors answer with their status,
    not a 200 stream, so every first part is awaited; on an error every stream is closed and it is raised."""
    firsts = await asyncio.gather(*(_first(st) for st in streams), return_exceptions=True)
    failed = [f for f in firsts if isinstance(f, BaseException)]
    if failed:
        for st in streams:
            await st.aclose()  # type: ignore[attr-defined]
        raise failed[0]
    return streams, firsts  # type: ignore[return-value]


async def _first(stream: AsyncIterator[StreamPart]) -> StreamPart | None:
    try:
        return await stream.__anext__()
    except StopAsyncIteration:
        return None
    except BaseException:
        await stream.aclose()  # type: ignore[attr-defined]
        raise


def _event_stream(events: AsyncIterator[bytes]) -> Response:
    return StreamingResponse(events, media_type="text/event-stream",
                             headers={"cache-control": "no-cache", "x-accel-buffering": "no"})


async def _parts(first: StreamPart | None, stream: AsyncIterator[StreamPart]) -> AsyncIterator[StreamPart]:
    if first is None:
        return
    yield first
    async for part in stream:
        yield part


async def _merge(sources: list[AsyncIterator[StreamPart]]) -> AsyncIterator[tuple[int, StreamPart]]:
    """The parts of several streams as they come, each with its stream's index (one stream: no task, no queue)."""
    if len(sources) == 1:
        async for part in sources[0]:
            yield 0, part
        return
    queue: asyncio.Queue[tuple[int, StreamPart | BaseException | None]] = asyncio.Queue()

    async def pump(i: int, source: AsyncIterator[StreamPart]) -> None:
        try:
            async for part in source:
                await queue.put((i, part))
            await queue.put((i, None))
        except Exception as exc:
            await queue.put((i, exc))

    tasks = [asyncio.create_task(pump(i, source)) for i, source in enumerate(sources)]
    try:
        running = len(tasks)
        while running:
            i, item = await queue.get()
            if item is None:
                running -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield i, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _completion_events(door: Door, streams: list[AsyncIterator[StreamPart]], firsts: list[StreamPart | None],
                             ident: str, created: int, echo: list[str], logprobs: bool,
                             include_usage: bool, n: int) -> AsyncIterator[bytes]:
    """One `text_completion` chunk per text delta of each choice (choices[0].index = the choice's index)."""
    model = next((f.model for f in firsts if f is not None), "")
    lps = [Logprobs(door, f.model, f.version) if f is not None else None for f in firsts]
    usages: dict[int, Usage] = {}

    def event(choices: list[dict[str, Any]], **extra: Any) -> bytes:
        return _sse({"id": ident, "object": "text_completion", "created": created, "model": model,
                     "choices": choices, **extra})
    try:
        for i, text in enumerate(echo):     # with logprobs, the scored prompt came with the first token
            first, lp = firsts[i], lps[i]
            scored = lp.of(first.chunk.prompt_tokens) if logprobs and lp is not None and first is not None else None
            yield event([{"index": i, "text": text, "logprobs": scored, "finish_reason": None}])
        async for i, part in _merge([_parts(f, st) for f, st in zip(firsts, streams)]):
            chunk = part.chunk
            if not chunk.text and not chunk.final and not (logprobs and chunk.tokens):
                continue
            lp = lps[i]
            yield event([{"index": i, "text": chunk.text,
                          "logprobs": lp.of(chunk.tokens) if logprobs and lp is not None else None,
                          "finish_reason": FINISH[chunk.finish_reason or "length"] if chunk.final else None}])
            if chunk.final and chunk.usage is not None:
                usages[i] = chunk.usage
        if include_usage and len(usages) == len(streams):
            yield event([], usage=_usage([usages[k] for k in range(len(streams))], n))
    except Exception as exc:  # the status line is gone: the error travels as an event (the openai client raises it)
        status, message, _ = classify_error(exc, "http Completions stream")
        yield _sse(openai_body(status, message))
    finally:
        for st in streams:
            await st.aclose()  # type: ignore[attr-defined]
    yield DONE


# ---------------------------------------------------------------------- chat


def _messages(body: dict[str, Any]) -> list[dict[str, str]]:
    messages = field(body, "messages", list)
    if not messages:
        raise ServingError.invalid("messages", "must not be empty")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise ServingError.invalid(f"messages[{i}]", "must be an object")
        role = field(m, "role", str, prefix=f"messages[{i}].")
        content = field(m, "content", (str, list), "", prefix=f"messages[{i}].")
        if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
            parts = []
            for j, p in enumerate(content):
                if not isinstance(p, dict) or p.get("type") != "text" or not isinstance(p.get("text"), str):
                    raise ServingError.invalid(f"messages[{i}].content[{j}]", "only text parts are supported")
                parts.append(p["text"])
            content = "".join(parts)
        out.append({"role": role, "content": content})
    return out


@route("ChatCompletions", OPENAI)
async def chat_completions(door: Door, request: Request) -> Response:
    body = await json_object(request, door.max_body_bytes)
    model = request.state.model = field(body, "model", str)
    messages = _messages(body)
    _refuse_unsupported(body)
    if field(body, "prompt_logprobs", int, None) is not None:
        raise ServingError.invalid("prompt_logprobs", "is supported on /v1/completions only")
    top = field(body, "top_logprobs", int, None)
    logprobs = (top or 0) if field(body, "logprobs", bool, False) else None
    if logprobs is None and top:
        raise ServingError.invalid("top_logprobs", "needs logprobs: true")
    max_field = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    choices = _choices(body, _params(body, max_field, logprobs))
    template = door.plane.chat_template(model)
    if template is None:
        raise ServingError.invalid("model", f"{model!r} has no chat template (its package's tokenizer carries "
                                            f"none): use /v1/completions with a prompt")
    prompt = render_chat(template.template, messages, template.variables)
    deadline = deadline_from_headers(request)
    ident, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
    if field(body, "stream", bool, False):
        streams, firsts = await _opened([door.plane.generate_stream(model, 0, prompt, params, deadline)
                                         for params in choices])
        return _event_stream(_chat_events(door, streams, firsts, ident, created,
                                          logprobs is not None, _stream_options(body)))
    results = await _all([door.plane.generate(model, 0, prompt, params, deadline) for params in choices])
    answers = [{"index": j, "message": {"role": "assistant", "content": r.output.text},
                "finish_reason": FINISH[r.output.finish_reason],
                "logprobs": _chat_logprobs(door, r.model, r.version, r.output.tokens) if logprobs is not None
                else None} for j, r in enumerate(results)]
    return JSONResponse({"id": ident, "object": "chat.completion", "created": created, "model": model,
                         "choices": answers, "usage": _usage([r.output.usage for r in results], len(results))})


def _chat_logprobs(door: Door, model: str, version: int, tokens: list[GeneratedToken]) -> dict[str, Any]:
    texts = door.plane.token_texts(model, version, [t.token_id for t in tokens])
    return {"content": [{"token": text, "logprob": t.logprob, "bytes": list(text.encode()),
                         "top_logprobs": [{"token": a.token, "logprob": a.logprob, "bytes": list(a.token.encode())}
                                          for a in t.top_logprobs]} for text, t in zip(texts, tokens)]}


async def _chat_events(door: Door, streams: list[AsyncIterator[StreamPart]], firsts: list[StreamPart | None],
                       ident: str, created: int, logprobs: bool, include_usage: bool) -> AsyncIterator[bytes]:
    """`chat.completion.chunk` events: each choice's role first, then its content deltas (choices[0].index =
    the choice's index)."""
    model = next((f.model for f in firsts if f is not None), "")
    version = next((f.version for f in firsts if f is not None), 0)
    usages: dict[int, Usage] = {}

    def event(index: int, delta: dict[str, Any], finish: str | None, lp: Any = None) -> bytes:
        return _sse({"id": ident, "object": "chat.completion.chunk", "created": created, "model": model,
                     "choices": [{"index": index, "delta": delta, "logprobs": lp, "finish_reason": finish}]})
    try:
        for j in range(len(streams)):
            yield event(j, {"role": "assistant", "content": ""}, None)
        async for j, part in _merge([_parts(f, st) for f, st in zip(firsts, streams)]):
            chunk = part.chunk
            if not chunk.text and not chunk.final:
                continue
            lp = _chat_logprobs(door, model, version, chunk.tokens) if logprobs else None
            yield event(j, {"content": chunk.text} if chunk.text else {},
                        FINISH[chunk.finish_reason or "length"] if chunk.final else None, lp)
            if chunk.final and chunk.usage is not None:
                usages[j] = chunk.usage
        if include_usage and len(usages) == len(streams):
            yield _sse({"id": ident, "object": "chat.completion.chunk", "created": created, "model": model,
                        "choices": [], "usage": _usage([usages[j] for j in range(len(streams))], len(streams))})
    except Exception as exc:
        status, message, _ = classify_error(exc, "http ChatCompletions stream")
        yield _sse(openai_body(status, message))
    finally:
        for st in streams:
            await st.aclose()  # type: ignore[attr-defined]
    yield DONE


# ---------------------------------------------------------------------- tokenizer (vLLM's endpoints)


@route("Tokenize", OPENAI)
async def tokenize(door: Door, request: Request) -> Response:
    """POST /tokenize {model, prompt} -> {count, max_model_len, tokens}: the ids generation would run."""
    body = await json_object(request, door.max_body_bytes)
    model = request.state.model = field(body, "model", str)
    tokens = door.plane.tokenize(model, 0, field(body, "prompt", str))
    return JSONResponse({"count": len(tokens), "max_model_len": door.plane.model_info(model).max_length,
                         "tokens": tokens})


@route("Detokenize", OPENAI)
async def detokenize(door: Door, request: Request) -> Response:
    """POST /detokenize {model, tokens} -> {prompt}."""
    body = await json_object(request, door.max_body_bytes)
    model = request.state.model = field(body, "model", str)
    return JSONResponse({"prompt": door.plane.detokenize(model, 0, field(body, "tokens", list))})


# ---------------------------------------------------------------------- embeddings


def _embedding_inputs(body: dict[str, Any]) -> list[str]:
    given = field(body, "input", (str, list))
    texts = [given] if isinstance(given, str) else given
    if not texts:
        raise ServingError.invalid("input", "must not be an empty list")
    if not all(isinstance(t, str) for t in texts):
        raise ServingError.invalid("input", "token-id inputs are not supported: send text (a string or a list of "
                                            "strings)")
    return texts


@route("Embeddings", OPENAI)
async def embeddings(door: Door, request: Request) -> Response:
    body = await json_object(request, door.max_body_bytes)
    model = request.state.model = field(body, "model", str)
    texts = _embedding_inputs(body)
    encoding = field(body, "encoding_format", str, "float")
    if encoding not in ("float", "base64"):
        raise ServingError.invalid("encoding_format", f"must be float or base64, got {encoding!r}")
    dimensions = field(body, "dimensions", int, None)
    result = await door.plane.embed(model, 0, texts, field(body, "truncate", bool, False),
                                    deadline_from_headers(request))
    vectors = result.embeddings
    if dimensions is not None and dimensions != vectors.shape[1]:
        raise ServingError.invalid("dimensions", f"{model!r} answers {vectors.shape[1]}-dimensional vectors "
                                                 f"(no shortening), got {dimensions}")
    if encoding == "base64":
        rows: list[Any] = [base64.b64encode(np.ascontiguousarray(v, dtype="<f4").tobytes()).decode() for v in vectors]
    else:
        rows = vectors.tolist()
    tokens = sum(result.token_counts)
    return JSONResponse({"object": "list", "model": model,
                         "data": [{"object": "embedding", "index": i, "embedding": row} for i, row in enumerate(rows)],
                         "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})


def routes() -> list[Route]:
    return [
        Route("/v1/models", list_models, methods=["GET"]),
        Route("/v1/models/{model:path}", get_model, methods=["GET"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/embeddings", embeddings, methods=["POST"]),
        Route("/tokenize", tokenize, methods=["POST"]),
        Route("/detokenize", detokenize, methods=["POST"]),
    ]
