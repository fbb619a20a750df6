"""The context cap end to end: a Qwen2-shaped checkpoint of 256 positions (rotary, grouped-query attention), saved by
`transformers`, exported with `python -m export --max-length 64`, served by real server processes: the package's
context is 64 (model.json, the cache, ModelInfo), greedy ids within it equal transformers' own, a longer request is
refused by name before compute, ModelInfo's cache bytes are the slots' (computed here from the shapes), and the
server's --max-model-len caps it further but is refused by name when larger than the package's."""
from __future__ import annotations

import json
import logging
import subprocess
import sys

import grpc
import pytest
import torch
from tokenizers import Tokenizer

from clients import OrtserveClient
from clients.errors import OrtserveError
from testing.launch import ROOT
from tests.server_process import ServerProcess

transformers = pytest.importorskip("transformers")
logging.getLogger("transformers").setLevel(logging.ERROR)

POSITIONS, CAP, SERVE_CAP, SLOTS = 256, 64, 32, 3
LAYERS, HEADS, KV_HEADS, HIDDEN = 2, 4, 2, 64
PROMPT = "ROMEO. What light through yonder window breaks"


def _export(ckpt, repo, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "export", str(ckpt), "--task", "generate", "--repository", str(repo),
                           "--name", "qwen", *flags], cwd=ROOT, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def capped(tiny_checkpoints, tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("context-cap")
    tok = Tokenizer.from_file(str(tiny_checkpoints.gpt / "tokenizer.json"))
    eot = tok.token_to_id("<|endoftext|>")
    cfg = transformers.Qwen2Config(vocab_size=tok.get_vocab_size(), hidden_size=HIDDEN, num_hidden_layers=LAYERS,
                                   num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, intermediate_size=96,
                                   max_position_embeddings=POSITIONS, initializer_range=0.2, bos_token_id=eot,
                                   eos_token_id=eot, tie_word_embeddings=True)
    cfg._attn_implementation = "eager"
    torch.manual_seed(11)
    hf = transformers.Qwen2ForCausalLM(cfg).eval()
    ckpt = root / "ckpt"
    hf.save_pretrained(ckpt)
    for f in tiny_checkpoints.gpt.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens")):
            (ckpt / f.name).write_bytes(f.read_bytes())
    proc = _export(ckpt, root / "repo", "--max-length", str(CAP))
    assert proc.returncode == 0, proc.stderr
    return root, ckpt, hf, tok


def _slot_bytes(length: int) -> int:
    """One slot's fp32 self cache: layers x (key, value) x kv_heads x positions x head_dim x 4 bytes."""
    return LAYERS * 2 * KV_HEADS * length * (HIDDEN // HEADS) * 4


def _slots(manifest: dict) -> int:
    """Cache slots the server allocates: --max-sequences, and one scratch slot with a mixed graph."""
    return SLOTS + (1 if manifest["cache"].get("mixed_graphs", {}).get("fp32") else 0)


def test_export_past_the_positions_is_refused_by_name(capped) -> None:
    root, ckpt, _, _ = capped
    proc = _export(ckpt, root / "refused", "--max-length", str(POSITIONS + 1))
    assert proc.returncode == 2
    assert "--max-length" in proc.stderr and "max_position_embeddings" in proc.stderr, proc.stderr
    assert not (root / "refused" / "qwen").exists()
    proc = _export(ckpt, root / "refused", "--max-length", "8")     # no room for the gate's sequences
    assert proc.returncode == 2 and proc.stderr.startswith("error: --max-length: 8 tokens"), proc.stderr


def test_package_context_is_the_cap(capped) -> None:
    root, _, _, _ = capped
    manifest = json.loads((root / "repo" / "qwen" / "1" / "model.json").read_text())
    assert manifest["max_length"] == CAP
    parity = json.loads((root / "repo" / "qwen" / "1" / "parity.json").read_text())
    assert parity["variants"]["fp32"]["passed"] is True


def test_served_within_the_cap(capped) -> None:
    root, _, hf, tok = capped
    manifest = json.loads((root / "repo" / "qwen" / "1" / "model.json").read_text())
    ids = tok.encode(PROMPT).ids
    new = CAP - len(ids)       # fills the context exactly
    with torch.no_grad():
        want = hf.generate(torch.tensor([ids]), max_new_tokens=new, min_new_tokens=new, do_sample=False,
                           pad_token_id=hf.config.eos_token_id)[0, len(ids):].tolist()
    with ServerProcess(root / "repo", ["--max-sequences", str(SLOTS)]) as server, \
            OrtserveClient(server.address, timeout=60) as client:
        info = client.model_info("qwen")
        assert info.max_length == CAP
        assert info.cache_bytes_per_slot == _slot_bytes(CAP)
        assert info.cache_bytes == _slot_bytes(CAP) * _slots(manifest)
        got = client.generate(ids, "qwen", max_new_tokens=new, ignore_eos=True)
        assert [t.token_id for t in got.tokens] == want
        with pytest.raises(OrtserveError) as err:       # one token more than the context holds
            client.generate(ids, "qwen", max_new_tokens=new + 1, ignore_eos=True)
        assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert err.value.message.startswith("prompt:") and f"context of {CAP} tokens" in err.value.message
        assert any("bytes per slot" in line for line in server.lines)


def test_serve_time_cap_below_the_package(capped) -> None:
    root, _, hf, tok = capped
    manifest = json.loads((root / "repo" / "qwen" / "1" / "model.json").read_text())
    ids = tok.encode(PROMPT).ids
    new = SERVE_CAP - len(ids)
    with torch.no_grad():
        want = hf.generate(torch.tensor([ids]), max_new_tokens=new, min_new_tokens=new, do_sample=False,
                           pad_token_id=hf.config.eos_token_id)[0, len(ids):].tolist()
    with ServerProcess(root / "repo", ["--max-sequences", str(SLOTS), "--max-model-len", str(SERVE_CAP)]) as server, \
            OrtserveClient(server.address, timeout=60) as client:
        info = client.model_info("qwen")
        assert info.max_length == SERVE_CAP
        assert client.tokenize(PROMPT, "qwen").max_length == SERVE_CAP
        assert (info.cache_bytes_per_slot, info.cache_bytes) == (_slot_bytes(SERVE_CAP),
                                                                 _slot_bytes(SERVE_CAP) * _slots(manifest))
        assert [t.token_id for t in client.generate(ids, "qwen", max_new_tokens=new, ignore_eos=True).tokens] == want
        with pytest.raises(OrtserveError) as err:
            client.generate(ids, "qwen", max_new_tokens=new + 1, ignore_eos=True)
        assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert f"context of {SERVE_CAP} tokens" in err.value.message


def test_serve_time_cap_above_the_package_is_refused(capped) -> None:
    root, _, _, _ = capped
    with ServerProcess(root / "repo", ["--max-model-len", str(CAP + 1)]) as server, \
            OrtserveClient(server.address, timeout=60) as client:
        status = client.model_info("qwen").status
        assert status.state == "NOT_SERVING"
        assert "--max-model-len" in status.reason and f"context of {CAP} tokens" in status.reason, status.reason
