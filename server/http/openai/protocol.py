"""The OpenAI API's request bodies as typed objects (msgspec Structs), decoded once by server/http/decode.py.

Field names and types are OpenAI's (vLLM's extra sampling fields too: top_k, min_p, min_tokens,
repetition_penalty, stop_token_ids, ignore_eos, prompt_logprobs). Every optional field is `X | None = None`:
null means absent, and the defaults live where the request becomes GenerationParams (params.py). Fields of a
shape JSON types cannot say (a prompt that is a string, a list of strings, a list of token ids or a list of
such lists) are typed as loosely as JSON allows and checked by the route, which names the field.

Unknown fields are ignored, as OpenAI's own server and vLLM do (`user`, `metadata`, `store`, `priority`, ...:
none changes the answer). Fields that OpenAI, vLLM or Hugging Face servers accept and that WOULD change the
answer, which this server does not implement (vLLM's beam search switch, allowed_token_ids, ...), are declared in each
type's UNSUPPORTED table with the values that mean "off": `refuse_unsupported` refuses any other value naming
the field, so a client never gets an answer computed without what it asked for.
"""
from __future__ import annotations

import json
from typing import Any, ClassVar

import msgspec

from server.protocol.errors import ServingError

UNSET = msgspec.UNSET   # absent (null is None): the refusal tells them apart from a given value
# Field -> the values that leave the answer as this server computes it (absent and null are always accepted).
_SAMPLING_UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "do_sample": (True,), "typical_p": (1, 1.0), "suffix": ("",),
    "allowed_token_ids": (), "bad_words": ([],),
    "logits_processors": ([],), "truncate_prompt_tokens": (), "prompt_embeds": (),
    "include_stop_str_in_output": (False,), "skip_special_tokens": (True,),
    "spaces_between_special_tokens": (True,), "add_special_tokens": (True,),
    "return_tokens_as_token_ids": (False,), "return_token_ids": (False,),
}


def refuse_unsupported(request: msgspec.Struct, prefix: str = "") -> None:
    """INVALID_ARGUMENT naming the first field of type(request).UNSUPPORTED given a value that would change the
    answer (types compared too: `num_beams: true` is not 1), in the request and in the typed objects it holds
    (`stream_options`, `messages[i]`)."""
    for name, neutral in getattr(type(request), "UNSUPPORTED", {}).items():
        value = getattr(request, name)
        if value is msgspec.UNSET or value is None or any(type(value) is type(n) and value == n for n in neutral):
            continue
        accepted = " or ".join(json.dumps(n) for n in neutral)
        hint = f"; only {accepted} (or leaving it out) is accepted" if accepted else ""
        raise ServingError.invalid(prefix + name, f"is not supported by this server, and it would change the "
                                                  f"answer{hint}; got {json.dumps(value)[:60]}")
    for name in request.__struct_fields__:
        value = getattr(request, name)
        if isinstance(value, msgspec.Struct):
            refuse_unsupported(value, f"{prefix}{name}.")
        elif isinstance(value, list):
            for i, item in enumerate(value):
                if isinstance(item, msgspec.Struct):
                    refuse_unsupported(item, f"{prefix}{name}[{i}].")


class StreamOptions(msgspec.Struct, kw_only=True):
    include_usage: bool | None = None
    continuous_usage_stats: Any = UNSET     # vLLM's usage in every chunk: refused unless off

    UNSUPPORTED: ClassVar[dict[str, tuple[Any, ...]]] = {"continuous_usage_stats": (False,)}


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
    suffix: Any = UNSET
    prompt_logprobs: int | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    stream_interval: int | None = None     # vLLM's: tokens per streamed chunk after the first (>= 1)
    # Beam search, as transformers' generate takes it: `n` <= num_beams best hypotheses; or vLLM's spelling,
    # use_beam_search true with best_of beams (n when best_of is absent).
    num_beams: int | None = None
    length_penalty: float | None = None
    early_stopping: bool | str | None = None
    # Translation models (M2M100 / NLLB, mBART): the language token to translate into, forced first (an extension,
    # as gRPC GenerateRequest.target_language); a model without languages refuses it by name.
    target_language: str | None = None
    source_language: str | None = None     # the source text's language token (default: the tokenizer's)
    use_beam_search: Any = UNSET       # checked in params.py (a non-boolean is refused naming it)
    # Structured outputs (server/http/openai/structured.py checks them, naming the field): typed loosely.
    response_format: Any = UNSET
    guided_json: Any = UNSET
    guided_regex: Any = UNSET
    guided_choice: Any = UNSET
    guided_grammar: Any = UNSET
    structured_outputs: Any = UNSET
    # Refused unless off (UNSUPPORTED); typed loosely so that any value reaches the refusal naming the field.
    do_sample: Any = UNSET
    typical_p: Any = UNSET
    allowed_token_ids: Any = UNSET
    bad_words: Any = UNSET
    logits_processors: Any = UNSET
    truncate_prompt_tokens: Any = UNSET
    prompt_embeds: Any = UNSET
    include_stop_str_in_output: Any = UNSET
    skip_special_tokens: Any = UNSET
    spaces_between_special_tokens: Any = UNSET
    add_special_tokens: Any = UNSET
    return_tokens_as_token_ids: Any = UNSET
    return_token_ids: Any = UNSET

    UNSUPPORTED: ClassVar[dict[str, tuple[Any, ...]]] = _SAMPLING_UNSUPPORTED


