"""Huge texts are refused (or cut, when the request asks) BEFORE tokenization, so one request cannot hold the
event loop for seconds; what is cut never changes the tokens the model sees.

The 2 s bounds are not a speed claim: tokenizing the 4 MB text takes several seconds here, so finishing well
under that shows the text was not tokenized whole."""
from __future__ import annotations

import json
import time
from pathlib import Path

import onnxruntime as ort
import pytest
from tokenizers import Tokenizer

from modelpkg import Manifest
from server.protocol.errors import ServingError
from server.generation import GenerationConfig, GenerationEngine, GenerationParams
from server.text.tokenizer import CHARS_PER_TOKEN_BOUND, TextEncoder

HUGE = "the king is dead " * 250_000  # ~4 MB


def test_huge_classify_text_is_refused_fast_and_truncation_keeps_the_exact_prefix(tiny_repository: Path) -> None:
    package = tiny_repository / "tiny-classifier" / "1"
    max_length = json.loads((package / "model.json").read_text())["max_length"]
    encoder = TextEncoder(package / "tokenizer.json", max_length)

    started = time.monotonic()
    with pytest.raises(ServingError) as refused:
        encoder.encode([("ok", None), (HUGE, None)])
    assert "inputs[1].text" in str(refused.value) and time.monotonic() - started < 2.0

    started = time.monotonic()
    [row] = encoder.encode([(HUGE, None)], truncate=True)
    assert time.monotonic() - started < 2.0
    # The reference: the tokenizer itself, truncating the whole text.
    reference = Tokenizer.from_file(str(package / "tokenizer.json"))
    reference.no_padding()
    reference.enable_truncation(max_length)
    assert row.ids == reference.encode(HUGE).ids

    with pytest.raises(ServingError, match=r"inputs\[0\]\.text_pair"):
        encoder.encode([("short", HUGE)])
    assert len(HUGE) > max_length * CHARS_PER_TOKEN_BOUND


def _tiny_engine(tiny_repository: Path) -> tuple[GenerationEngine, dict, Tokenizer]:
    """The tiny decoder's engine (not started: encode_prompt is all these tests call), manifest, tokenizer."""
    package = tiny_repository / "tiny-gpt" / "1"
    manifest = json.loads((package / "model.json").read_text())
    tokenizer = Tokenizer.from_file(str(package / "tokenizer.json"))
    session = ort.InferenceSession(str(package / "model.onnx"), providers=["CPUExecutionProvider"])
    return GenerationEngine(session, Manifest.from_dict(manifest), tokenizer, GenerationConfig(), None, "limits"), manifest, tokenizer


def test_huge_prompt_is_refused_fast_and_truncate_prompt_keeps_the_exact_tail(tiny_repository: Path) -> None:
    engine, manifest, tokenizer = _tiny_engine(tiny_repository)

    started = time.monotonic()
    with pytest.raises(ValueError, match="^prompt: "):
        engine.encode_prompt(HUGE, GenerationParams.validate(max_new_tokens=4))
    assert time.monotonic() - started < 2.0

    params = GenerationParams.validate(max_new_tokens=4, truncate_prompt=True)
    started = time.monotonic()
    ids = engine.encode_prompt(HUGE, params)
    assert time.monotonic() - started < 2.0
    room = manifest["max_length"] - 4
    assert ids == tokenizer.encode(HUGE).ids[-room:]


def test_a_huge_token_id_prompt_is_refused_fast_and_truncate_prompt_keeps_its_tail(tiny_repository: Path) -> None:
    """Token ids (the other prompt form of the OpenAI door and the task API): only the tail that can fit is
    looked at."""
    engine, manifest, _ = _tiny_engine(tiny_repository)
    vocab = manifest["vocab_size"]
    huge = [i % vocab for i in range(2_000_000)]
    huge[0] = vocab + 5                                   # outside the vocabulary, but cut away below

    started = time.monotonic()
    with pytest.raises(ValueError, match="^prompt: 2000000 tokens cannot fit"):
        engine.encode_prompt(huge, GenerationParams.validate(max_new_tokens=4))
    ids = engine.encode_prompt(huge, GenerationParams.validate(max_new_tokens=4, truncate_prompt=True))
    assert time.monotonic() - started < 1.0
    assert ids == huge[-(manifest["max_length"] - 4):]
    with pytest.raises(ValueError, match=rf"^prompt\[2\]: token id {vocab} is outside the vocabulary"):
        engine.encode_prompt([1, 2, vocab], GenerationParams.validate())
    with pytest.raises(ValueError, match=r"^prompt\[1\]: must be a token id, got bool"):
        engine.encode_prompt([1, True], GenerationParams.validate())
