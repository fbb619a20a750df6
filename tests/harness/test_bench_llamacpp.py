"""bench/llamacpp.py's Qwen3-0.6B material: Qwen's vocabulary rebuilt from tiktoken ranks (bench/qwen3_material.py),
a variant published outside the gate in a scratch repository and served by a real server
(bench/llamacpp_material.py), and the rss piece's arithmetic and measurement (bench/llamacpp_rss.py)."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

from protos import ortserve_pb2 as pb
from protos import ortserve_pb2_grpc as rpc
from tests.conftest import one_torch_thread
from tests.server_process import ServerProcess

TEXTS = ("To be, or not to be, that is the question:", "I've been told he's there; you'll see. 1234567 3.14",
         "  Whether 'tis nobler\tin the mind\n\nThe slings", "Café naïve — “quoted” ¿qué? 我想 😀 ‼️......!!!???")


def test_ranks_of_a_trained_bpe_rebuild_it_id_for_id() -> None:
    """A byte-level BPE trained by `tokenizers` (Qwen2's split), written out as tiktoken ranks (bytes -> id, no merges),
    comes back as a tokenizer that encodes every text to the trained one's ids: the merges recovered from the ranks
    are the trained ones."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    from bench.qwen3_material import SPECIALS, SPLIT, _byte_chars, build_tokenizer

    chars = _byte_chars()
    assert (chars[32], chars[10], chars[ord("A")]) == ("Ġ", "Ċ", "A")   # GPT-2's published byte map
    trained = Tokenizer(models.BPE())
    trained.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    trained.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=700, min_frequency=1, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    corpus = [" ".join(TEXTS) * 3, "the quick brown fox jumps over the lazy dog; " * 40, "数字 1234 and 5678\n" * 20]
    trained.train_from_iterator(corpus, trainer)
    byte_of = {c: b for b, c in chars.items()}
    ranks = {bytes(byte_of[c] for c in text): i for text, i in trained.get_vocab().items()}
    assert len(ranks) == trained.get_vocab_size() > 300
    rebuilt = build_tokenizer(ranks)
    for text in (*TEXTS, "the lazy fox, 12345678 数字\n\n  end"):
        assert rebuilt.encode(text).ids == trained.encode(text).ids, text
        assert rebuilt.decode(rebuilt.encode(text).ids) == text
    assert [rebuilt.token_to_id(s) for s in SPECIALS] == [len(ranks), len(ranks) + 1, len(ranks) + 2]


def test_cache_bytes_of_qwen3_0_6b() -> None:
    """Qwen3-0.6B's cache: 28 layers x (key + value) x 8 kv heads x 128 = 57,344 elements a token a slot."""
    from bench.llamacpp_rss import cache_bytes_per_token

    manifest = {"cache": {"num_layers": 28, "num_heads": 16, "num_kv_heads": 8, "head_dim": 128}}
    assert cache_bytes_per_token(manifest, "w4") == 229_376
    assert cache_bytes_per_token(manifest, "w4kv8") == 57_344
    # 16 slots at the package's 4,096 cap, and at the model's 40,960 positions
    assert cache_bytes_per_token(manifest, "w4") * 4096 * 16 == 15_032_385_536
    assert cache_bytes_per_token(manifest, "fp32") * 40960 * 16 == 150_323_855_360


def test_tree_rss_counts_a_child_that_touches_its_memory() -> None:
    from bench.llamacpp_rss import tree_rss

    code = ("import subprocess, sys, time; c = subprocess.Popen([sys.executable, '-c', "
            "'import time; b = bytearray(300 * 2**20); time.sleep(60)']); time.sleep(60)")
    parent = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.monotonic() + 30
        while tree_rss(parent.pid) < 300 * 2**20 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert 300 * 2**20 <= tree_rss(parent.pid) < 600 * 2**20
    finally:
        parent.kill()
        parent.wait()


@pytest.fixture(scope="module")
def fp32_only(tiny_checkpoints, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A tiny random Qwen3 exported with fp32 alone (as the gate leaves a package whose w4 it refused)."""
    import torch
    from tokenizers import Tokenizer
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from export import ExportConfig, export_checkpoint

    root = tmp_path_factory.mktemp("ungated")
    tok = Tokenizer.from_file(str(tiny_checkpoints.gpt / "tokenizer.json"))
    with one_torch_thread():
        torch.manual_seed(0)
        model = Qwen3ForCausalLM(Qwen3Config(vocab_size=tok.get_vocab_size(), hidden_size=64, intermediate_size=96,
                                             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                             head_dim=16, max_position_embeddings=256, tie_word_embeddings=True))
        ckpt = root / "qwen3-tiny"
        model.save_pretrained(ckpt)
        for f in tiny_checkpoints.gpt.iterdir():
            if f.name.startswith(("tokenizer", "special")):
                (ckpt / f.name).write_bytes(f.read_bytes())
        r = export_checkpoint(ExportConfig(checkpoint=ckpt, task="generate", repository=root / "repo", name="q",
                                           version=1, max_length=128))
    return ckpt, r.package_dir


def test_an_ungated_variant_is_stated_and_served(fp32_only: tuple[Path, Path]) -> None:
    """publish_ungated adds w4 to the scratch package (graph, mixed twin, files re-hashed) with the statement in its
    parity entry; a real server then serves it when asked by name (its ModelInfo names w4)."""
    from bench.llamacpp_material import UNGATED_NOT_RUN, publish_ungated, ungated_reason

    ckpt, pkg = fp32_only
    assert ungated_reason(pkg, "w4") is None
    with one_torch_thread():
        publish_ungated(pkg, ckpt, "w4")
    manifest = json.loads((pkg / "model.json").read_text())
    parity = json.loads((pkg / "parity.json").read_text())
    assert manifest["variants"]["w4"] == "model.w4.onnx" and (pkg / "model.w4.onnx").is_file()
    assert manifest["cache"]["mixed_graphs"]["w4"] in parity["files"] and "model.w4.onnx" in parity["files"]
    assert manifest["quantization"]["w4"]["bits"] == 4
    assert ungated_reason(pkg, "w4") == UNGATED_NOT_RUN and parity["variants"]["w4"]["gate_status"] == "not run"
    srv = ServerProcess(pkg.parent.parent, ["--variant", "w4", "--max-sequences", "2"])
    try:
        with grpc.insecure_channel(srv.address) as channel:
            stub = rpc.TaskServiceStub(channel)
            info = stub.ModelInfo(pb.ModelInfoRequest(model="q"), timeout=30)
            res = stub.Generate(pb.GenerateRequest(model="q", prompt_ids=[5, 6, 7, 8],
                                                   parameters=pb.GenerationParameters(max_new_tokens=4)), timeout=60)
    finally:
        srv.stop()
    assert info.variant == "w4" and len(res.tokens) == 4