class CompletionRequest(SamplingRequest, kw_only=True):
    """POST /v1/completions."""

    prompt: str | list[Any]
    logprobs: int | None = None     # alternatives per token (OpenAI's completions: an integer)
    echo: bool | None = None


class ChatMessage(msgspec.Struct, kw_only=True):
    role: str
    content: str | list[Any] | None = None    # a string, or parts [{"type": "text", "text": ...}, ...]
    tool_calls: list[Any] | None = None       # an assistant's earlier calls (server/http/openai/tool_calls.py)
    tool_call_id: str | None = None           # a `tool` message: the call it answers
    name: str | None = None
    function_call: Any = UNSET

    UNSUPPORTED: ClassVar[dict[str, tuple[Any, ...]]] = {"function_call": ()}


class ChatCompletionRequest(SamplingRequest, kw_only=True):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage]
    logprobs: bool | None = None    # chat: a switch, with top_logprobs alternatives
    top_logprobs: int | None = None
    max_completion_tokens: int | None = None
    tools: Any = UNSET              # checked by server/http/openai/tool_calls.py, naming the field
    tool_choice: Any = UNSET
    parallel_tool_calls: bool | None = None
    functions: Any = UNSET
    function_call: Any = UNSET
    audio: Any = UNSET
    modalities: Any = UNSET
    reasoning_effort: Any = UNSET
    web_search_options: Any = UNSET
    echo: Any = UNSET
    add_generation_prompt: Any = UNSET
    continue_final_message: Any = UNSET
    chat_template: Any = UNSET
    chat_template_kwargs: Any = UNSET
    documents: Any = UNSET

    UNSUPPORTED: ClassVar[dict[str, tuple[Any, ...]]] = {
        **_SAMPLING_UNSUPPORTED, "functions": ([],),
        "function_call": ("none", "auto"), "audio": (), "modalities": (["text"],), "reasoning_effort": (),
        "web_search_options": (), "echo": (False,), "add_generation_prompt": (True,),
        "continue_final_message": (False,), "chat_template": (), "chat_template_kwargs": ({},), "documents": ([],)}


class EmbeddingRequest(msgspec.Struct, kw_only=True):
    """POST /v1/embeddings."""

    model: str
    input: str | list[Any]
    encoding_format: str | None = None
    dimensions: int | None = None
    truncate: bool | None = None
    prompt_name: str | None = None      # one of the model's prompts (server/encoders/prompts.py)
    truncate_prompt_tokens: Any = UNSET
    add_special_tokens: Any = UNSET
    normalize: Any = UNSET
    embed_dtype: Any = UNSET

    UNSUPPORTED: ClassVar[dict[str, tuple[Any, ...]]] = {
        "truncate_prompt_tokens": (), "add_special_tokens": (True,), "normalize": (), "embed_dtype": ("float32",)}


class TokenizeRequest(msgspec.Struct, kw_only=True):
    """POST /tokenize (vLLM's)."""

    model: str
    prompt: str
    add_special_tokens: Any = UNSET
    return_token_strs: bool | None = None

    UNSUPPORTED: ClassVar[dict[str, tuple[Any, ...]]] = {"add_special_tokens": (True,)}


class DetokenizeRequest(msgspec.Struct, kw_only=True):
    """POST /detokenize (vLLM's)."""

    model: str
    tokens: list[Any]
