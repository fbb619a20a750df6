"""onnxruntime sessions for the benchmarks and op-type breakdowns from onnxruntime's profiling JSON."""
from __future__ import annotations

import json
import logging
import os
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import onnxruntime as ort

log = logging.getLogger(__name__)


def session(path: Path, threads: int, profile_dir: Path | None = None, spinning: bool = False
            ) -> ort.InferenceSession:
    """CPU session with `threads` intra-op threads, sequential execution (what the server configures).
    spinning=True keeps onnxruntime's default busy-waiting threads (a machine measured for one backend alone)."""
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.log_severity_level = 3
    # By default no spin-waiting after a run: the interleaved backends would otherwise compete with an
    # idle-spinning onnxruntime worker for the 2 cores (the same reason torch gets OMP_WAIT_POLICY=PASSIVE).
    opts.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
    if profile_dir is not None:
        opts.enable_profiling = True
        opts.profile_file_prefix = str(profile_dir / Path(path).stem)
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def op_breakdown(profile_file: Path, top: int = 8) -> dict[str, Any]:
    """Share of node time per op type over the profiled runs; the first run (allocation, warm-up) is
    left out when there is more than one."""
    events = json.loads(Path(profile_file).read_text())
    runs = sorted((float(e["ts"]), float(e.get("dur", 0))) for e in events
                  if e.get("cat") == "Session" and e.get("name") == "model_run")
    if len(runs) > 1:
        runs = runs[1:]
    per_op: dict[str, float] = defaultdict(float)
    for e in events:
        if e.get("cat") != "Node" or not e.get("name", "").endswith("_kernel_time"):
            continue
        ts = float(e.get("ts", 0))
        if any(start <= ts <= start + dur for start, dur in runs):
            per_op[e.get("args", {}).get("op_name", "?")] += float(e.get("dur", 0))
    run_us = sum(d for _, d in runs)
    total = sum(per_op.values())
    ranked = sorted(per_op.items(), key=lambda kv: -kv[1])
    n = len(runs)
    return {
        "runs": n,
        "run_ms_mean": run_us / n / 1e3 if n else None,
        "kernel_share_of_run": total / run_us if run_us else None,
        "top_ops": [{"op": op, "share": us / total if total else 0.0, "ms_per_run": us / max(n, 1) / 1e3}
                    for op, us in ranked[:top]],
    }


def profile_runs(path: Path, threads: int, feeds: dict[str, Any], runs: int, work: Path,
                 output_names: list[str] | None = None) -> dict[str, Any]:
    """Run `feeds` through a profiling session `runs` times; return its op breakdown (file removed)."""
    work.mkdir(parents=True, exist_ok=True)
    sess = session(path, threads, profile_dir=work)
    for _ in range(runs):
        sess.run(output_names, feeds)
    prof = Path(sess.end_profiling())
    try:
        return op_breakdown(prof)
    finally:
        os.unlink(prof)


def profile_callable(path: Path, threads: int, work: Path, body: Callable[[ort.InferenceSession], None]
                     ) -> dict[str, Any]:
    """Like profile_runs, for a caller that drives the session itself (e.g. a decode loop)."""
    work.mkdir(parents=True, exist_ok=True)
    sess = session(path, threads, profile_dir=work)
    body(sess)
    prof = Path(sess.end_profiling())
    try:
        return op_breakdown(prof)
    finally:
        os.unlink(prof)
