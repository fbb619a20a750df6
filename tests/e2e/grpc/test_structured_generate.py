"""GenerateRequest.constraint through the task API (gRPC), on the tiny random GPT: json_schema answers parse and
validate whatever the seed, as do regex, choice and Lark-grammar answers, streamed or not; a constraint the model
cannot compile is INVALID_ARGUMENT naming constraint.<kind>."""
from __future__ import annotations

import json
import re

import grpc
import jsonschema
import pytest

from protos import ortserve_pb2 as pb
from protos import ortserve_pb2_grpc as pb_grpc

GPT = "tiny-gpt"
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"},
                                           "n": {"type": "integer", "minimum": 0, "maximum": 99}},
          "required": ["ok", "n"], "additionalProperties": False}


def _request(constraint: pb.OutputConstraint, seed: int, max_new_tokens: int = 60) -> pb.GenerateRequest:
    return pb.GenerateRequest(model=GPT, prompt="Answer:", constraint=constraint, parameters=pb.GenerationParameters(
        max_new_tokens=max_new_tokens, temperature=1.0, seed=seed))


def test_json_schema_answers_parse_and_validate(tasks: pb_grpc.TaskServiceStub) -> None:
    texts = set()
    for seed in range(10):
        answer = tasks.Generate(_request(pb.OutputConstraint(json_schema=json.dumps(SCHEMA)), seed), timeout=60)
        assert answer.finish_reason == pb.FINISH_REASON_EOS, answer.text
        jsonschema.validate(json.loads(answer.text), SCHEMA)
        texts.add(answer.text)
    assert len(texts) > 1


def test_regex_choice_and_grammar_streamed_or_not(tasks: pb_grpc.TaskServiceStub) -> None:
    options = ["red", "green", "blue-ish"]
    cases = [(pb.OutputConstraint(regex=r"[a-f]{2}[0-9]{1,3}"), lambda t: re.fullmatch(r"[a-f]{2}[0-9]{1,3}", t)),
             (pb.OutputConstraint(choice=pb.Choices(options=options)), lambda t: t in options),
             (pb.OutputConstraint(grammar='start: "(" NUM ("+" NUM)? ")"\nNUM: /[0-9]{1,2}/\n'),
              lambda t: re.fullmatch(r"\([0-9]{1,2}(\+[0-9]{1,2})?\)", t))]
    for constraint, valid in cases:
        for seed in range(4):
            whole = tasks.Generate(_request(constraint, seed), timeout=60)
            assert whole.finish_reason == pb.FINISH_REASON_EOS and valid(whole.text), whole.text
            streamed = "".join(m.text for m in tasks.GenerateStream(_request(constraint, seed), timeout=60))
            assert streamed == whole.text      # the same seed: the same constrained draws


@pytest.mark.parametrize("constraint, field", [
    (pb.OutputConstraint(json_schema='{"type": "frob"}'), "constraint.json_schema"),
    (pb.OutputConstraint(json_schema='{"type": '), "constraint.json_schema"),
    (pb.OutputConstraint(regex="(a"), "constraint.regex"),
    (pb.OutputConstraint(choice=pb.Choices()), "constraint.choice"),
    (pb.OutputConstraint(grammar="start: nothing_defined"), "constraint.grammar"),
    (pb.OutputConstraint(), "constraint"),
])
def test_a_constraint_that_cannot_compile_is_invalid_argument_naming_it(tasks: pb_grpc.TaskServiceStub,
                                                                        constraint: pb.OutputConstraint,
                                                                        field: str) -> None:
    with pytest.raises(grpc.RpcError) as refused:
        tasks.Generate(_request(constraint, 0), timeout=60)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.details().startswith(f"{field}: "), refused.value.details()
