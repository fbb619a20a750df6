"""The package contract (modelpkg/) and the pipeline import neither torch nor onnxruntime (nor onnx): checked in a
fresh interpreter, so nothing the test process already imported counts."""
from __future__ import annotations

import subprocess
import sys

from tests.server_process import ROOT


def test_the_contract_is_torch_and_onnxruntime_free() -> None:
    code = ("import sys, modelpkg, pipeline; bad = sorted(m for m in sys.modules if m.split('.')[0] in "
            "('torch', 'onnxruntime', 'onnx')); print(bad); sys.exit(1 if bad else 0)")
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
