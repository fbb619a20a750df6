"""The pipeline's punctuation stage (the main command's `--punctuate`): the real token-classification trainer on the
corpus's own marks and capitals (a few steps from a tiny encoder), exported through the gate, published as
"punctuate", and answered by a real server through the `ortserve punctuate` / `ortserve token-classify` commands."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.run import Pipeline, PipelineConfig
from tests.server_process import ROOT, ServerProcess

LINE = "what say you my lord shall we go to the king"


def _cli(server: ServerProcess, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "clients", "--address", server.address, *args],
                          capture_output=True, text=True, cwd=ROOT, timeout=60)


def test_the_punctuation_stage_trains_publishes_and_serves(tiny_checkpoints, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    p = Pipeline(PipelineConfig(workdir=tmp_path / "w", repository=repo, steps={"token-classify": 3}, threads=1,
                                quiet=True, punctuate=True))
    p.run_punctuate(tiny_checkpoints.mlm)
    assert p.published == {"punctuate": 1}
    manifest = json.loads((repo / "punctuate" / "1" / "model.json").read_text())
    assert manifest["task"] == "token-classify"
    assert {"O", "B-Cap", "B-COMMA", "B-Cap+PERIOD"} <= set(manifest["labels"])
    # int8 is asked for: served when the gate passed it, else left out with its figure in parity.json.
    int8 = json.loads((repo / "punctuate" / "1" / "parity.json").read_text())["variants"]["int8"]
    assert set(manifest["variants"]) == {"fp32", "optimized"} | ({"int8"} if int8["passed"] else set())
    assert int8["checks"][0]["name"] == "top-1 agreement" and int8["status"].startswith(
        "passed" if int8["passed"] else "refused: top-1 agreement")
    p.run_punctuate(tiny_checkpoints.mlm)          # nothing changed: nothing retrained or republished
    assert p.published == {"punctuate": 1} and "token-classify" in p.skipped

    with ServerProcess(repo) as server:
        done = _cli(server, "punctuate", LINE)
        assert done.returncode == 0, done.stderr
        restored = done.stdout.strip()
        # Whatever a 3-step model predicts, restoring only capitalises words and appends marks after them.
        assert re.sub(r"[,.?!]", "", restored).lower() == LINE, restored

        tagged = _cli(server, "--json", "token-classify", "--aggregation", "first", "--keep-o", LINE)
        assert tagged.returncode == 0, tagged.stderr
        entities = json.loads(tagged.stdout)[0]
        # "first" with O kept covers every word in order: each B- word is an entity of its own, and runs of O
        # words group into one (as transformers' pipeline groups them).
        assert " ".join(LINE[e["start"]:e["end"]] for e in entities) == LINE
        for e in entities:
            words = LINE[e["start"]:e["end"]].split()
            assert e["label"] == "O" or (len(words) == 1 and f"B-{e['label']}" in manifest["labels"]), e

        bad = _cli(server, "token-classify", "--aggregation", "longest", LINE)
        assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "--aggregation" in bad.stderr
        missing = _cli(server, "punctuate", "--model", "no-such-model", LINE)
        assert missing.returncode == 1 and "NOT_FOUND" in missing.stderr, missing.stderr


def test_the_pipeline_command_line_asks_for_the_stage_by_name(capsys) -> None:
    from pipeline.cli import parse_args

    cfg = parse_args(["--punctuate", "--steps", "token-classify=7", "--variants", "token-classify=fp32",
                      "--name", "token-classify=punct"])
    assert cfg.punctuate and cfg.steps == {"token-classify": 7}
    assert cfg.variants["token-classify"] == "fp32" and cfg.names["token-classify"] == "punct"
    assert not parse_args([]).punctuate and parse_args([]).names["token-classify"] == "punctuate"
    with pytest.raises(SystemExit) as stop:
        parse_args(["--steps", "punctuate=7"])
    assert stop.value.code == 2 and "--steps" in capsys.readouterr().err
