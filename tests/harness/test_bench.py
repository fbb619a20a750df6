"""The benchmark suite's own parts: FLOP counting, statistics, profile parsing, the load generator, the
decoder drivers on a real exported graph, goal evaluation and the report CLI."""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from tests.server_process import ROOT



def test_flop_count_matches_torch_flop_counter() -> None:
    """The analytic matmul count equals what torch's own FlopCounterMode sees in a real forward."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from bench.flops import bert_classifier_flops
    from training.bert import BertConfig, BertForSequenceClassification

    cfg = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=48, max_position_embeddings=64, num_labels=3)
    model = BertForSequenceClassification(cfg).eval()
    ids = torch.randint(0, 100, (3, 20))
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        model(ids, torch.ones_like(ids), torch.zeros_like(ids))
    assert bert_classifier_flops(2, 32, 48, 3, batch=3, seq=20) == counter.get_total_flops()


def test_flop_count_by_hand() -> None:
    from bench.flops import bert_classifier_flops

    # 1 layer, hidden 2, FFN 4, 1 label, batch 1, seq 1: QKVO 4·2·1·2·2 = 32, FFN 2·2·1·2·4 = 32,
    # attention 2·2·1·1·1·2 = 8, pooler 2·1·2·2 = 8, head 2·1·2·1 = 4.
    assert bert_classifier_flops(1, 2, 4, 1, batch=1, seq=1) == 84


def test_summary_inverse_and_ratio() -> None:
    from bench.stats import Summary, percentile, ratio

    s = Summary.of([3.0, 1.0, 2.0])
    assert (s.median, s.min, s.max, s.n) == (2.0, 1.0, 3.0, 3)
    per_s = s.inverse(6.0)  # seconds per call -> calls per 6 s: min and max swap
    assert (per_s.median, per_s.min, per_s.max) == (3.0, 2.0, 6.0)
    r = ratio(Summary.of([4.0, 8.0, 6.0]), Summary.of([2.0, 1.0, 4.0]))
    assert r == {"median": 3.0, "min": 1.0, "max": 8.0}
    assert percentile([1, 2, 3, 4, 5], 50) == 3
    assert percentile([0, 10], 95) == pytest.approx(9.5)
    with pytest.raises(ValueError, match="samples"):
        Summary.of([])


def _matmul_add_graph(path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Softmax", ["y"], ["z"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 64])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, ["n", 64])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    onnx.save(model, str(path))


def test_profile_breakdown_from_real_onnxruntime(tmp_path: Path) -> None:
    from bench.ortprofile import profile_runs

    _matmul_add_graph(tmp_path / "g.onnx")
    x = np.ones((256, 64), np.float32)
    prof = profile_runs(tmp_path / "g.onnx", 1, {"x": x}, runs=4, work=tmp_path / "prof")
    assert prof["runs"] == 3  # the first (warm-up) run is left out
    ops = {o["op"] for o in prof["top_ops"]}
    assert ops == {"MatMul", "Softmax"}
    assert sum(o["share"] for o in prof["top_ops"]) == pytest.approx(1.0)
    assert not list((tmp_path / "prof").glob("*.json"))  # profile file removed


def test_closed_loop_counts_every_item_under_concurrency() -> None:
    from bench.server import closed_loop

    async def call(client: int, i: int) -> int:
        await asyncio.sleep(0)  # yield: concurrent clients interleave here
        return client + 1

    res = asyncio.run(closed_loop(call, concurrency=16, per_client=5))
    assert res.items == 5 * sum(range(1, 17))
    assert len(res.latencies) == 80


def test_closed_loop_plans_say_which_requests_each_client_sends() -> None:
    """testing/closedloop.py: per-client counts, interleaved shares, a shared budget, a time bound."""
    from testing.closedloop import counting, drive, interleaved, per_client, shared

    run = drive(lambda c, i, first: (c, i), 3, per_client(4))
    assert sorted(r.output for r in run.records) == [(c, i) for c in range(3) for i in range(4)]
    run = drive(lambda c, i, first: i, 3, interleaved(10, 3))
    assert sorted((r.client, r.index) for r in run.records) == sorted((i % 3, i) for i in range(10))
    run = drive(lambda c, i, first: i, 4, shared(25))
    assert sorted(r.index for r in run.records) == list(range(25))
    run = drive(lambda c, i, first: time.sleep(0.01), 2, counting(lambda c: 100 * c), seconds=0.2)
    assert 4 <= len(run.records) < 60 and run.wall < 2
    assert {r.index for r in run.records if r.client == 1} >= {100, 101}
    for r in run.records:
        assert r.ttft == pytest.approx(r.latency)       # no first token marked: time to the whole answer


def test_closed_loop_errors_are_raised_or_recorded_and_first_tokens_marked() -> None:
    from testing.closedloop import drive, drive_async, per_client

    def flaky(c: int, i: int, first) -> int:
        first()
        if i == 1:
            raise RuntimeError("boom")
        return i

    with pytest.raises(RuntimeError, match="boom"):
        drive(flaky, 2, per_client(3))
    run = drive(flaky, 2, per_client(3), errors="record")
    assert sum(r.error is not None for r in run.records) == 2 and len(run.latencies()) == 4
    assert all(r.first is not None and r.sent <= r.first <= r.done for r in run.records)

    async def call(c: int, i: int, first) -> int:
        await asyncio.sleep(0)
        return flaky(c, i, first)

    with pytest.raises(RuntimeError, match="boom"):
        asyncio.run(drive_async(call, 3, per_client(2)))
    run = asyncio.run(drive_async(call, 3, per_client(2), errors="record"))
    assert len(run.ok()) == 3 and run.span() <= run.wall + 1e-9
    with pytest.raises(ValueError, match="clients"):
        drive(flaky, 0, per_client(1))


def test_encode_gives_exact_shapes(tiny_repository: Path) -> None:
    from bench.encoder import encode

    tok = tiny_repository / "tiny-classifier" / "1" / "tokenizer.json"
    feeds = encode(tok, ["a short one", "the castle and the king " * 40], 16)
    assert feeds["input_ids"].shape == (2, 16) and feeds["input_ids"].dtype == np.int64
    assert feeds["attention_mask"][0].sum() < 16 and feeds["attention_mask"][1].sum() == 16


def test_ort_decoder_cached_and_uncached_match_torch(tiny_checkpoints, tiny_repository: Path) -> None:
    """The benchmark's numpy decode loops reproduce the torch reference greedy output."""
    import torch

    from bench.decoder import OrtDecoder
    from training.checkpoint import load_model
    from training.gpt import generate_greedy

    pkg = tiny_repository / "tiny-gpt" / "1"
    manifest = json.loads((pkg / "model.json").read_text())
    dec = OrtDecoder(pkg / manifest["variants"]["fp32"], manifest["cache"], threads=1)
    prompt = np.array([[5, 17, 42, 9]], np.int64)
    model, _ = load_model(tiny_checkpoints.gpt, kind="gpt")
    ref = generate_greedy(model, torch.from_numpy(prompt), None, 12)[0].tolist()
    assert dec.generate_cached(prompt, 12) == ref
    assert dec.generate_uncached(prompt, 12) == ref


