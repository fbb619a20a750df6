"""The pipeline's g2p stage (the main command's `--g2p`): CMUdict grapheme-to-phoneme trained by the real trainer
(tiny recipe, a few steps), exported through the seq2seq gate, published as "g2p", and answered by a real server."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from pipeline.run import Pipeline, PipelineConfig
from tests.server_process import ROOT, ServerProcess



def test_the_g2p_stage_trains_publishes_and_serves(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    p = Pipeline(PipelineConfig(workdir=tmp_path / "w", repository=repo, preset="tiny", steps={"g2p": 3},
                                threads=1, quiet=True, g2p=True))
    p.run_g2p()
    assert p.published == {"g2p": 1}
    manifest = json.loads((repo / "g2p" / "1" / "model.json").read_text())
    assert manifest["task"] == "generate" and manifest["encoder_decoder"]["family"] == "marian"
    p.run_g2p()                                   # nothing changed: nothing retrained or republished
    assert p.published == {"g2p": 1} and "g2p" in p.skipped
    with ServerProcess(repo) as server:
        done = subprocess.run([sys.executable, "-m", "clients", "--address", server.address, "generate",
                               "--model", "g2p", "--max-new-tokens", "4", "Shakespeare"],
                              capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert done.returncode == 0, done.stderr
    # A 3-step model spells nothing useful, but its answer is made of the target vocabulary: ARPAbet symbols.
    pkg = repo / "g2p" / "1"
    target_file = manifest["encoder_decoder"]["target_tokenizer"] or "tokenizer.json"   # one vocabulary for both
    target = json.loads((pkg / target_file).read_text())["model"]["vocab"]
    words = done.stdout.split()
    assert words and all(w in target for w in words), done.stdout
