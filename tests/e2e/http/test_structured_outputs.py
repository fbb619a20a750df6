"""Structured outputs and tool calls through the HTTP door with the stock `openai` client, against a real server on a
randomly initialised decoder (the tiny GPT checkpoint, exported with a Qwen2-style chat template that renders tools):
whatever the random weights and seeds, every constrained answer parses and validates."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any, Iterator

import jsonschema
import openai
import pytest
from tests.door_calls import post_json
from tests.server_process import ServerProcess
from tests.structured_models import qwen2_repository

CHAT = "chat-gpt"
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120},
                                           "pets": {"type": "array", "items": {"enum": ["cat", "dog", "owl"]},
                                                    "maxItems": 3}},
          "required": ["name", "age", "pets"], "additionalProperties": False}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
                                            "parameters": {"type": "object", "properties": {
                                                "city": {"enum": ["Paris", "Oslo", "Lima"]},
                                                "days": {"type": "integer", "minimum": 1, "maximum": 7}},
                                                "required": ["city", "days"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"tz": {"enum": ["UTC", "CET"]}}, "required": ["tz"],
    "additionalProperties": False}}}
PARAMETERS = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, TIME)}
# Qwen2's shape: tools listed in a system turn, calls as Hermes blocks, tool results as <tool_response> user turns.
TEMPLATE = (
    "{% if tools %}<|im_start|>system\nYou may call these functions:\n<tools>\n{% for tool in tools %}"
    "{{ tool | tojson }}\n{% endfor %}</tools><|im_end|>\n{% endif %}"
    "{% for m in messages %}{% if m.role == 'assistant' and m.tool_calls %}<|im_start|>assistant\n"
    "{% for tc in m.tool_calls %}<tool_call>\n{\"name\": \"{{ tc.function.name }}\", \"arguments\": "
    "{{ tc.function.arguments | tojson }}}\n</tool_call>\n{% endfor %}<|im_end|>\n"
    "{% elif m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n</tool_response><|im_end|>\n"
    "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
ASK = [{"role": "user", "content": "Weather in Oslo?"}]


@pytest.fixture(scope="module")
def tools_repository(tiny_checkpoints: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random Qwen2-shaped decoder (context 1024: tools take room in the prompt) with the tiny GPT's tokenizer
    and TEMPLATE in its tokenizer_config.json, exported by the command line."""
    root = tmp_path_factory.mktemp("tools")
    tokenizer_dir = root / "tokenizer"
    shutil.copytree(tiny_checkpoints.gpt, tokenizer_dir)
    config = json.loads((tokenizer_dir / "tokenizer_config.json").read_text())
    config.update(chat_template=TEMPLATE, model_max_length=1024)
    (tokenizer_dir / "tokenizer_config.json").write_text(json.dumps(config))
    return qwen2_repository(tokenizer_dir, root, CHAT)


@pytest.fixture(scope="module")
def oai(tools_repository: Path) -> Iterator[openai.OpenAI]:
    with ServerProcess(tools_repository, ["--http-port", "0", "--max-sequences", "8"]) as proc:
        yield openai.OpenAI(base_url=f"{proc.http_url}/v1", api_key="x", max_retries=0, timeout=120)


def test_json_schema_answers_parse_and_validate_with_sampling(oai: openai.OpenAI) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA, "strict": True}}
    chat = oai.chat.completions.create(model=CHAT, messages=ASK, response_format=fmt, n=8, seed=1, temperature=1.0,
                                       max_tokens=120)
    texts = [c.message.content for c in chat.choices if c.finish_reason == "stop"]
    completion = oai.completions.create(model=CHAT, prompt="Someone:", n=8, seed=9, temperature=1.5, max_tokens=120,
                                        extra_body={"response_format": fmt})
    texts += [c.text for c in completion.choices if c.finish_reason == "stop"]
    assert len(texts) == 16     # every answer ended where the schema was complete
    for text in texts:
        jsonschema.validate(json.loads(text), SCHEMA)
    assert len(set(texts)) > 1   # sampled, not one answer


def test_json_object_vllm_json_and_guided_json(oai: openai.OpenAI) -> None:
    root = str(oai.base_url).rstrip("/").removesuffix("/v1")
    brace = post_json(f"{root}/tokenize", {"model": CHAT, "prompt": "}"})[1]["tokens"]
    assert len(brace) == 1
    # The bias makes "}" the likeliest token wherever the grammar allows it: the object closes at once.
    obj = oai.chat.completions.create(model=CHAT, messages=ASK, response_format={"type": "json_object"},
                                      max_tokens=40, temperature=0, logit_bias={str(brace[0]): 100})
    assert json.loads(obj.choices[0].message.content) == {} and obj.choices[0].finish_reason == "stop"
    for body in ({"structured_outputs": {"json": SCHEMA}}, {"guided_json": json.dumps(SCHEMA)}):
        answer = oai.completions.create(model=CHAT, prompt="x", max_tokens=120, temperature=1.0, seed=3, n=4,
                                        extra_body=body)
        for c in answer.choices:
            assert c.finish_reason == "stop"
            jsonschema.validate(json.loads(c.text), SCHEMA)


