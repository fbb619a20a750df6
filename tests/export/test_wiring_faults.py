"""A wiring fault is refused by the fp32 gate whose tolerance follows the reference's float noise
(export/parity_noise.py): one residual connection of the built graph dropped (export/wiring_fault.py, through the
export's perturbation hook), on every family kind: an encoder (classifier), a decoder (the in-place graph), and an
encoder-decoder's encoder and decoder graphs (of the loud models, whose noise-scaled tolerance is the widest). The
fault's error must be far above the tolerance the gate derived, and nothing is published."""
from __future__ import annotations

from pathlib import Path

import pytest

from export import ExportConfig, export_checkpoint
from export.errors import ParityFailure
from export.model_builder import PERTURB_ENV
from export.wiring_fault import FAULT_ENV
from tests.loud_seq2seq import write_loud_checkpoint

# The fault's error over the largest atol a failed check was judged by: every failed check's at least FAR, the
# largest at least FARTHEST (a dropped residual moves outputs by whole units; the widest atol, BART's, is under 1).
FAR, FARTHEST = 10.0, 100.0


def _refused(cfg: ExportConfig, target: str, monkeypatch: pytest.MonkeyPatch) -> dict:
    monkeypatch.setenv(PERTURB_ENV, target)
    monkeypatch.setenv(FAULT_ENV, "wiring")
    with pytest.raises(ParityFailure) as info:
        export_checkpoint(cfg)
    assert not (cfg.repository / cfg.name).exists() or not any((cfg.repository / cfg.name).glob("[0-9]*"))
    return info.value.report["variants"]["fp32"]


def _far_above_the_tolerance(fp32: dict) -> None:
    failed = [c for c in fp32["checks"] if not c["passed"]]
    assert failed, fp32["checks"]
    judged = [c for c in failed if c.get("tolerance")]
    assert judged, failed     # the noise rule set the tolerance of the checks that failed
    ratios = []
    for c in judged:
        ratios.append(c["max_abs_diff"] / max(c["tolerance"].values()))
        assert ratios[-1] > FAR, (c["name"], c["max_abs_diff"], c["tolerance"], c.get("noise"))
    assert max(ratios) > FARTHEST, ratios
    assert fp32["float_noise"]["fp64_noise"]


@pytest.mark.parametrize("task,checkpoint", [("classify", "classifier"), ("generate", "gpt")])
def test_wiring_fault_refused_encoder_and_decoder(tiny_checkpoints, tmp_path: Path, monkeypatch, task: str,
                                                  checkpoint: str) -> None:
    cfg = ExportConfig(checkpoint=tiny_checkpoints[checkpoint], task=task, repository=tmp_path / "repo", name="m")
    _far_above_the_tolerance(_refused(cfg, "fp32", monkeypatch))


@pytest.mark.parametrize("name,graph", [("marian-loud", "encoder"), ("bart-loud", "fp32"), ("t5-loud", "encoder")])
def test_wiring_fault_refused_encoder_decoder(tmp_path: Path, monkeypatch, name: str, graph: str) -> None:
    """graph: the hook's target, "encoder" the encoder graph, "fp32" the decoder graph."""
    cfg = ExportConfig(checkpoint=write_loud_checkpoint(name, tmp_path / name), task="generate",
                       repository=tmp_path / "repo", name=name)
    _far_above_the_tolerance(_refused(cfg, graph, monkeypatch))
