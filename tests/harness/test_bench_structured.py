"""bench/structured.py's parts: it is listed, its 20-property schema compiles, its long schema cannot close before
the tokens asked for (so the constrained side generates as many tokens as the unconstrained one), and its table."""
from __future__ import annotations

import json

from tokenizers import Tokenizer

from bench.harness import NAMES, load
from bench.structured import LONGEST_TOKEN_CHARS, long_schema, render, schema_20
from server.structured import constraint_of
from server.structured.matcher import Grammars


def _tokenizer() -> Tokenizer:
    from training.tokenizer import TokenizerConfig, train_tokenizer

    return train_tokenizer(["a few words of text, some numbers 0123456789 and {\"json\": true}"] * 30,
                           TokenizerConfig(kind="bpe", vocab_size=300, min_frequency=1))


def test_listed_and_loadable() -> None:
    assert "structured" in NAMES and load("structured").sides == ("none", "json_schema")


def test_schemas_compile_and_the_long_one_outlasts_the_budget() -> None:
    tok = _tokenizer()
    assert max(len(tok.decode([i])) for i in range(tok.get_vocab_size())) < LONGEST_TOKEN_CHARS
    grammars = Grammars(tok, tok.get_vocab_size(), tok.token_to_id("<|endoftext|>"))
    schema = schema_20()
    assert len(schema["properties"]) == 20 and schema_20(1) != schema
    grammars.compile(constraint_of("json_schema", schema, "bench"))
    row = grammars.row(constraint_of("json_schema", long_schema(16), "bench"))
    eos = tok.token_to_id("<|endoftext|>")
    # The longest tokens the grammar allows, 16 times: still inside the string, end of text not allowed.
    import numpy as np

    for _ in range(16):
        scores = np.zeros(tok.get_vocab_size())
        row.apply(scores)
        allowed = np.flatnonzero(np.isfinite(scores))
        assert eos not in allowed
        row.advance(int(max(allowed, key=lambda i: len(tok.decode([int(i)])))))
    assert not row.accepting


def test_table() -> None:
    result = {"cells": {"1": {"none": [100.0, 110.0], "json_schema": [90.0, 99.0]}},
              "compile": {"schema_20_cold_s": 0.002, "schema_20_cached_s": 0.0001, "tokenizer_s": 0.2,
                          "mask_step_ms": 0.05}}
    lines = render(json.loads(json.dumps(result)))
    assert lines[2] == "| 1 | 105.0 | 94.5 | 0.90 |"
    assert "cold 2.0 ms" in lines[3] and "0.050 ms per step of 8 greedy rows" in lines[3]
