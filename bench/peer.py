"""Peer comparison: ortserve's KServe ModelInfer vs Seldon MLServer serving the same ONNX file through
the minimal runtime in bench/peer_runtime, both driven by the same tritonclient.grpc load.

MLServer lives in bench/.venv-mlserver (it pins protobuf<7; bench/setup_mlserver.sh builds it) and
runs with `parallel_workers: 0` (inference in its main process, its fastest mode on this machine) and
`debug: false` (debug adds an access-log interceptor to every call). The two servers take turns, run by
run, so they share the machine's noise; only one is under load at a time.
"""
from __future__ import annotations

import json
import logging
import os
import statistics
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from testing.closedloop import drive, per_client as per_client_plan
from testing.launch import ChildProcess as Process, ServerProcess, free_port

from .config import PeerConfig
from .encoder import encode
from .material import classifier_checkpoint, export_package, passages, shared_dir
from .ortprofile import session
from .pyprofile import profile_server
from .stats import Summary, percentile, ratio

log = logging.getLogger(__name__)

HERE = Path(__file__).resolve().parent
VENV = HERE / ".venv-mlserver"
MODEL = "bench-classifier"
INPUTS = ("input_ids", "attention_mask", "token_type_ids")


class PeerError(RuntimeError):
    """The peer server could not be installed or started."""


def ensure_venv() -> Path:
    if (VENV / ".complete").is_file():
        return VENV
    log.info("creating %s (bench/setup_mlserver.sh)", VENV)
    proc = subprocess.run(["bash", str(HERE / "setup_mlserver.sh")], capture_output=True, text=True)
    if proc.returncode != 0:
        lines = [ln for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip() and "is ignored" not in ln]
        raise PeerError(f"setup_mlserver.sh failed: {lines[-1] if lines else 'no output'}")
    return VENV


class MLServerProcess(Process):
    """`mlserver start DIR` with one model served by the onnxruntime runtime of bench/peer_runtime."""

    def __init__(self, work: Path, model_file: Path, threads: int, startup_timeout: float) -> None:
        root = work / "mlserver"
        (root / MODEL).mkdir(parents=True, exist_ok=True)
        self.grpc_port, http_port, metrics_port = free_port(), free_port(), free_port()
        self.settings = {"debug": False, "parallel_workers": 0, "host": "127.0.0.1", "http_port": http_port,
                         "grpc_port": self.grpc_port, "metrics_port": metrics_port}
        (root / "settings.json").write_text(json.dumps(self.settings, indent=2))
        (root / MODEL / "model-settings.json").write_text(json.dumps({
            "name": MODEL, "implementation": "mlserver_ort.OnnxRuntimeModel",
            "parameters": {"uri": str(model_file), "extra": {"intra_op_threads": threads}}}, indent=2))
        super().__init__([str(VENV / "bin" / "mlserver"), "start", str(root)],
                         env={"PYTHONPATH": str(HERE / "peer_runtime")}, cwd=root)
        self._wait_ready(startup_timeout)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def _wait_ready(self, timeout: float) -> None:
        import tritonclient.grpc as tc

        def model_ready() -> bool:
            with tc.InferenceServerClient(self.address) as client:
                return client.is_model_ready(MODEL)
        self.wait_ready(model_ready, timeout, "mlserver", PeerError)


def infer_inputs(feeds: dict[str, np.ndarray]) -> list[Any]:
    import tritonclient.grpc as tc

    out = []
    for name in INPUTS:
        t = tc.InferInput(name, list(feeds[name].shape), "INT64")
        t.set_data_from_numpy(feeds[name])
        out.append(t)
    return out


def _stat_cpu_ticks(stat: Path) -> tuple[int, int]:
    """(parent pid, user + system clock ticks) of a /proc/<pid>/stat or /proc/<pid>/task/<tid>/stat file."""
    fields = stat.read_text().rsplit(")", 1)[1].split()   # after the name: state ppid ... utime (11) stime (12)
    return int(fields[1]), int(fields[11]) + int(fields[12])


