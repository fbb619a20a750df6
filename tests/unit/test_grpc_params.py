"""The gRPC door's GenerationParameters -> GenerationParams (server/grpc/task.py): a message validated once is
answered by its bytes afterwards; what it answers equals a fresh validation, and a refusal is never kept."""
from __future__ import annotations

import pytest

from protos import ortserve_pb2 as pb
from server.generation import GenerationParams
from server.grpc.task import params_from_proto, tokens_to_proto
from server.generation import GeneratedToken
from server.protocol.errors import Code, ServingError


def request(**parameters) -> pb.GenerateRequest:
    return pb.GenerateRequest(model="m", prompt="hi", parameters=pb.GenerationParameters(**parameters))


def test_the_same_parameters_message_is_validated_once_and_shared():
    first = params_from_proto(request(max_new_tokens=7, temperature=0.5, stop=["\n"], logit_bias={3: -1.0}))
    again = params_from_proto(request(max_new_tokens=7, temperature=0.5, stop=["\n"], logit_bias={3: -1.0}))
    assert again is first
    assert first == GenerationParams.validate(max_new_tokens=7, temperature=0.5, stop=["\n"], logit_bias={3: -1.0},
                                              early_stopping=None)
    other = params_from_proto(request(max_new_tokens=8, temperature=0.5, stop=["\n"], logit_bias={3: -1.0}))
    assert other is not first and other.max_new_tokens == 8
    # A language is part of what is asked: the same parameters with another one are another answer.
    translated = params_from_proto(pb.GenerateRequest(model="m", prompt="hi", target_language="fra_Latn",
                                                      parameters=pb.GenerationParameters(max_new_tokens=7)))
    assert translated.target_language == "fra_Latn"
    assert params_from_proto(request(max_new_tokens=7)).target_language is None


def test_a_refused_message_is_refused_every_time():
    for _ in range(2):
        with pytest.raises(ServingError) as info:
            params_from_proto(request(top_p=1.5))
        assert info.value.code is Code.INVALID_ARGUMENT and "parameters.top_p" in str(info.value)
    with pytest.raises(ServingError, match="parameters.early_stopping"):
        params_from_proto(request(early_stopping="sometimes"))


def test_a_long_message_is_validated_without_the_cache():
    stops = [f"stop number {i}" for i in range(4)]
    bias = {i: 0.5 for i in range(200)}      # beyond the bytes the cache keeps
    a = params_from_proto(request(logit_bias=bias, stop=stops))
    b = params_from_proto(request(logit_bias=bias, stop=stops))
    assert a == b and a is not b


def test_a_constrained_request_is_validated_each_time():
    req = pb.GenerateRequest(model="m", prompt="hi", parameters=pb.GenerationParameters(max_new_tokens=5),
                             constraint=pb.OutputConstraint(regex="[ab]+"))
    a, b = params_from_proto(req), params_from_proto(req)
    assert a.constraint is not None and a is not b
    bad = pb.GenerateRequest(model="m", prompt="hi", constraint=pb.OutputConstraint())
    with pytest.raises(ServingError, match="constraint: set one of"):
        params_from_proto(bad)


def test_tokens_become_messages_with_what_they_carry():
    plain, scored = GeneratedToken(token_id=5), GeneratedToken(token_id=6, logprob=-0.25, token="x")
    [p, s] = tokens_to_proto([plain, scored])
    assert (p.token_id, p.logprob, p.token, len(p.top_logprobs)) == (5, 0.0, "", 0)
    assert (s.token_id, s.logprob, s.token) == (6, -0.25, "x")


def test_the_cache_keeps_the_last_messages_and_lets_the_oldest_go():
    first = params_from_proto(request(max_new_tokens=3, seed=10_000))
    assert params_from_proto(request(max_new_tokens=3, seed=10_000)) is first
    for seed in range(256):       # as many other messages as the cache holds
        params_from_proto(request(max_new_tokens=3, seed=seed))
    again = params_from_proto(request(max_new_tokens=3, seed=10_000))
    assert again is not first and again == first
