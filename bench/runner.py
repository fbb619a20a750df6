"""Runs the selected pieces in order, records each one's result file, then regenerates the report."""
from __future__ import annotations

import importlib
import os
import logging
import shutil
import tempfile
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from .config import SuiteConfig
from .machine import describe
from .results import load_results, write_json

log = logging.getLogger(__name__)
ROOT = Path(__file__).resolve().parents[1]


def run_piece(name: str, cfg: SuiteConfig, work: Path) -> dict[str, Any]:
    module = importlib.import_module(f"bench.{name}")
    return module.run(getattr(cfg, name), work)


def run_suite(cfg: SuiteConfig, command: str) -> dict[str, str]:
    """Run every piece of cfg.only; returns piece -> error for the pieces that failed."""
    failed: dict[str, str] = {}
    machine = describe(ROOT)
    work = Path(tempfile.mkdtemp(prefix="ortserve-bench-"))
    try:
        for name in cfg.only:
            log.info("=== %s", name)
            t0 = time.perf_counter()
            started = datetime.now(timezone.utc).isoformat(timespec="seconds")
            meta = {"command": command, "quick": cfg.quick, "started_at": started, "machine": machine}
            try:
                result = run_piece(name, cfg, work / name)
                result.update(status="ok")
            except Exception as exc:  # one piece failing must not lose the others' results
                log.error("%s failed:\n%s", name, traceback.format_exc())
                failed[name] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
                result = {"piece": name, "status": "failed", "error": failed[name]}
            result["meta"] = {**meta, "duration_s": round(time.perf_counter() - t0, 1),
                              "loadavg_at_end": list(os.getloadavg())}
            write_json(cfg.out / f"{name}.json", result)
            log.info("%s: %s in %.0f s -> %s", name, result["status"], time.perf_counter() - t0,
                     cfg.out / f"{name}.json")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    write_report(cfg)
    return failed


def write_report(cfg: SuiteConfig) -> bool:
    """Regenerate the Markdown report and plots from the result files; False when there are none."""
    results = load_results(cfg.out)
    if not results:
        return False
    from .report import render

    checks = render(results, cfg.docs, cfg.plots)
    write_json(cfg.out / "goals.json", [c.as_json() for c in checks])
    for c in checks:
        log.info("goal %-8s %s (%s): %s", {True: "met", False: "MISSED", None: "n/a"}[c.met], c.goal, c.subject,
                 "" if c.value is None else f"{c.value:.3g} {c.unit}")
    return True
