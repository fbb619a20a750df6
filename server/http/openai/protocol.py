"""The OpenAI API's request bodies as typed objects (msgspec Structs), decoded once by server/http/decode.py.

Field names and types are OpenAI's (vLLM's extra sampling fields too: top_k, min_p, min_tokens,
repetition_penalty, stop_token_ids, ignore_eos, prompt_logprobs). Every optional field is `X | None = None`:
null means absent, and the defaults live where the request becomes GenerationParams (params.py). Fields of a
shape JSON types cannot say (a prompt that is a string, a list of strings, a list of token ids or a list of
such lists) are typed as loosely as JSON allows and checked by the route, which names the field. Unknown
fields are ignored, as OpenAI's own server and vLLM do.
"""
from __future__ import annotations

from typing import Any

import msgspec


class StreamOptions(msgspec.Struct, kw_only=True):
    include_usage: bool | None = None


class SamplingRequest(msgspec.Struct, kw_only=True):
    """What completions and chat completions share: the model, the sampling fields, n, streaming."""

    model: str
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    min_tokens: int | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, Any] | None = None    # JSON keys: token ids as strings; values checked with the rest
    stop: str | list[Any] | None = None
    stop_token_ids: list[Any] | None = None
    seed: int | None = None
    ignore_eos: bool | None = None
    n: int | None = None
    best_of: int | None = None
    suffix: str | None = None
    prompt_logprobs: int | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None


class CompletionRequest(SamplingRequest, kw_only=True):
    """POST /v1/completions."""

    prompt: str | list[Any]
    logprobs: int | None = None     # alternatives per token (OpenAI's completions: an integer)
    echo: bool | None = None


class ChatMessage(msgspec.Struct, kw_only=True):
    role: str
    content: str | list[Any] | None = None    # a string, or parts [{"type": "text", "text": ...}, ...]


class ChatCompletionRequest(SamplingRequest, kw_only=True):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage]
    logprobs: bool | None = None    # chat: a switch, with top_logprobs alternatives
    top_logprobs: int | None = None
    max_completion_tokens: int | None = None


class EmbeddingRequest(msgspec.Struct, kw_only=True):
    """POST /v1/embeddings."""

    model: str
    input: str | list[Any]
    encoding_format: str | None = None
    dimensions: int | None = None
    truncate: bool | None = None


class TokenizeRequest(msgspec.Struct, kw_only=True):
    """POST /tokenize (vLLM's)."""

    model: str
    prompt: str


class DetokenizeRequest(msgspec.Struct, kw_only=True):
    """POST /detokenize (vLLM's)."""

    model: str
    tokens: list[Any]
