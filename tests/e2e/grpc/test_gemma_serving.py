"""Gemma 2 and Gemma 3 text end to end: a checkpoint saved by `transformers` → `python -m export` (the in-place graph
with sliding-window layers, soft-capping and, for Gemma 3, q/k norms and two rotary bases; through the parity gate)
→ a real server prefilling in chunks of 4 → Generate greedy equal to `transformers`' own generate (eager attention)
on prompts longer than the window, decoding further past it."""
from __future__ import annotations

import json
import logging
import subprocess
import sys

import pytest
import torch
from tokenizers import Tokenizer

from clients import OrtserveClient
from testing.launch import ROOT
from tests.conftest import one_torch_thread
from tests.gemma_models import KINDS, WINDOW, hf_gemma
from tests.server_process import ServerProcess

logging.getLogger("transformers").setLevel(logging.ERROR)

PROMPTS = ["ROMEO. What light through yonder window breaks", "To be",
           "Once more unto the breach, dear friends, once more"]
NEW = 12


@pytest.fixture(scope="module")
def served(tiny_checkpoints, tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("gemma-serving")
    tok_files = [p for p in tiny_checkpoints.gpt.iterdir() if p.name.startswith(("tokenizer", "special_tokens"))]
    tok = Tokenizer.from_file(str(tiny_checkpoints.gpt / "tokenizer.json"))
    eot = tok.token_to_id("<|endoftext|>")
    models = {}
    for kind in KINDS:
        hf = hf_gemma(kind, vocab=tok.get_vocab_size(), bos_token_id=eot, eos_token_id=eot, pad_token_id=eot)
        ckpt = root / kind
        hf.save_pretrained(ckpt)
        for f in tok_files:
            (ckpt / f.name).write_bytes(f.read_bytes())
        proc = subprocess.run([sys.executable, "-m", "export", str(ckpt), "--task", "generate", "--repository",
                               str(root / "repo"), "--name", kind], cwd=ROOT, capture_output=True, text=True,
                              timeout=600)
        assert proc.returncode == 0, proc.stderr
        models[kind] = hf
    with ServerProcess(root / "repo", ["--max-sequences", "4", "--prefill-chunk-tokens", "4"]) as server:
        yield server, root / "repo", models, tok


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
