"""Ray Data path (extra `ray`): the in-process runner in a 2-actor pool on a local Ray instance
writes the same output as the plain --local script, including when it resumes a partial output."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.server_process import ROOT

pytest.importorskip("ray.data", reason="the optional extra 'ray' is not installed (pip install -e '.[ray]')")


def batch(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "clients.batch", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)


def test_ray_actor_pool_writes_the_plain_output(tiny_repository: Path, tmp_path: Path) -> None:
    src = tmp_path / "prompts.jsonl"
    rows = [json.dumps({"id": f"p{i}", "prompt": f"Ray prompt {i} says"}) for i in range(40)]
    rows.insert(17, "{broken")  # a failed record between Ray's answers
    src.write_text("\n".join(rows) + "\n")
    common = ["generate", str(src), "--local", str(tiny_repository), "--model", "tiny-gpt", "--max-new-tokens", "10"]
    plain = tmp_path / "plain.jsonl"
    run = batch(*common, "-o", str(plain))
    assert run.returncode == 1, run.stderr  # the broken line

    resumed = tmp_path / "ray.jsonl"
    head = plain.read_text().splitlines(keepends=True)[:12]
    resumed.write_text("".join(head))  # an earlier run got this far
    run = batch(*common, "-o", str(resumed), "--ray", "2")
    assert run.returncode == 1, run.stderr
    assert "29 records in" in run.stderr and "28 ok, 1 failed; 12 already in the output" in run.stderr
    assert resumed.read_bytes() == plain.read_bytes()
    errors = [r for r in map(json.loads, resumed.read_text().splitlines()) if "error" in r]
    assert [e["id"] for e in errors] == [18]
