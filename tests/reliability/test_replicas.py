"""Two server replicas on loopback behind grpc's round_robin; one is killed mid-run, no record fails."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

from tests.batch_runs import wait_for_lines
from tests.server_process import ROOT, ServerProcess, repository_with

RECORDS = 80


def test_batch_survives_a_replica_killed_mid_run(tiny_repository: Path, tmp_path: Path) -> None:
    src = tmp_path / "prompts.txt"
    src.write_text("".join(f"Replica prompt {i}\n" for i in range(RECORDS)))
    out = tmp_path / "out.jsonl"
    replicas = [ServerProcess(repository_with(tiny_repository, tmp_path / f"repo{i}", "tiny-gpt"),
                              ["--metrics-port", "0"]) for i in range(2)]
    doomed, survivor = replicas
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "clients.batch", "generate", str(src), "-o", str(out), "--model", "tiny-gpt",
             "--max-new-tokens", "48", "--concurrency", "4", "--retries", "10",
             "--address", doomed.address, "--address", survivor.address],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        wait_for_lines(proc, out, 12)
        doomed.kill()  # SIGKILL with requests in flight on it
        written_at_kill = out.read_bytes().count(b"\n")
        _, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 0, stderr
        assert doomed.proc.returncode == -signal.SIGKILL and written_at_kill < RECORDS, "not killed mid-run"
        records = [json.loads(line) for line in out.read_text().splitlines()]
        assert [r["id"] for r in records] == list(range(1, RECORDS + 1))
        assert not [r for r in records if "error" in r]
        # Round robin really spread the work: the survivor did not answer everything itself.
        answered = survivor.metric("ortserve_requests_total", model="tiny-gpt", method="Generate", code="OK")
        assert 0 < answered < RECORDS
    finally:
        for replica in replicas:
            replica.stop()
