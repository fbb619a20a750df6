"""The token list beside the text, one rule on every door and mode (issue 40 item 10; docs/protocol.md "Tokens beside
the text"): a response's tokens are exactly those whose text is in its output, so the joined tokens are the text —
with ignore_eos, eos is an ordinary token whose text (`<|endoftext|>`) is in the output; a stop string takes the
tokens wholly inside it out of the list with its text; a token in which a stop string begins stays (its text
before the stop string ends the output).

A real server on the shared tiny repository; HTTP through the `openai` client (stream and not, logprobs on), gRPC
through the project's client (unary and stream)."""
from __future__ import annotations

from pathlib import Path

import openai
import pytest
from tokenizers import Tokenizer

from clients import OrtserveClient
from tests.server_process import ServerProcess

GPT = "tiny-gpt"
PROMPT = "To be, or not to be"
EOS = "<|endoftext|>"


@pytest.fixture(scope="module")
def tok(tiny_repository: Path) -> Tokenizer:
    return Tokenizer.from_file(str(tiny_repository / GPT / "1" / "tokenizer.json"))


def _http(server: ServerProcess, stream: bool, **body) -> tuple[str, list[str]]:
    """(text, token texts) of one /v1/completions answer."""
    client = openai.OpenAI(base_url=f"{server.http_url}/v1", api_key="unused", max_retries=0, timeout=60)
    extra = {k: body.pop(k) for k in ("ignore_eos",) if k in body}
    answer = client.completions.create(model=GPT, prompt=PROMPT, logprobs=0, stream=stream, extra_body=extra,
                                       temperature=0, **body)
    if not stream:
        return answer.choices[0].text, list(answer.choices[0].logprobs.tokens)
    text, tokens = "", []
    for chunk in answer:
        for choice in chunk.choices:
            text += choice.text
            tokens += choice.logprobs.tokens if choice.logprobs is not None else []
    return text, tokens


def _grpc(server: ServerProcess, tok: Tokenizer, stream: bool, **params) -> tuple[str, list[str]]:
    """(text, each token's text decoded alone) of one Generate / GenerateStream answer."""
    params["max_new_tokens"] = params.pop("max_tokens")
    if "logit_bias" in params:    # JSON's string keys, gRPC's integer ones
        params["logit_bias"] = {int(k): v for k, v in params["logit_bias"].items()}
    with OrtserveClient(server.address, timeout=60) as client:
        if stream:
            chunks = list(client.generate_stream(PROMPT, GPT, logprobs=True, **params))
            text, ids = "".join(c.text for c in chunks), [t.token_id for c in chunks for t in c.tokens]
        else:
            got = client.generate(PROMPT, GPT, logprobs=True, **params)
            text, ids = got.text, [t.token_id for t in got.tokens]
    return text, [tok.decode([i], skip_special_tokens=False) for i in ids]


def _doors(server: ServerProcess, tok: Tokenizer, **params) -> dict[str, tuple[str, list[str]]]:
    return {"http": _http(server, False, **params), "http stream": _http(server, True, **params),
            "grpc": _grpc(server, tok, False, **params), "grpc stream": _grpc(server, tok, True, **params)}


def test_ignore_eos_keeps_the_eos_text_with_its_token_on_every_door(server: ServerProcess, tok: Tokenizer) -> None:
    eos = tok.token_to_id(EOS)
    for door, (text, tokens) in _doors(server, tok, max_tokens=4, ignore_eos=True,
                                       logit_bias={str(eos): 100}).items():
        assert tokens == [EOS] * 4, door
        assert text == "".join(tokens) == EOS * 4, door


def test_a_stop_string_takes_its_tokens_out_with_its_text_on_every_door(server: ServerProcess,
                                                                           tok: Tokenizer) -> None:
    text, tokens = _http(server, False, max_tokens=8, ignore_eos=True)
    assert text == "".join(tokens) and len(tokens) == 8
    first, second = tokens[0], tokens[1]
    # The tiny model's answer here starts with a token of two characters or more (it repeats " be").
    assert len(first) >= 2 and text.find(first[1:] + second[:1]) == 1, tokens
    # A stop string of whole tokens (the first two): no text, and neither token is listed (both were, before).
    for door, (got, listed) in _doors(server, tok, max_tokens=8, ignore_eos=True, stop=[first + second]).items():
        assert (got, listed) == ("", []), door
    # One that begins inside the first token and runs into the second: the first token's text before it is the
    # output, and that token stays listed; the second is not.
    for door, (got, listed) in _doors(server, tok, max_tokens=8, ignore_eos=True,
                                      stop=[first[1:] + second[:1]]).items():
        assert (got, listed) == (first[:1], [first]), door
