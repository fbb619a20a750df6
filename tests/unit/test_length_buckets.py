"""server/encoders/length_buckets.py: the cut of a padded batch into runs of similar length (pure), and the same answers as
one padded run on a real onnxruntime session of the tiny classifier and on the tiny fill-mask model (an output
with a sequence axis)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from server.encoders.length_buckets import LengthBucketedRun, plan


def test_plan_keeps_one_run_for_rows_of_one_length_and_cuts_two_clusters() -> None:
    assert plan([20, 20, 20, 20]) == [[0, 1, 2, 3]]
    runs = plan([18, 60, 17, 58, 19, 61, 16, 57], overhead=64)
    assert sorted(map(sorted, runs)) == [[0, 2, 4, 6], [1, 3, 5, 7]]
    # Two rows of a little different length: a second run costs more than the padding it saves.
    assert plan([30, 34], overhead=64) == [[0, 1]]
    # No overhead: every distinct length its own run, shortest first.
    assert plan([5, 3, 5, 9], overhead=0) == [[1], [0, 2], [3]]


def test_plan_is_the_cheapest_cut_of_the_sorted_rows() -> None:
    rng = np.random.default_rng(0)
    for _ in range(50):
        lengths = [int(x) for x in rng.integers(1, 120, rng.integers(1, 9))]
        runs = plan(lengths, overhead=40)
        got = sum(len(r) * max(lengths[i] for i in r) + 40 for r in runs)
        srt = sorted(lengths)
        n = len(srt)
        brute = min(sum((b - a) * srt[b - 1] + 40 for a, b in zip([0, *cuts], [*cuts, n]))
                    for mask in range(1 << (n - 1))
                    for cuts in [[i + 1 for i in range(n - 1) if mask >> i & 1]])
        assert got == brute and sorted(i for r in runs for i in r) == list(range(n))


def _batch(lengths: list[int], width: int, vocab: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    ids = np.zeros((len(lengths), width), np.int64)
    for r, n in enumerate(lengths):
        ids[r, :n] = rng.integers(5, vocab, n)
    mask = (np.arange(width)[None, :] < np.array(lengths)[:, None]).astype(np.int64)
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}


@pytest.mark.parametrize("name", ["tiny-classifier", "tiny-fill-mask"])
def test_grouped_runs_answer_as_one_padded_run(tiny_repository: Path, name: str) -> None:
    package = tiny_repository / name / "1"
    manifest = json.loads((package / "model.json").read_text())
    session = ort.InferenceSession(str(package / manifest["variants"]["fp32"]), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    inputs = [i.name for i in session.get_inputs()]
    calls: list[tuple[int, int]] = []

    def run(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        calls.append(feeds["input_ids"].shape)
        return dict(zip(names, session.run(names, {k: feeds[k] for k in inputs})))

    sequence_outputs = [o["name"] for o in manifest["outputs"] if o["shape"][1:2] == ["sequence"]]
    bucketed = LengthBucketedRun(run, ["input_ids", "attention_mask", "token_type_ids"], sequence_outputs, overhead=8)
    lengths = [6, 40, 5, 38, 7, 41]
    feeds = _batch(lengths, 41, manifest["vocab_size"])
    want = run(feeds)
    calls.clear()
    got = bucketed(feeds)
    assert sorted(calls) == [(3, 7), (3, 41)]             # two runs, each as wide as its own longest row
    for out in names:
        assert got[out].shape == want[out].shape
        if out in sequence_outputs:                           # only the real positions mean anything
            for r, n in enumerate(lengths):
                np.testing.assert_allclose(got[out][r, :n], want[out][r, :n], atol=1e-4)
        else:
            np.testing.assert_allclose(got[out], want[out], atol=1e-4)
    # A left-padded batch is run as it came.
    calls.clear()
    bucketed({k: v[:, ::-1].copy() for k, v in feeds.items()})
    assert calls == [(6, 41)]
