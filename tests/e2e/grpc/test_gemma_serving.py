"""Gemma 2 and Gemma 3 text end to end: a checkpoint saved by `transformers` → `python -m export` (the in-place graph
with sliding-window layers, soft-capping and, for Gemma 3, q/k norms and two rotary bases; through the parity gate)
→ a real server prefilling in chunks of 4 → Generate greedy equal to `transformers`' own generate (eager attention)
on prompts longer than the window, decoding further past it."""
from __future__ import annotations

import json
import logging

import pytest
import torch

from clients import OrtserveClient
from tests.conftest import one_torch_thread
from tests.gemma_models import KINDS, WINDOW, hf_gemma
from tests.hf_decoder_export import serve_hf_decoders

logging.getLogger("transformers").setLevel(logging.ERROR)

PROMPTS = ["ROMEO. What light through yonder window breaks", "To be",
           "Once more unto the breach, dear friends, once more"]
NEW = 12


@pytest.fixture(scope="module")
def served(tiny_checkpoints, tmp_path_factory: pytest.TempPathFactory):
    def build(vocab: int, eot: int) -> dict:
        return {k: hf_gemma(k, vocab=vocab, bos_token_id=eot, eos_token_id=eot, pad_token_id=eot) for k in KINDS}

    with serve_hf_decoders(build, tiny_checkpoints.gpt, tmp_path_factory.mktemp("gemma-serving")) as served:
        yield served


@pytest.mark.parametrize("kind", KINDS)
def test_served_greedy_equals_transformers_generate(served, kind: str) -> None:
    server, repo, models, tok = served
    checks = json.loads((repo / kind / "1" / "parity.json").read_text())["variants"]["fp32"]["checks"]
    assert checks and all(c["passed"] for c in checks)
    hf = models[kind]
    assert max(len(tok.encode(p).ids) for p in PROMPTS) > WINDOW
    with OrtserveClient(server.address, timeout=60) as client:
        for prompt in PROMPTS:
            ids = tok.encode(prompt).ids
            with torch.no_grad(), one_torch_thread():
                want = hf.generate(torch.tensor([ids]), max_new_tokens=NEW, do_sample=False, min_new_tokens=NEW,
                                   pad_token_id=hf.config.eos_token_id)[0, len(ids):].tolist()
            got = client.generate(prompt, kind, max_new_tokens=NEW, ignore_eos=True)
            assert [t.token_id for t in got.tokens] == want, prompt
