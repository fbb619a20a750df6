"""Structured outputs in process: constraints checked by name, llguidance's masks on a real byte-level BPE tokenizer
driving the sampler (random logits, sampling on: every answer parses and validates), Hermes tool calls parsed whole
and as a stream."""
from __future__ import annotations

import asyncio
import json
import re

import jsonschema
import numpy as np
import pytest
from tokenizers import Tokenizer

from server.generation import GenerationParams
from server.generation.sampling import Sampler, choose_rows
from server.structured import Constraint, constraint_of
from server.structured.hermes import HermesStream, ToolCall, parse_tool_calls
from server.structured.matcher import Grammars, constraint_rows
from server.structured.spec import MAX_CONSTRAINT_CHARS, MAX_SCHEMA_DEPTH
from server.structured.tools import chosen_tools, tool_constraint, tools_of

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 6},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120},
                                           "pet": {"enum": ["cat", "dog"]}},
          "required": ["name", "age", "pet"], "additionalProperties": False}
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"enum": ["Paris", "Oslo"]}, "days": {"type": "integer", "minimum": 1,
                                                                                   "maximum": 7}},
    "required": ["city", "days"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"tz": {"enum": ["UTC", "CET"]}}, "required": ["tz"],
    "additionalProperties": False}}}


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    from training.tokenizer import TokenizerConfig, train_tokenizer

    texts = ["The weather in Paris is mild, {\"name\": \"Ann\", \"age\": 41}.", "hello world 0123456789 <tool_call>"]
    return train_tokenizer(texts * 20, TokenizerConfig(kind="bpe", vocab_size=320, min_frequency=1))


@pytest.fixture(scope="module")
def grammars(tokenizer: Tokenizer) -> Grammars:
    # Logits wider than the tokenizer (as exported models pad their vocabulary): the extra ids are never allowed.
    return Grammars(tokenizer, tokenizer.get_vocab_size() + 5, tokenizer.token_to_id("<|endoftext|>"))


def generate(grammars: Grammars, tokenizer: Tokenizer, constraint: Constraint, seed: int, max_tokens: int = 200,
             temperature: float = 1.0) -> tuple[str, bool]:
    """Sample with random logits through the engine's sampler; (text, ended with end-of-text)."""
    params = GenerationParams.validate(temperature=temperature, seed=seed, max_new_tokens=max_tokens,
                                       constraint=constraint)
    row = asyncio.run(constraint_rows(grammars, [constraint]))[0]
    sampler = Sampler(params, grammars.vocab_size, [1], grammars.eos_id, constraint=row)
    rng = np.random.default_rng(seed + 1000)
    out: list[int] = []
    for _ in range(max_tokens):
        token = choose_rows([sampler], rng.normal(scale=4.0, size=(1, grammars.vocab_size)).astype(np.float32))[0]
        if token.token_id == grammars.eos_id:
            return tokenizer.decode(out), True
        assert token.token_id < tokenizer.get_vocab_size()
        out.append(token.token_id)
    return tokenizer.decode(out), False


def test_json_schema_answers_always_parse_and_validate(grammars: Grammars, tokenizer: Tokenizer) -> None:
    constraint = constraint_of("json_schema", SCHEMA, "response_format.json_schema.schema")
    for seed in range(12):
        text, ended = generate(grammars, tokenizer, constraint, seed)
        assert ended, text
        jsonschema.validate(json.loads(text), SCHEMA)


def test_choice_regex_and_lark_grammar(grammars: Grammars, tokenizer: Tokenizer) -> None:
    options = ["yes", "no", "maybe \"so\""]
    regex = r"[0-9]{3}-[a-c]{2}"
    lark = 'start: greeting " " NAME\ngreeting: "hello" | "hi"\nNAME: /[a-z]{1,5}/\n'
    for seed in range(6):
        assert generate(grammars, tokenizer, constraint_of("choice", options, "guided_choice"), seed)[0] in options
        assert re.fullmatch(regex, generate(grammars, tokenizer, constraint_of("regex", regex, "guided_regex"),
                                            seed)[0])
        text = generate(grammars, tokenizer, constraint_of("grammar", lark, "guided_grammar"), seed)[0]
        assert re.fullmatch(r"(hello|hi) [a-z]{1,5}", text), text
        gbnf = 'root ::= ("yes" | "no") " " [0-9] [0-9]?'
        text = generate(grammars, tokenizer, constraint_of("grammar", gbnf, "guided_grammar"), seed)[0]
        assert re.fullmatch(r"(yes|no) [0-9]{1,2}", text), text


def test_greedy_constrained_rows_beside_unconstrained_ones(grammars: Grammars) -> None:
    """choose_rows takes unconstrained greedy rows together; a constrained greedy row is masked on its own."""
    constraint = constraint_of("choice", ["hello"], "guided_choice")
    row = asyncio.run(constraint_rows(grammars, [constraint]))[0]
    params = GenerationParams.validate(temperature=0.0, constraint=constraint)
    free = Sampler(GenerationParams.validate(temperature=0.0), grammars.vocab_size, [1])
    bound = Sampler(params, grammars.vocab_size, [1], grammars.eos_id, constraint=row)
    logits = np.zeros((2, grammars.vocab_size), dtype=np.float32)
    logits[:, 7] = 50.0
    free_pick, bound_pick = choose_rows([free, bound], logits)
    assert free_pick.token_id == 7 and bound_pick.token_id != 7