def _result_files(out: Path) -> None:
    """Minimal decoder + server result documents in the suite's format."""
    meta = {"command": "python -m bench --only decoder,server", "quick": True, "started_at": "2026-11-22T00:00:00+00:00",
            "duration_s": 1.0, "machine": {"nproc": 2, "cpu_model": "test cpu", "platform": "linux",
                                           "versions": {"numpy": "2"}, "git_commit": "abc", "loadavg_at_start": [0.1]}}

    def s(m: float) -> dict:
        return {"median": m, "min": m * 0.9, "max": m * 1.1, "n": 3}

    rows = [{"past": p, "ort_cached": s(t), "torch_cached": s(2 * t), "ort_uncached": s(5 * t)}
            for p, t in ((16, 1.0), (512, 2.0))]
    decoder = {"piece": "decoder", "status": "ok", "meta": meta, "new_tokens": 256, "prompt_tokens": 16,
               "checkpoint": {"name": "lm", "origin": "random", "trained": False, "path": "x"},
               "shape": {"n_layer": 2, "n_embd": 64, "n_head": 2, "n_positions": 1024, "vocab_size": 400},
               "notes": [], "hf_attention": "sdpa",
               "tokens_per_s": {"torch_cached": s(100), "hf_generate": s(80), "ort_cached": s(400), "ort_uncached": s(50)},
               "ratios": {"ort_cached_vs_uncached": {"median": 8.0, "min": 7.0, "max": 9.0},
                          "ort_cached_vs_hf_generate": {"median": 5.0, "min": 4.0, "max": 6.0},
                          "ort_step_past_last_vs_first": {"median": 2.0, "min": 1.6, "max": 2.4}},
               "greedy_agreement_vs_ort_cached": {"hf_generate": {"identical": True, "first_difference": None}},
               "step_time": {"unit": "ms", "rows": rows}, "ort_profiles": {}}
    load = {"throughput_per_s": s(100.0), "latency_ms": {"p50": 3.0, "p95": 5.0}, "requests": 10}
    server = {"piece": "server", "status": "ok", "meta": meta, "batch_size": 1, "stream_new_tokens": 16,
              "load": "grpc.aio", "models": {"classifier": {"origin": "random", "notes": []}},
              "classify": {"16": {"in_process": load, "grpc": load,
                                  "grpc_vs_in_process_throughput": {"median": 0.8, "min": 0.7, "max": 0.9}}},
              "batch1_latency": {"requests": 10, "p50_ms": {"in_process": 2.0, "grpc": 2.5},
                                 "p95_ms": {"in_process": 3.0, "grpc": 3.5}, "grpc_overhead_p50_ms": 0.5},
              "generation": {n: {w: {"tokens_per_s": s(t), "ttft_ms": s(5.0), "tokens": [16]}
                                 for w in ("in_process", "grpc")} for n, t in (("1", 100.0), ("8", 500.0))},
              "generation_scaling_last_vs_first": {"in_process": {"median": 5.0, "min": 4.5, "max": 5.5},
                                                   "grpc": {"median": 3.0, "min": 2.5, "max": 3.5}}}
    out.mkdir(parents=True, exist_ok=True)
    (out / "decoder.json").write_text(json.dumps(decoder))
    (out / "server.json").write_text(json.dumps(server))


