"""A large token-classify answer is encoded a text at a time in a worker thread (server/grpc/task_messages.py,
server/http/token_classify.py): the bytes must parse as the answer built whole, on both doors."""
from __future__ import annotations

import json

from protos import ortserve_pb2 as pb
from server.encoders.token_aggregation import TokenEntity
from server.grpc.task_messages import token_classify_encoded, token_classify_to_proto
from server.http.token_classify import _answer
from server.protocol.types import TokenClassifyResult


def _result(strategy: str = "none") -> TokenClassifyResult:
    rows = [[TokenEntity(label="B-PER", score=0.125 * j, word=f"w{j}", start=2 * j, end=2 * j + 1,
                         index=j if strategy == "none" else None) for j in range(n)] for n in (3, 0, 5)]
    return TokenClassifyResult(model="tok", version=3, results=rows, labels=["O", "B-PER"],
                               aggregation_strategy=strategy)


def test_the_grpc_answer_encoded_a_text_at_a_time_parses_as_the_whole() -> None:
    parsed = pb.TokenClassifyResponse.FromString(token_classify_encoded(_result()))
    assert parsed == token_classify_to_proto(_result())
    assert [len(r.entities) for r in parsed.results] == [3, 0, 5] and parsed.results[2].entities[4].word == "w4"


def test_the_json_answer_encoded_a_text_at_a_time_is_the_whole() -> None:
    for strategy in ("none", "simple"):
        answer = json.loads(_answer(_result(strategy)))
        assert list(answer) == ["model", "version", "aggregation_strategy", "labels", "results"]
        assert answer["model"] == "tok" and answer["version"] == 3 and answer["labels"] == ["O", "B-PER"]
        assert [len(r) for r in answer["results"]] == [3, 0, 5]
        key = "entity" if strategy == "none" else "entity_group"
        assert answer["results"][2][1] == {key: "B-PER", "score": 0.125, "word": "w1", "start": 2, "end": 3,
                                           **({"index": 1} if strategy == "none" else {})}