def test_choice_regex_and_lark_grammar(oai: openai.OpenAI) -> None:
    options = ["positive", "negative", "a bit \"mixed\""]
    lark = 'start: greeting " " NAME\ngreeting: "hello" | "hi"\nNAME: /[a-z]{1,5}/\n'
    cases = [({"guided_choice": options}, lambda t: t in options),
             ({"structured_outputs": {"choice": options}}, lambda t: t in options),
             ({"guided_regex": r"[0-9]{3}-[a-c]{2}"}, lambda t: re.fullmatch(r"[0-9]{3}-[a-c]{2}", t)),
             ({"structured_outputs": {"regex": r"(yes|no), [0-9]+\."}}, lambda t: re.fullmatch(r"(yes|no), [0-9]+\.", t)),
             ({"guided_grammar": lark}, lambda t: re.fullmatch(r"(hello|hi) [a-z]{1,5}", t)),
             ({"structured_outputs": {"grammar": lark}}, lambda t: re.fullmatch(r"(hello|hi) [a-z]{1,5}", t)),
             ({"guided_grammar": 'root ::= "v" [0-9] "." [0-9]'}, lambda t: re.fullmatch(r"v[0-9]\.[0-9]", t))]
    for body, valid in cases:
        answer = oai.completions.create(model=CHAT, prompt="Review:", max_tokens=60, temperature=1.0, seed=7, n=6,
                                        extra_body=body)
        for c in answer.choices:
            assert c.finish_reason == "stop" and valid(c.text), (body, c.text)
    chat = oai.chat.completions.create(model=CHAT, messages=ASK, max_tokens=20, extra_body={"guided_choice": options})
    assert chat.choices[0].message.content in options


@pytest.mark.parametrize("body, field", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "frob"}}}},
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format.json_schema.schema"),
    ({"response_format": {"type": "yaml"}}, "response_format.type"),
    ({"guided_regex": "a("}, "guided_regex"),
    ({"structured_outputs": {"grammar": "start: foo\nfoo: bar"}}, "structured_outputs.grammar"),
    ({"structured_outputs": {"structural_tag": "{}"}}, "structured_outputs.structural_tag"),
    ({"guided_choice": []}, "guided_choice"),
    ({"guided_json": "{\"type\": "}, "guided_json"),
    ({"guided_regex": "a", "guided_choice": ["a"]}, "guided_choice"),
    ({"guided_regex": "a", "ignore_eos": True}, "ignore_eos"),
])
def test_refused_constraints_name_the_field(oai: openai.OpenAI, body: dict[str, Any], field: str) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        oai.completions.create(model=CHAT, prompt="x", max_tokens=4, extra_body=body)
    assert err.value.response.json()["error"]["message"].startswith(f"{field}: ")


def _call_arguments(message: Any) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for call in message.tool_calls:
        assert call.type == "function" and call.id.startswith("call_")
        arguments = json.loads(call.function.arguments)
        jsonschema.validate(arguments, PARAMETERS[call.function.name])
        out.append((call.function.name, arguments))
    return out


def test_tool_choice_required_and_named(oai: openai.OpenAI) -> None:
    for seed in range(4):
        answer = oai.chat.completions.create(model=CHAT, messages=ASK, tools=[WEATHER, TIME], tool_choice="required",
                                             parallel_tool_calls=False, seed=seed, temperature=1.0, max_tokens=200)
        choice = answer.choices[0]
        assert choice.finish_reason == "tool_calls" and len(_call_arguments(choice.message)) == 1
        assert choice.message.content is None
    named = oai.chat.completions.create(model=CHAT, messages=ASK, tools=[WEATHER, TIME], seed=1, temperature=1.0,
                                        tool_choice={"type": "function", "function": {"name": "get_weather"}},
                                        parallel_tool_calls=False, max_tokens=200, n=3)
    for choice in named.choices:
        assert choice.finish_reason == "tool_calls"
        assert [name for name, _ in _call_arguments(choice.message)] == ["get_weather"]
    with pytest.raises(openai.BadRequestError, match="tool_choice.function.name"):
        oai.chat.completions.create(model=CHAT, messages=ASK, tools=[WEATHER], max_tokens=8,
                                    tool_choice={"type": "function", "function": {"name": "nope"}})
    with pytest.raises(openai.BadRequestError, match="tool_choice: a tool choice that forces a call cannot"):
        oai.chat.completions.create(model=CHAT, messages=ASK, tools=[WEATHER], tool_choice={
            "type": "function", "function": {"name": "get_weather"}}, max_tokens=8, extra_body={"guided_regex": "a"})