def test_generation_report_lists_only_the_runs_whose_figures_it_shows() -> None:
    from bench.generation_report import current_runs

    runs = [{"command": "all", "pieces": ["step", "streams", "genai"]}, {"command": "streams", "pieces": ["streams"]},
            {"command": "step", "pieces": ["step"]}, {"command": "step again", "pieces": ["step"]}]
    assert [r["command"] for r in current_runs(runs)] == ["all", "streams", "step again"]   # "all" keeps genai


def test_goals_met_and_missed_with_margin(tmp_path: Path) -> None:
    from bench.goals import evaluate
    from bench.results import load_results

    _result_files(tmp_path)
    checks = {c.goal: c for c in evaluate(load_results(tmp_path))}
    assert checks["ORT cached ≥ 5× uncached (256 new tokens)"].met is True
    step = checks["ORT step time at past 512 ≤ 1.5× past 16"]
    assert step.met is False and step.miss == "33% over (2 vs 1.5)"
    grpc = checks["gRPC Classify throughput ≥ 85% of in-process at concurrency 16"]
    assert grpc.met is False and grpc.miss == "6% short (0.8 vs 0.85)"
    assert checks["batch-1 p50 gRPC overhead over in-process ≤ 1 ms"].met is True
    assert checks["8 streams ≥ 4× the aggregate tokens/s of 1 (grpc)"].met is False
    assert checks["8 streams ≥ 4× the aggregate tokens/s of 1 (in-process)"].met is True


