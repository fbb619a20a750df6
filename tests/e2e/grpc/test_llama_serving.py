"""Llama-family decoders end to end: a checkpoint saved by `transformers` → `python -m export` (in-place graph,
grouped-query attention with rotary inside the op, through the parity gate) → a real server → Generate greedy
equal to `transformers`' own generate on the same prompt ids, for Llama, Qwen2, Mistral and Qwen3 (q/k norm, a
head_dim of its own, yarn rope scaling past an original context of 16 positions)."""
from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch

from clients import OrtserveClient
from tests.hf_decoder_export import serve_hf_decoders

transformers = pytest.importorskip("transformers")
logging.getLogger("transformers").setLevel(logging.ERROR)

PROMPTS = ["ROMEO. What light through yonder window breaks", "To be", "Once more unto the breach, dear friends"]
NEW = 12
KINDS = ("llama", "qwen2", "mistral", "qwen3")


def _hf(kind: str, vocab: int, eot: int):
    sizes = dict(vocab_size=vocab, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 intermediate_size=96, max_position_embeddings=128, initializer_range=0.2, bos_token_id=eot,
                 eos_token_id=eot, rope_theta=10000.0)
    if kind == "qwen2":
        cfg, cls = transformers.Qwen2Config(tie_word_embeddings=True, **sizes), transformers.Qwen2ForCausalLM
    elif kind == "mistral":   # its sliding window at the context length: not active (training/llama.py)
        cfg, cls = (transformers.MistralConfig(tie_word_embeddings=False, sliding_window=128, **sizes),
                    transformers.MistralForCausalLM)
    elif kind == "qwen3":
        yarn = dict(rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=16)
        cfg, cls = (transformers.Qwen3Config(tie_word_embeddings=True, head_dim=32, rope_parameters=yarn, **sizes),
                    transformers.Qwen3ForCausalLM)
    else:
        cfg, cls = transformers.LlamaConfig(tie_word_embeddings=False, **sizes), transformers.LlamaForCausalLM
    cfg._attn_implementation = "eager"
    torch.manual_seed(7)
    return cls(cfg).eval()


@pytest.fixture(scope="module")
def served(tiny_checkpoints, tmp_path_factory: pytest.TempPathFactory):
    def build(vocab: int, eot: int) -> dict:
        return {k: _hf(k, vocab, eot) for k in KINDS}

    with serve_hf_decoders(build, tiny_checkpoints.gpt, tmp_path_factory.mktemp("llama-serving")) as served:
        yield served


@pytest.mark.parametrize("kind", KINDS)
def test_package_is_inplace_with_grouped_query_attention(served, kind: str) -> None:
    _, repo, _, _ = served
    manifest = json.loads((repo / kind / "1" / "model.json").read_text())
    assert manifest["cache"]["layout"] == "inplace"
    assert (manifest["cache"]["num_heads"], manifest["cache"]["num_kv_heads"]) == (4, 2)
    assert "position_ids" not in [i["name"] for i in manifest["inputs"]]   # rotary: positions come from the mask
    checks = json.loads((repo / kind / "1" / "parity.json").read_text())["variants"]["fp32"]["checks"]
    assert checks and all(c["passed"] for c in checks)


@pytest.mark.parametrize("kind", KINDS)
def test_served_greedy_equals_transformers_generate(served, kind: str) -> None:
    server, _, models, tok = served
    hf = models[kind]
    with OrtserveClient(server.address, timeout=60) as client:
        for prompt in PROMPTS:
            ids = tok.encode(prompt).ids
            with torch.no_grad():
                want = hf.generate(torch.tensor([ids]), max_new_tokens=NEW, do_sample=False, min_new_tokens=NEW,
                                   pad_token_id=hf.config.eos_token_id)[0, len(ids):].tolist()
            got = client.generate(prompt, kind, max_new_tokens=NEW, ignore_eos=True)
            assert [t.token_id for t in got.tokens] == want, prompt