def tree_cpu_seconds(root: int) -> float:
    """CPU time (user + system) of a live process and all its descendants (a server and any workers)."""
    parent, cpu = {}, {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            parent[int(entry)], cpu[int(entry)] = _stat_cpu_ticks(Path(f"/proc/{entry}/stat"))
        except OSError:     # gone meanwhile
            continue
    total = 0
    for pid in cpu:
        p = pid
        while p > 1 and p != root:
            p = parent.get(p, 0)
        if p == root:
            total += cpu[pid]
    return total / os.sysconf("SC_CLK_TCK")


def main_thread_cpu_seconds(pid: int) -> float:
    """CPU time of a process's main thread (ortserve's event loop: gRPC, codecs, batcher; not onnxruntime's runs)."""
    return _stat_cpu_ticks(Path(f"/proc/{pid}/task/{pid}/stat"))[1] / os.sysconf("SC_CLK_TCK")


def drive(address: str, feeds: dict[str, np.ndarray], clients: int, per_client: int,
          server_pid: int | None = None) -> dict[str, Any]:
    """`clients` threads, each with its own tritonclient, sending `per_client` requests back to back.

    With server_pid, the CPU time the run took in the server (and its children), in its main thread, and in this
    (client) process."""
    import tritonclient.grpc as tc

    conns = [tc.InferenceServerClient(address) for _ in range(clients)]
    inputs = infer_inputs(feeds)
    wanted = [tc.InferRequestedOutput("logits")]
    cpu0: list[Any] = []

    def read_counters() -> None:
        cpu0.extend((os.times(), tree_cpu_seconds(server_pid) if server_pid else 0.0,
                     main_thread_cpu_seconds(server_pid) if server_pid else 0.0))

    try:
        run = drive(lambda c, i, first: conns[c].infer(MODEL, inputs, outputs=wanted), clients,
                    per_client_plan(per_client), before_release=read_counters)
        mine, server_cpu = os.times(), tree_cpu_seconds(server_pid) if server_pid else 0.0
        main_cpu = main_thread_cpu_seconds(server_pid) if server_pid else 0.0
    except Exception as exc:  # a failed request invalidates the run
        raise PeerError(f"{address}: request failed: {str(exc).splitlines()[0]}") from exc
    finally:
        for c in conns:
            c.close()
    wall = run.wall
    flat = run.latencies()
    out: dict[str, Any] = {"seconds": wall, "requests": len(flat), "latencies": flat}
    if server_pid:
        client_cpu = (mine.user + mine.system) - (cpu0[0].user + cpu0[0].system)
        out["cpu_ms_per_request"] = {"client": 1e3 * client_cpu / len(flat),
                                     "server": 1e3 * (server_cpu - cpu0[1]) / len(flat),
                                     "server_main_thread": 1e3 * (main_cpu - cpu0[2]) / len(flat)}
    return out


def logits(address: str, feeds: dict[str, np.ndarray]) -> np.ndarray:
    import tritonclient.grpc as tc

    with tc.InferenceServerClient(address) as client:
        res = client.infer(MODEL, infer_inputs(feeds), outputs=[tc.InferRequestedOutput("logits")])
        return res.as_numpy("logits")


def graph_ceiling(model_file: Path, feeds: dict[int, np.ndarray], threads: int,
                  seconds: float = 1.5) -> dict[str, Any]:
    """onnxruntime alone on the served file, in this process, with every one of `threads` cores computing: rows/s of
    one spinning session of `threads` threads (MLServer's configuration) and of `threads` one-thread sessions run
    side by side, at each batch size. No server can serve more rows/s than the best of these (it has the graph's
    work plus its own), so best / MLServer's rows/s bounds the throughput ratio any server could reach here."""
    def rows_per_s(sessions: list[Any], batch: int) -> float:
        counts = [0] * len(sessions)
        barrier = threading.Barrier(len(sessions))
        t0 = [0.0]

        def loop(i: int) -> None:
            sessions[i].run(None, feeds[batch])  # warm-up (first run of a shape allocates)
            if barrier.wait() == 0:
                t0[0] = time.perf_counter()
            end = time.perf_counter() + seconds
            while time.perf_counter() < end:
                sessions[i].run(None, feeds[batch])
                counts[i] += 1

        workers = [threading.Thread(target=loop, args=(i,)) for i in range(len(sessions))]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        return sum(counts) * batch / (time.perf_counter() - t0[0])   # the last runs end after `seconds`

    configs = {f"1 session x {threads} threads, spinning": [session(model_file, threads, spinning=True)],
               f"{threads} sessions x 1 thread, side by side": [session(model_file, 1) for _ in range(threads)]}
    table = {name: {str(b): rows_per_s(sessions, b) for b in sorted(feeds)} for name, sessions in configs.items()}
    best = max((v, name, b) for name, by_batch in table.items() for b, v in by_batch.items())
    return {"rows_per_s": table, "best_rows_per_s": best[0], "best": f"{best[1]}, batch {best[2]}"}


def batch_runs(address: str) -> dict[int, int]:
    """ortserve's onnxruntime runs so far by rows per run (KServe ModelStatistics batch_stats)."""
    import tritonclient.grpc as tc

    with tc.InferenceServerClient(address) as client:
        stats = client.get_inference_statistics(MODEL)
    return {int(b.batch_size): int(b.compute_infer.count) for s in stats.model_stats for b in s.batch_stats}


def run(cfg: PeerConfig, work: Path) -> dict[str, Any]:
    ensure_venv()
    ckpt = classifier_checkpoint(shared_dir(work), cfg.sources.classifier)
    ckpt.name = MODEL
    # The encoder piece's variants: the same export is then reused instead of gated again.
    pkg = export_package(ckpt, "classify", work / "repository", ("fp32", "optimized", "int8"),
                         threads=cfg.threads)
    variant = (pkg.manifest.get("default_variant") or {}).get("cpu") or "fp32"
    model_file = pkg.variant_file(variant)
    texts = passages(max(max(cfg.batches), max(cfg.ceiling_batches)), min_words=60, seed=7)
    feeds = {b: encode(pkg.path / "tokenizer.json", texts[:b], cfg.seq) for b in cfg.batches}
    ceiling_feeds = {b: encode(pkg.path / "tokenizer.json", texts[:b], cfg.seq) for b in cfg.ceiling_batches}
    # Before any server starts: the machine is the graph's alone.
    ceilings = [graph_ceiling(model_file, ceiling_feeds, cfg.threads)]
    instances = max(1, min(cfg.instances, cfg.threads))
    ortserve_args = ["--intra-op-threads", str(cfg.threads // instances), "--inter-op-threads", "1",
                     "--encoder-instances", str(instances), "--intra-op-spinning", cfg.spinning, "--variant", variant]
    ortserve = ServerProcess(work / "repository", ortserve_args, cfg.startup_timeout)
    try:
        peer = MLServerProcess(work, model_file, cfg.threads, cfg.startup_timeout)
    except BaseException:
        ortserve.stop()
        raise
    servers = {"ortserve": ortserve.address, "mlserver": peer.address}
    pids = {"ortserve": ortserve.proc.pid, "mlserver": peer.proc.pid}
    try:
        check = {k: logits(a, feeds[max(cfg.batches)]) for k, a in servers.items()}
        max_diff = float(np.abs(check["ortserve"] - check["mlserver"]).max())
        for a in servers.values():  # warm-up
            drive(a, feeds[1], 2, 5)
        cells = []
        for clients in cfg.clients:
            for batch in cfg.batches:
                per_client = max(10, cfg.rows_per_cell // (clients * batch))
                runs: dict[str, list[dict[str, Any]]] = {k: [] for k in servers}
                before = batch_runs(ortserve.address)
                for _ in range(cfg.repeats):
                    for k, a in servers.items():
                        runs[k].append(drive(a, feeds[batch], clients, per_client, pids[k]))
                after = batch_runs(ortserve.address)
                cell: dict[str, Any] = {"clients": clients, "batch": batch}
                thr = {}
                for k, rs in runs.items():
                    lat = [x for r in rs for x in r["latencies"]]
                    thr[k] = Summary.of([r["requests"] / r["seconds"] for r in rs])
                    cell[k] = {"requests_per_s": thr[k].as_json(),
                               "rows_per_s": thr[k].scaled(batch).as_json(),
                               "p50_ms": percentile(lat, 50) * 1e3, "p95_ms": percentile(lat, 95) * 1e3,
                               "requests": len(lat),
                               "cpu_ms_per_request": {side: statistics.median(r["cpu_ms_per_request"][side] for r in rs)
                                                      for side in ("client", "server", "server_main_thread")}}
                # Rows per onnxruntime run inside ortserve during this cell (the dynamic batcher's work).
                cell["ortserve"]["runs_by_rows"] = {str(rows): after[rows] - before.get(rows, 0) for rows in
                                                    sorted(after) if after[rows] > before.get(rows, 0)}
                cell["throughput_ratio_ortserve_vs_mlserver"] = ratio(thr["ortserve"], thr["mlserver"])
                cell["p50_ratio_ortserve_vs_mlserver"] = cell["ortserve"]["p50_ms"] / cell["mlserver"]["p50_ms"]
                log.info("peer %d clients batch %d: ortserve %.1f req/s p50 %.2f ms (runs by rows %s), mlserver %.1f "
                         "req/s p50 %.2f ms", clients, batch, thr["ortserve"].median, cell["ortserve"]["p50_ms"],
                         cell["ortserve"]["runs_by_rows"], thr["mlserver"].median, cell["mlserver"]["p50_ms"])
                cells.append(cell)
    finally:
        peer.stop()
        ortserve.stop()
    ceilings.append(graph_ceiling(model_file, ceiling_feeds, cfg.threads))  # again, with both servers gone
    # Where ortserve's main thread spends a batch-1 ModelInfer (separate process under cProfile, untimed).
    n_prof = max(20, cfg.rows_per_cell // 4)
    ortserve_profile = profile_server(
        lambda prof: ServerProcess(work / "repository", ortserve_args, cfg.startup_timeout, profile_to=prof),
        lambda server: drive(server.address, feeds[1], 1, n_prof), n_prof, work)
    versions = subprocess.run([str(VENV / "bin" / "python"), "-c",
                               "import mlserver, onnxruntime, google.protobuf as p; "
                               "print(mlserver.__version__, onnxruntime.__version__, p.__version__)"],
                              capture_output=True, text=True).stdout.split()
    return {"piece": "peer", "threads": cfg.threads, "seq": cfg.seq, "variant": variant,
            "ortserve": {"encoder_instances": instances, "intra_op_threads": cfg.threads // instances,
                         "intra_op_spinning": cfg.spinning},
            "graph_ceiling": {"runs": ceilings,
                              "best_rows_per_s": statistics.median(c["best_rows_per_s"] for c in ceilings)},
            "model": ckpt.describe(), "model_file": model_file.name,
            "mlserver": {"settings": {k: v for k, v in peer.settings.items() if not k.endswith("port") and k != "host"},
                         "versions": dict(zip(("mlserver", "onnxruntime", "protobuf"), versions)),
                         "runtime": "bench/peer_runtime/mlserver_ort.py"},
            "load": "tritonclient.grpc, one client per thread, raw INT64 input tensors, output 'logits'",
            "max_abs_diff_between_servers": max_diff, "cells": cells,
            "ortserve_kserve_batch1_profile": ortserve_profile}