def test_report_cli_regenerates_markdown_and_plots(tmp_path: Path) -> None:
    out = tmp_path / "results"
    _result_files(out)
    docs, plots = tmp_path / "docs" / "BENCHMARKS.md", tmp_path / "docs" / "bench"
    proc = subprocess.run([sys.executable, "-m", "bench", "report", "--out", str(out), "--docs", str(docs),
                           "--plots", str(plots)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    text = docs.read_text()
    assert "`nproc` = 2, CPU: test cpu" in text
    assert "| ORT step time at past 512 ≤ 1.5× past 16 | lm | 2 [1.6–2.4] × | **missed** | 33% over (2 vs 1.5) |" in text
    assert "![decoder step time vs past length](bench/decoder_step_time.png)" in text
    for name in ("decoder_step_time.png", "decoder_tokens_per_s.png", "server.png"):
        assert (plots / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    goals = json.loads((out / "goals.json").read_text())
    assert {g["goal"] for g in goals} >= {"ORT generation ≥ 2× HF generate"}
    assert not [p for p in docs.parent.rglob("*.tmp")]  # atomic writes leave no temp files


@pytest.mark.parametrize("args, field", [(["suite", "--only", "encoder,gpu"], "--only"),
                                         (["report", "--out", "/nonexistent-dir-xyz"], "--out")])
def test_cli_bad_input_is_one_line_exit_2(args: list[str], field: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "bench", *args], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and field in lines[0] and "Traceback" not in proc.stderr


def test_in_process_and_grpc_paths_serve_the_same_models(tiny_repository: Path, tmp_path: Path) -> None:
    """The two configurations the server benchmark compares: a real server process over gRPC and the data
    plane in-process, on the same repository, give the same number of results and tokens."""
    import shutil

    from bench.server import InProcess, OverGrpc, closed_loop
    from testing.launch import ServerProcess

    repo = tmp_path / "repo"
    shutil.copytree(tiny_repository, repo)
    names = {"classifier": "tiny-classifier", "lm": "tiny-gpt"}

    async def exercise(address: str) -> dict[str, list[int]]:
        ways = {"in_process": InProcess(repo, 1, **names), "grpc": OverGrpc(address, **names)}
        out: dict[str, list[int]] = {}
        for k, way in ways.items():
            await way.start()
            try:
                load = await closed_loop(lambda c, i, w=way: w.classify(["the king's castle", "a rose"]), 4, 3)
                tokens = [n async for n in way.stream("The ship", 5)]
                out[k] = [load.items, sum(tokens)]
            finally:
                await way.close()
        return out

    with ServerProcess(repo, ["--intra-op-threads", "1"]) as server:
        got = asyncio.run(exercise(server.address))
    assert got == {"in_process": [24, 5], "grpc": [24, 5]}


def test_gate_refusal_is_read_from_the_real_report_and_variant_built_outside(
        tiny_checkpoints, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real ParityFailure (the export stage's perturbation hook breaks the optimized graph) names the
    refused variant; a variant missing from a package is then built outside the gate for timing only."""
    from bench.material import Checkpoint, _build_outside_gate, _gate_detail, _refused_variants, export_package
    from export import ExportConfig, ParityFailure, export_checkpoint

    monkeypatch.setenv("ORTSERVE_EXPORT_PERTURB", "optimized")
    with pytest.raises(ParityFailure) as failure:
        export_checkpoint(ExportConfig(checkpoint=tiny_checkpoints.classifier, task="classify",
                                       repository=tmp_path / "refused", name="tiny", variants=("fp32", "optimized")))
    assert _refused_variants(failure.value, ("fp32", "optimized")) == {"optimized"}
    assert _gate_detail(failure.value).startswith(" (optimized: ")
    monkeypatch.delenv("ORTSERVE_EXPORT_PERTURB")

    pkg = export_package(Checkpoint("tiny", tiny_checkpoints.classifier, "test", True), "classify",
                         tmp_path / "repo", ("fp32",), threads=1)
    _build_outside_gate(pkg, "int8")
    assert "int8" not in json.loads((pkg.path / "model.json").read_text())["variants"]  # never published
    assert pkg.notes == ["int8: built with export.variants outside the parity gate (not publishable)"]
    built = pkg.variant_file("int8")
    assert built is not None and built.is_file() and not built.resolve().is_relative_to(pkg.path.resolve())


def test_marked_blocks_are_replaced_alone_and_kept_by_the_report(tmp_path: Path) -> None:
    from bench.results import existing_blocks, write_block

    doc = tmp_path / "BENCHMARKS.md"
    doc.write_text("# Benchmarks\n\nwritten by the report\n")
    write_block(doc, "generation:gpt2", ["## gen", "old"])
    write_block(doc, "http", ["## http", "figures"])
    write_block(doc, "generation:gpt2", ["## gen", "new"])
    text = doc.read_text()
    assert text.count("<!-- generation:gpt2:begin -->") == 1 and "old" not in text and "new" in text
    assert text.index("## gen") < text.index("## http") and text.startswith("# Benchmarks\n\nwritten by the report")
    assert existing_blocks(doc) == ("<!-- generation:gpt2:begin -->\n## gen\nnew\n<!-- generation:gpt2:end -->\n\n"
                                    "<!-- http:begin -->\n## http\nfigures\n<!-- http:end -->")


def test_graph_ceiling_runs_the_real_graph_in_every_configuration(tiny_repository: Path) -> None:
    """The peer piece's ceiling: every configuration and batch measured on the real file, the best is their max."""
    from bench.encoder import encode
    from bench.peer import graph_ceiling

    pkg = tiny_repository / "tiny-classifier" / "1"
    feeds = {b: encode(pkg / "tokenizer.json", ["the king and the castle"] * b, 16) for b in (1, 4)}
    ceiling = graph_ceiling(pkg / "model.onnx", feeds, threads=2, seconds=0.2)
    table = ceiling["rows_per_s"]
    assert set(table) == {"1 session x 2 threads, spinning", "2 sessions x 1 thread, side by side"}
    assert all(set(by_batch) == {"1", "4"} and min(by_batch.values()) > 0 for by_batch in table.values())
    assert ceiling["best_rows_per_s"] == max(v for by_batch in table.values() for v in by_batch.values())


def test_peer_throughput_evidence_states_the_cpu_budget() -> None:
    """At 1.5× MLServer's 160 req/s on 2 cores a request may cost 2000 / 240 = 8.33 ms of CPU; a 250 rows/s graph
    takes 8.00 of it and a 0.20 ms client, leaving 0.13 ms (numbers worked by hand)."""
    from bench.goals import peer_checks

    def side(rate: float, p50: float, cpu: dict[str, float]) -> dict:
        return {"requests_per_s": {"median": rate, "min": rate, "max": rate},
                "rows_per_s": {"median": rate, "min": rate, "max": rate}, "p50_ms": p50, "cpu_ms_per_request": cpu}

    cell = {"clients": 8, "batch": 1, "ortserve": side(200.0, 30.0, {"client": 0.2, "server": 9.0,
                                                                      "server_main_thread": 0.6}),
            "mlserver": side(160.0, 40.0, {"client": 0.3, "server": 11.0}),
            "throughput_ratio_ortserve_vs_mlserver": {"median": 1.25, "low": 1.25, "high": 1.25}}
    res = {"threads": 2, "cells": [cell], "graph_ceiling": {"runs": [{}, {}], "best_rows_per_s": 250.0}}
    (check,) = list(peer_checks(res))
    assert check.met is False
    assert "at most 1.56× MLServer's 160 rows/s" in check.evidence
    assert "1.5× is 8.33 ms of CPU per request on 2 cores, of which the graph takes at least 8.00" in check.evidence
    assert "leaving 0.13 ms" in check.evidence and "event loop alone took 0.60 ms" in check.evidence


# ----------------------------------------------------------------------------- peers: vLLM, llama.cpp, the sides

# vLLM 0.32's binding report (vllm/utils/ompmultiprocessing.py logs "OpenMP thread binding info:" then one line per
# rank), as its log showed it with VLLM_CPU_OMP_THREADS_BIND=0-1 on this machine.
VLLM_BIND_LINE = "\tlocal_rank=0, core ids=[0, 1]"
# `llama-bench -m ...-q4_0.gguf -t 2 -p 0 -n 32 -r 1 -o json` as the build of bench/setup_llamacpp.sh printed it
# (2026-11-26, a loaded machine: the rate means nothing).
LLAMA_BENCH_OUTPUT = """[
  {
    "build_commit": "unknown",
    "build_number": 0,
    "cpu_info": "Intel(R) Xeon(R) Processor",
    "gpu_info": "",
    "backends": "CPU",
    "model_filename": "bench/results/generation-work/gguf/llama-124m-gqa-random-q4_0.gguf",
    "model_type": "llama ?B Q4_0",
    "model_size": 47584128,
    "model_n_params": 81660672,
    "n_batch": 2048,
    "n_ubatch": 512,
    "n_threads": 2,
    "cpu_mask": "0x0",
    "cpu_strict": false,
    "poll": 50,
    "type_k": "f16",
    "type_v": "f16",
    "n_gpu_layers": -1,
    "n_cpu_moe": 0,
    "split_mode": "layer",
    "main_gpu": 0,
    "no_kv_offload": false,
    "flash_attn": -1,
    "devices": "auto",
    "tensor_split": "0.00",
    "tensor_buft_overrides": "none",
    "load_mode": "auto",
    "lazy_mode": "auto",
    "embeddings": false,
    "no_op_offload": 0,
    "no_host": false,
    "repack": true,
    "fit_target": 0,
    "fit_min_ctx": 0,
    "n_prompt": 0,
    "n_gen": 32,
    "n_depth": 0,
    "test_time": "2026-11-26T09:32:01Z",
    "avg_ns": 1438163071,
    "stddev_ns": 0,
    "avg_ts": 22.250606,
    "stddev_ts": 0.000000,
    "samples_ns": [ 1438163071 ],
    "samples_ts": [ 22.2506 ]
  }
]
"""
LLAMA_BENCH_TG_RATE = 22.250606


def test_vllm_cpu_list_names_every_core_it_is_given() -> None:
    from bench.vllm_env import PeerSetupError, cpu_list

    assert cpu_list([1, 0]) == "0-1"
    assert cpu_list(range(8)) == "0-7"
    assert cpu_list([0, 2, 3]) == "0,2,3"
    assert cpu_list([3]) == "3"
    with pytest.raises(PeerSetupError, match="empty CPU affinity"):
        cpu_list([])


def test_vllm_launch_binds_all_cores_and_preloads_tcmalloc_then_iomp(tmp_path: Path) -> None:
    from bench.vllm_env import PeerSetupError, vllm_launch

    venv = tmp_path / "venv"
    with pytest.raises(PeerSetupError, match="libiomp5.so missing"):
        vllm_launch(venv, cores=[0, 1], tcmalloc=tmp_path / "libtcmalloc_minimal.so.4")
    (venv / "lib").mkdir(parents=True)
    (venv / "lib" / "libiomp5.so").write_bytes(b"")
    launch = vllm_launch(venv, cores=[0, 1], tcmalloc=Path("/x/libtcmalloc_minimal.so.4"))
    assert launch.env["VLLM_CPU_OMP_THREADS_BIND"] == "0-1"
    assert launch.env["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "0"
    assert launch.env["OMP_NUM_THREADS"] == "2"
    # tcmalloc first: the allocator must be in place before libiomp5 (and anything else) allocates.
    assert launch.env["LD_PRELOAD"] == f"/x/libtcmalloc_minimal.so.4:{venv}/lib/libiomp5.so"
    assert launch.describe()["threads"] == 2 and launch.describe()["binding"] == "cores 0-1"
    # Default cores: this process's whole affinity.
    import os

    default = vllm_launch(venv, tcmalloc=Path("/x/libtcmalloc_minimal.so.4"))
    assert default.env["OMP_NUM_THREADS"] == str(len(os.sched_getaffinity(0)))


def test_vllm_launch_environment_reaches_the_child_without_the_bench_wait_policy(tmp_path: Path,
                                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The peer is spawned with the benchmark's environment merged in (testing/launch.ChildProcess): the variables it
    is given arrive, and OMP_WAIT_POLICY=PASSIVE (set by `python -m bench` for its own threads) does not."""
    from testing.launch import ChildProcess as Process
    from bench.vllm_env import vllm_launch

    tcmalloc = tmp_path / "libtcmalloc_minimal.so.4"
    (tmp_path / "lib").mkdir()
    # Empty files: ld.so reports it cannot preload them and runs the program anyway (only the variables matter here).
    tcmalloc.write_bytes(b"")
    (tmp_path / "lib" / "libiomp5.so").write_bytes(b"")
    launch = vllm_launch(tmp_path, cores=[0], tcmalloc=tcmalloc)
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    proc = Process([*launch.command_prefix(), sys.executable, "-c",
                    "import json, os; print(json.dumps(dict(os.environ)))"], env=launch.env)
    assert proc.proc.wait(timeout=60) == 0
    time.sleep(0.2)
    child = json.loads([ln for ln in proc.lines if ln.startswith("{")][-1])
    assert "OMP_WAIT_POLICY" not in child
    for key in ("VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_NUM_OF_RESERVED_CPU", "OMP_NUM_THREADS", "LD_PRELOAD"):
        assert child[key] == launch.env[key]


def test_find_tcmalloc_searches_the_given_dirs_and_names_a_bad_override(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from bench.vllm_env import PeerSetupError, find_tcmalloc

    monkeypatch.delenv("VLLM_TCMALLOC", raising=False)
    (tmp_path / "libtcmalloc_minimal.so.4").write_bytes(b"")
    assert find_tcmalloc(dirs=(str(tmp_path / "none"), str(tmp_path))) == tmp_path / "libtcmalloc_minimal.so.4"
    monkeypatch.setenv("VLLM_TCMALLOC", str(tmp_path / "missing.so"))
    with pytest.raises(PeerSetupError, match="VLLM_TCMALLOC"):
        find_tcmalloc(dirs=(str(tmp_path),))


def test_bound_cores_reads_vllms_binding_log_line() -> None:
    from bench.vllm_env import bound_cores

    assert bound_cores(["INFO starting", VLLM_BIND_LINE]) == [0, 1]
    assert bound_cores(["INFO nothing about cores"]) is None


def _streams_report(sides: dict | None) -> dict:
    cell = {"ortserve": {"tokens_per_s": 70.0, "ttft_p50_ms": 50.0}, "vllm": {"tokens_per_s": 50.0, "ttft_p50_ms": 80.0},
            "ratio_tokens_per_s": 1.4}
    run = {"command": "python -m bench.generation --pieces streams", "started": "t", "pieces": ["streams"]}
    if sides is not None:
        run["sides"] = sides
    return {"config": {"model": "gpt2"}, "machine": {"nproc": 2}, "streams": {"1": cell},
            "runs": [{"command": "python -m bench.generation --pieces step --no-vllm", "started": "t0",
                      "pieces": ["step"]}, run]}


def test_generation_report_prints_each_sides_threads_and_binding() -> None:
    from bench.generation_report import render_section

    sides = {"ortserve": {"threads": 2, "binding": "not pinned (onnxruntime's default)", "intra_op_spinning": "on",
                          "max_sequences": 32},
             "vllm": {"threads": 2, "binding": "cores 0-1", "logged_core_ids": [0, 1],
                      "env": {"VLLM_CPU_OMP_THREADS_BIND": "0-1", "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
                              "OMP_NUM_THREADS": "2", "LD_PRELOAD": "/t.so:/i.so"}, "unset": ["OMP_WAIT_POLICY"]}}
    text = "\n".join(render_section(_streams_report(sides)))
    assert "  - ortserve: 2 threads; not pinned (onnxruntime's default); intra op spinning on; max sequences 32" in text
    assert ("  - vLLM: 2 threads; cores 0-1 (its log: core ids=[0, 1]); VLLM_CPU_OMP_THREADS_BIND=0-1, "
            "VLLM_CPU_NUM_OF_RESERVED_CPU=0, OMP_NUM_THREADS=2, LD_PRELOAD=/t.so:/i.so; unset OMP_WAIT_POLICY") in text
    assert "| ortserve tok/s | vLLM tok/s |" in text and "ONE core" not in text


def test_generation_report_marks_vllm_figures_without_a_recorded_configuration_as_one_core() -> None:
    from bench.generation_report import render_section

    lines = render_section(_streams_report(None))
    text = "\n".join(lines)
    assert "| ortserve tok/s | vLLM (1 core) tok/s | ortserve / vLLM (1 core) |" in text
    # Under the run that measured vLLM, not under the --no-vllm run before it.
    at = lines.index("- Command: `python -m bench.generation --pieces streams` at t (pieces: streams)")
    assert lines[at + 1].startswith("  - vLLM: ONE core") and "core ids=[0]" in lines[at + 1]
    assert text.count("ONE core") == 1


def test_gguf_tokenizer_check_catches_a_pre_tokenizer_that_differs(tmp_path: Path) -> None:
    """The check run on the converted GGUF: the same tokenizer agrees on every check string; one whose pre-tokenizer
    adds a prefix space (the mapping mistake the converter's explicit pre-tokenizer name could make) is caught."""
    from tokenizers import Tokenizer, pre_tokenizers

    from bench.llamacpp import CHECK_TEXTS, tokenization_mismatches
    from training.tokenizer import TokenizerConfig, save_tokenizer, train_tokenizer

    corpus = [" ".join(CHECK_TEXTS)] * 4 + ["the quick brown fox jumps over the lazy dog " * 20]
    tok = train_tokenizer(corpus, TokenizerConfig(kind="bpe", vocab_size=300, min_frequency=1))
    path = save_tokenizer(tok, tmp_path / "tok", "bpe", 64) / "tokenizer.json"
    ours, same = Tokenizer.from_file(str(path)), Tokenizer.from_file(str(path))
    assert tokenization_mismatches(lambda t: ours.encode(t).ids, lambda t: same.encode(t).ids, CHECK_TEXTS) == []
    other = Tokenizer.from_file(str(path))
    other.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    bad = tokenization_mismatches(lambda t: ours.encode(t).ids, lambda t: other.encode(t).ids, CHECK_TEXTS)
    assert {b["text"] for b in bad} == {t for t in CHECK_TEXTS if not t.startswith(" ")}   # a space is added
    assert all(b["ours"] != b["theirs"] for b in bad)


def test_llama_bench_json_gives_the_generation_rate() -> None:
    from bench.llamacpp import LlamaCppError, parse_llama_bench

    assert parse_llama_bench(LLAMA_BENCH_OUTPUT) == pytest.approx(LLAMA_BENCH_TG_RATE)
    with pytest.raises(LlamaCppError, match="no text-generation result"):
        parse_llama_bench('[{"n_prompt": 512, "n_gen": 0, "avg_ts": 900.0}]')


def test_llamacpp_cli_bad_input_and_missing_tools_are_one_line(tmp_path: Path) -> None:
    import os

    proc = subprocess.run([sys.executable, "-m", "bench", "llamacpp", "--variants", "w5"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "error: --variants: unknown 'w5' (choose from fp32, w8, w4)"]
    env = {**os.environ, "LLAMACPP_VENV": str(tmp_path / "none"), "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "bench", "llamacpp", "--pieces", "raw"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, env=env)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and len(lines) == 1 and "run bash bench/setup_llamacpp.sh" in lines[0]


def test_a_weight_variant_run_gets_its_own_generation_block(tmp_path: Path) -> None:
    """`--variant w4` results sit beside the fp32 block of the same model instead of replacing it."""
    from bench.generation_report import write_docs

    docs = tmp_path / "BENCHMARKS.md"
    fp32 = {**_streams_report(None), "config": {"model": "llama", "variant": "None"}}
    w4 = {**_streams_report(None), "config": {"model": "llama", "variant": "w4"}}
    write_docs(fp32, docs)
    write_docs(w4, docs)
    write_docs(w4, docs)       # again: replaced, not appended
    text = docs.read_text()
    assert text.count("<!-- generation:llama:begin -->") == 1 and text.count("<!-- generation:llama:w4:begin -->") == 1
    assert "## Generation vs peers: llama, ortserve serving its w4 variant (bench/generation.py --model llama " \
           "--variant w4)" in text
