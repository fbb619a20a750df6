"""The kv8 variant (an int8 KV cache) end to end: `python -m export --variants fp32,kv8` gates it by teacher-forced
decoding against PyTorch, refuses a perturbed one, and a real server started with `--variant kv8` streams the ids
that the graph gives for each prompt alone (driven by the export stage's slot driver, no server code), with
sequences joining and leaving and long prompts prefilled in chunks."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as triton
from tokenizers import Tokenizer

from clients import OrtserveClient
from export.parity_inplace import SlotDriver
from testing.launch import ROOT
from tests.server_process import ServerProcess, staggered_streams

KV8, PLAIN = "gpt-kv8", "gpt-plain"
PROMPTS = ["ROMEO.", "Once more unto the breach, dear friends, once more; or close the wall up",
           "a", "to be or not to be, that is the question: whether tis nobler in the mind to suffer", "My lord"]
NEW_TOKENS = [12, 6, 20, 9, 4]


@pytest.fixture(scope="module")
def repository(tiny_checkpoints, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from export import ExportConfig, export_checkpoint

    repo = tmp_path_factory.mktemp("kv8-repo")
    export_checkpoint(ExportConfig(checkpoint=tiny_checkpoints.gpt, task="generate", repository=repo, name=KV8,
                                   variants=("fp32", "kv8")))
    export_checkpoint(ExportConfig(checkpoint=tiny_checkpoints.gpt, task="generate", repository=repo, name=PLAIN))
    return repo


def _lone_greedy(pkg: Path, ids: list[int], n: int) -> list[int]:
    """One sequence through model.kv8.onnx with its own int8 buffers: prompt at once, then one token per step."""
    m = json.loads((pkg / "model.json").read_text())
    cache = m["cache"]
    sess = ort.InferenceSession(str(pkg / m["variants"]["kv8"]), providers=["CPUExecutionProvider"])
    d = SlotDriver(sess, cache["num_layers"], cache.get("num_kv_heads") or cache["num_heads"], cache["head_dim"],
                   m["max_length"], 1)
    assert all(b.dtype == np.int8 for b in d.bufs.values())
    token = int(d.first_prompt(0, [ids], 0)[0, len(ids) - 1].argmax())
    out = [token]
    for step in range(n - 1):
        token = int(d.decode([token], [len(ids) + step])[0].argmax())
        out.append(token)
    return out


def test_kv8_is_gated_by_teacher_forced_decoding(repository: Path) -> None:
    pkg = repository / KV8 / "1"
    manifest = json.loads((pkg / "model.json").read_text())
    assert manifest["variants"] == {"fp32": "model.onnx", "kv8": "model.kv8.onnx"}
    assert manifest["cache"]["mixed_graphs"] == {"fp32": "model.mixed.onnx", "kv8": "model.kv8.mixed.onnx"}
    assert manifest["cache"]["mixed_graph"] == "model.mixed.onnx"      # what servers before mixed_graphs read
    assert manifest["default_variant"]["cpu"] == "fp32"     # exact by default; the int8 cache is asked for
    graph = {i.name: i.type for i in ort.InferenceSession(str(pkg / "model.kv8.onnx")).get_inputs()}
    assert graph["past_key_values.0.key"] == "tensor(int8)" and graph["input_ids"] == "tensor(int64)"
    kv8 = json.loads((pkg / "parity.json").read_text())["variants"]["kv8"]
    checks = {c["name"]: c for c in kv8["checks"]}
    assert kv8["passed"] is True
    kl = checks["mean KL divergence (PyTorch || kv8), nats"]
    assert 0 < kl["value"] <= kl["threshold"] == 0.01 and kl["upper"] is True and "int8 cache" in kl["detail"]
    ratio = checks["perplexity ratio (kv8 / PyTorch)"]
    assert 0.9 < ratio["value"] <= ratio["threshold"] == 1.02 and ratio["upper"] is True
    # The mixed twin (decode rows + a prompt chunk in one run) gives what the plain kv8 graph gives alone.
    mixed = checks["mixed graph: decode rows and a prompt chunk in one run"]
    assert mixed["passed"] and "plain kv8 graph" in mixed["detail"] and mixed["max_abs_diff"] <= 1e-4
    # Quantization changed the logits (a gate that compared the fp32 graph with itself would show 0 here).
    assert kv8["max_abs_diff"]["logits"] > 0


def test_a_perturbed_kv8_graph_is_refused(tiny_checkpoints, tmp_path: Path) -> None:
    env = {**os.environ, "ORTSERVE_EXPORT_PERTURB": "kv8"}
    proc = subprocess.run([sys.executable, "-m", "export", str(tiny_checkpoints.gpt), "--task", "generate",
                           "--repository", str(tmp_path / "repo"), "--name", "bad", "--variants", "fp32,kv8"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode != 0
    assert "parity gate failed" in proc.stderr
    kl_row = next(line for line in proc.stderr.splitlines() if line.startswith("kv8") and "KL" in line)
    assert kl_row.endswith("FAIL") and "<= 0.0100" in kl_row
    assert not (tmp_path / "repo" / "bad" / "1").exists()


@pytest.mark.parametrize("args, field", [
    (["--task", "classify", "--variants", "fp32,kv8"], "kv8"),
    (["--task", "generate", "--variants", "fp32,int8"], "fp32, kv8, fp16, w8, w4, w8kv8, w4kv8 only"),
])
def test_kv8_elsewhere_is_refused_in_one_line(tiny_checkpoints, tmp_path: Path, args: list[str], field: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "export", str(tiny_checkpoints.gpt), "--repository",
                           str(tmp_path / "repo"), "--name", "x", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "--variants" in lines[0] and field in lines[0] and "Traceback" not in proc.stderr


def test_server_streams_what_the_int8_cache_gives_each_prompt_alone(repository: Path) -> None:
    tok = Tokenizer.from_file(str(repository / KV8 / "1" / "tokenizer.json"))
    with ServerProcess(repository, ["--variant", "kv8", "--max-sequences", "2", "--prefill-chunk-tokens", "4"]) as server:
        with OrtserveClient(server.address, timeout=60) as client:
            assert client.model_info(KV8).variant == "kv8"
            assert client.model_info(PLAIN).variant == "fp32"    # a package without kv8 keeps its default
        served = staggered_streams(server.address, KV8, PROMPTS, NEW_TOKENS)   # 2 slots for 5 requests
        declared = _declared_types(server.address)
        loaded = [line for line in server.lines if f"generation {KV8}:" in line]
    assert loaded and "of int8" in loaded[0] and "mixed graph (decode rows" in loaded[0], loaded
    # The metadata describes the graph served, not model.json's fp32 one.
    assert declared["past_key_values.0.key"] == declared["present.1.value"] == "INT8"
    assert declared["logits"] == "FP32" and declared["input_ids"] == "INT64"
    for i, prompt in enumerate(PROMPTS):
        assert served[i] == _lone_greedy(repository / KV8 / "1", tok.encode(prompt).ids, NEW_TOKENS[i]), \
            f"prompt {i}: the served int8-cache ids differ from the graph's own greedy run"


def _declared_types(address: str) -> dict[str, str]:
    """KServe model metadata of the kv8-served decoder (tritonclient): element type per tensor name."""
    client = triton.InferenceServerClient(address)
    try:
        meta = client.get_model_metadata(KV8)
    finally:
        client.close()
    return {t.name: t.datatype for t in [*meta.inputs, *meta.outputs]}