def test_refusals_name_the_field(grammars: Grammars) -> None:
    with pytest.raises(ValueError, match=r"^response_format\.json_schema\.schema: .*frob"):
        grammars.compile(constraint_of("json_schema", {"type": "frob"}, "response_format.json_schema.schema"))
    with pytest.raises(ValueError, match=r"^guided_regex: cannot be compiled"):
        asyncio.run(constraint_rows(grammars, [constraint_of("regex", "a(", "guided_regex")]))
    with pytest.raises(ValueError, match=r"^guided_grammar: cannot be compiled.*bar"):
        grammars.compile(constraint_of("grammar", "start: foo\nfoo: bar", "guided_grammar"))
    deep: dict = {"type": "object"}
    for _ in range(MAX_SCHEMA_DEPTH + 2):
        deep = {"type": "object", "properties": {"a": deep}}
    with pytest.raises(ValueError, match=r"^guided_json: the schema nests \d+ levels deep"):
        constraint_of("json_schema", deep, "guided_json")
    with pytest.raises(ValueError, match=r"^guided_regex: \d+ characters"):
        constraint_of("regex", "a" * (MAX_CONSTRAINT_CHARS + 1), "guided_regex")
    with pytest.raises(ValueError, match=r"^guided_choice\[1\]: must be a non-empty string"):
        constraint_of("choice", ["a", ""], "guided_choice")
    with pytest.raises(ValueError, match=r"^constraint\.json_schema: not valid JSON"):
        constraint_of("json_schema", "{\"type\":", "constraint.json_schema")
    with pytest.raises(ValueError, match=r"^parameters\.ignore_eos: not served with a structured-output constraint"):
        GenerationParams.validate(ignore_eos=True, constraint=constraint_of("regex", "a", "guided_regex"))
    with pytest.raises(ValueError, match=r"^structured_outputs\.json: structured outputs are served for decoder"):
        asyncio.run(constraint_rows(grammars, [constraint_of("json_schema", {}, "structured_outputs.json")],
                                    decoder=False))


def test_compiled_constraints_are_cached_per_model_lru(tokenizer: Tokenizer) -> None:
    grammars = Grammars(tokenizer, tokenizer.get_vocab_size(), 0, cache_size=2)
    a, b, c = (constraint_of("regex", r, "guided_regex") for r in ("a+", "b+", "c+"))
    first = grammars.compile(a)
    assert grammars.compile(constraint_of("regex", "a+", "structured_outputs.regex")) is first  # field aside
    grammars.compile(b)
    grammars.compile(c)
    assert not grammars.cached(a) and grammars.cached(b) and grammars.cached(c)


def test_tool_choice_grammars_force_hermes_calls(grammars: Grammars, tokenizer: Tokenizer) -> None:
    tools = tools_of([WEATHER, TIME])
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, TIME)}
    for mode, choice in (("required", "required"), ("named", {"type": "function", "function": {"name": "get_time"}})):
        _, callable_tools = chosen_tools(tools, choice)
        constraint = tool_constraint(mode, callable_tools, parallel=False)
        assert constraint is not None
        for seed in range(4):
            text, ended = generate(grammars, tokenizer, constraint, seed)
            content, calls = parse_tool_calls(text)
            assert ended and content == "" and len(calls) == 1, text
            assert mode == "required" or calls[0].name == "get_time"
            jsonschema.validate(json.loads(calls[0].arguments), schemas[calls[0].name])
    assert tool_constraint("auto", tools, True) is None
    with pytest.raises(ValueError, match=r"^tool_choice\.function\.name: no tool named 'nope'"):
        chosen_tools(tools, {"type": "function", "function": {"name": "nope"}})
    with pytest.raises(ValueError, match=r"^tools\[1\]\.function\.name: 'get_time' is named by an earlier tool"):
        tools_of([TIME, TIME])
    with pytest.raises(ValueError, match=r"^tools\[0\]\.type"):
        tools_of([{"type": "retrieval"}])


def test_hermes_blocks_whole_and_streamed() -> None:
    text = ('Let me look. <tool_call>\n{"name": "get_time", "arguments": {"tz": "UTC"}}\n</tool_call>\n'
            '<tool_call>\n{"name": "f", "arguments": "{\\"x\\": 1}"}\n</tool_call><tool_call>\nnot json\n</tool_call>')
    content, calls = parse_tool_calls(text)
    assert calls == [ToolCall("get_time", '{"tz": "UTC"}'), ToolCall("f", '{"x": 1}')]
    assert content == "Let me look. \n<tool_call>\nnot json\n</tool_call>"
    stream, events = HermesStream(), []
    for i in range(0, len(text), 3):
        events += stream.feed(text[i:i + 3])
    events += stream.finish()
    assert [v for k, v in events if k == "call"] == calls
    assert "".join(str(v) for k, v in events if k == "content") == content
    assert not any(k == "content" and "<tool" in str(v) and "not json" not in str(v) for k, v in events)