def test_tool_choice_auto_finds_hermes_calls_in_the_output(oai: openai.OpenAI) -> None:
    # The output is made deterministic by a grammar: a sentence, then one Hermes block the auto parser must find.
    block = '<tool_call>\n{"name": "get_time", "arguments": {"tz": "CET"}}\n</tool_call>'
    grammar = f"start: {json.dumps('One moment. ')} {json.dumps(block)}\n"
    auto = oai.chat.completions.create(model=CHAT, messages=ASK, tools=[WEATHER, TIME], tool_choice="auto",
                                       max_tokens=200, extra_body={"guided_grammar": grammar})
    choice = auto.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "One moment."
    assert _call_arguments(choice.message) == [("get_time", {"tz": "CET"})]
    # tool_choice none: the same text is content.
    none = oai.chat.completions.create(model=CHAT, messages=ASK, tools=[WEATHER, TIME], tool_choice="none",
                                       max_tokens=200, extra_body={"guided_grammar": grammar})
    assert none.choices[0].message.content == "One moment. " + block and not none.choices[0].message.tool_calls
    plain = oai.chat.completions.create(model=CHAT, messages=ASK, tools=[WEATHER], max_tokens=20,
                                        extra_body={"guided_choice": ["No call needed."]})
    assert plain.choices[0].message.content == "No call needed." and plain.choices[0].finish_reason == "stop"


def test_streamed_tool_calls_arrive_as_openai_deltas(oai: openai.OpenAI) -> None:
    for tool_choice in ({"type": "function", "function": {"name": "get_weather"}}, "required"):
        names: dict[int, str] = {}
        arguments: dict[int, str] = {}
        finish = None
        for chunk in oai.chat.completions.create(model=CHAT, messages=ASK, tools=[WEATHER, TIME], stream=True,
                                                 tool_choice=tool_choice, parallel_tool_calls=False, seed=2,
                                                 temperature=1.0, max_tokens=200):
            for c in chunk.choices:
                for call in c.delta.tool_calls or []:
                    if call.function.name:
                        names[call.index] = call.function.name
                    arguments[call.index] = arguments.get(call.index, "") + (call.function.arguments or "")
                assert not (c.delta.content or "").strip()
                finish = c.finish_reason or finish
        assert finish == "tool_calls" and list(names) == [0]
        assert tool_choice == "required" or names[0] == "get_weather"
        jsonschema.validate(json.loads(arguments[0]), PARAMETERS[names[0]])


def test_tools_and_tool_results_render_through_the_template(oai: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": "Time?"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "get_time", "arguments": "{\"tz\": \"UTC\"}"}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "12:00"}]
    rendered = ("<|im_start|>system\nYou may call these functions:\n<tools>\n" + json.dumps(TIME) + "\n</tools><|im_end|>\n"
                "<|im_start|>user\nTime?<|im_end|>\n<|im_start|>assistant\n<tool_call>\n"
                "{\"name\": \"get_time\", \"arguments\": {\"tz\": \"UTC\"}}\n</tool_call>\n<|im_end|>\n"
                "<|im_start|>user\n<tool_response>\n12:00\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
    chat = oai.chat.completions.create(model=CHAT, messages=messages, tools=[TIME], tool_choice="none", max_tokens=6,
                                       temperature=0, extra_body={"ignore_eos": True})
    ref = oai.completions.create(model=CHAT, prompt=rendered, max_tokens=6, temperature=0,
                                 extra_body={"ignore_eos": True})
    assert chat.usage.prompt_tokens == ref.usage.prompt_tokens
    assert chat.choices[0].message.content == ref.choices[0].text


def test_constrained_rows_beside_unconstrained_ones_and_streamed(oai: openai.OpenAI) -> None:
    """Constrained and unconstrained requests decoding in one batch: each mask stays on its own row (the free
    answers equal their solo answers), and a streamed constrained answer equals the whole one of the same seed."""
    from concurrent.futures import ThreadPoolExecutor

    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}}
    free = dict(model=CHAT, prompt="The weather", max_tokens=24, temperature=0, extra_body={"ignore_eos": True})
    solo = oai.completions.create(**free).choices[0].text

    def constrained(seed: int) -> str:
        return oai.completions.create(model=CHAT, prompt="Who:", max_tokens=120, temperature=1.0, seed=seed,
                                      extra_body={"response_format": fmt}).choices[0].text

    with ThreadPoolExecutor(6) as pool:
        shaped = [pool.submit(constrained, seed) for seed in range(3)]
        plain = [pool.submit(lambda: oai.completions.create(**free).choices[0].text) for _ in range(3)]
        texts = [f.result() for f in shaped]
        assert [f.result() for f in plain] == [solo] * 3
    for text in texts:
        jsonschema.validate(json.loads(text), SCHEMA)
    whole = oai.chat.completions.create(model=CHAT, messages=ASK, response_format=fmt, seed=4, temperature=1.0,
                                        max_tokens=120)
    streamed = "".join(c.choices[0].delta.content or "" for c in oai.chat.completions.create(
        model=CHAT, messages=ASK, response_format=fmt, seed=4, temperature=1.0, max_tokens=120, stream=True)
        if c.choices)
    assert streamed == whole.choices[0].message.content
    jsonschema.validate(json.loads(streamed), SCHEMA)
