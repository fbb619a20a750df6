"""POST /v1/chat/completions: models whose package carries a chat template (server/text/chat_template.py renders
the messages into one prompt, in the data plane's chat call); 400 naming `model` otherwise. Streamed as `chat.completion.chunk` events."""
from __future__ import annotations

import time
import uuid
from typing import Any, AsyncIterator

from starlette.requests import Request
from starlette.responses import Response

from server.protocol.errors import ServingError
from server.generation import GeneratedToken, Usage
from server.http.body import deadline_from_headers
from server.http.decode import typed_body
from server.http.guard import OPENAI, Door, route
from server.http.openai.answers import FINISH, json_answer, usage
from server.http.openai.params import choices, generation_params, include_usage
from server.http.openai.protocol import ChatCompletionRequest, refuse_unsupported
from server.http.openai.stream import event_stream, merged, opened, sse
from server.http.openai.tool_calls import ChatTools, ToolDeltas, answer_message, chat_tools, template_messages
from server.protocol.types import PartStream, StreamPart


@route("ChatCompletions", OPENAI)
async def chat_completions(door: Door, request: Request) -> Response:
    body = await typed_body(request, door.max_body_bytes, ChatCompletionRequest)
    model, messages = body.model, template_messages(body.messages)
    refuse_unsupported(body)
    tools = chat_tools(body)
    if body.prompt_logprobs is not None:
        raise ServingError.invalid("prompt_logprobs", "is supported on /v1/completions only")
    logprobs = (body.top_logprobs or 0) if body.logprobs else None
    if logprobs is None and body.top_logprobs:
        raise ServingError.invalid("top_logprobs", "needs logprobs: true")
    if body.max_completion_tokens is not None:
        params = generation_params(body, logprobs, body.max_completion_tokens, "max_completion_tokens",
                                   tools.constraint)
    else:
        params = generation_params(body, logprobs, body.max_tokens, forced=tools.constraint)
    per_request = choices(body, params)
    deadline = deadline_from_headers(request)
    ident, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
    # One data-plane call: the prompt rendered with the template of the version that generates it.
    if body.stream:
        streams = await door.plane.chat_streams(model, 0, messages, per_request, deadline, field="n",
                                                tools=tools.definitions)
        firsts = await opened(streams)
        events = _events(streams, firsts, ident, created, logprobs is not None, include_usage(body), tools)
        return event_stream(events, streams, "ChatCompletions")
    results = await door.plane.chat(model, 0, messages, per_request, deadline, field="n", tools=tools.definitions)
    answers = []
    for j, r in enumerate(results):
        message, finish = answer_message(r.output.text, FINISH[r.output.finish_reason], tools)
        answers.append({"index": j, "message": message, "finish_reason": finish,
                        "logprobs": _logprobs(r.output.tokens) if logprobs is not None else None})
    return json_answer({"id": ident, "object": "chat.completion", "created": created, "model": model,
                        "choices": answers, "usage": usage([r.output.usage for r in results], len(results))})


def _logprobs(tokens: list[GeneratedToken]) -> dict[str, Any]:
    """OpenAI's chat logprobs: each token's text (it came with the token), logprob, bytes, alternatives."""
    return {"content": [{"token": t.token, "logprob": t.logprob, "bytes": list(t.token.encode()),
                         "top_logprobs": [{"token": a.token, "logprob": a.logprob, "bytes": list(a.token.encode())}
                                          for a in t.top_logprobs]} for t in tokens]}


async def _events(streams: list[PartStream], firsts: list[StreamPart | None], ident: str,
                  created: int, logprobs: bool, with_usage: bool, tools: ChatTools) -> AsyncIterator[bytes]:
    """`chat.completion.chunk` events: each choice's role first, then its content deltas (choices[0].index =
    the choice's index); with tools, its calls as tool-call deltas (tool_calls.ToolDeltas)."""
    model = next((f.model for f in firsts if f is not None), "")
    usages: dict[int, Usage] = {}

    def event(index: int, delta: dict[str, Any], finish: str | None, lp: Any = None) -> bytes:
        return sse({"id": ident, "object": "chat.completion.chunk", "created": created, "model": model,
                    "choices": [{"index": index, "delta": delta, "logprobs": lp, "finish_reason": finish}]})
    for j in range(len(streams)):
        yield event(j, {"role": "assistant", "content": ""}, None)
    calls = [ToolDeltas() for _ in streams] if tools.parses else None
    async for j, part in merged(firsts, streams):
        chunk = part.chunk
        if not chunk.text and not chunk.final and not (logprobs and chunk.tokens):
            continue    # (a token whose text is held back still brings its logprob)
        lp = _logprobs(chunk.tokens) if logprobs else None
        finish = FINISH[chunk.finish_reason or "length"] if chunk.final else None
        if calls is not None:
            for delta in calls[j].deltas(chunk.text, chunk.final):
                yield event(j, delta, None)
            if finish or lp:
                yield event(j, {}, "tool_calls" if finish and calls[j].calls else finish, lp)
        else:
            yield event(j, {"content": chunk.text} if chunk.text else {}, finish, lp)
        if chunk.final and chunk.usage is not None:
            usages[j] = chunk.usage
    if with_usage and len(usages) == len(streams):
        yield sse({"id": ident, "object": "chat.completion.chunk", "created": created, "model": model,
                   "choices": [], "usage": usage([usages[j] for j in range(len(streams))], len(streams))})
