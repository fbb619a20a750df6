"""The pure parts of head scoring and zero-shot: the recorded activation and its refusals
(server/encoders/activation.py), a zero-shot request's checks (server/protocol/zero_shot.py) and the pipeline's NLI
column rule and scores (server/encoders/zero_shot.py). Served answers against transformers:
tests/e2e/http/test_encoder_tasks.py."""
from __future__ import annotations

import json

import numpy as np
import pytest

from modelpkg import FORMAT, Manifest
from server.encoders.activation import apply, check_function, check_recorded, recorded
from server.encoders.zero_shot import nli_columns, scores_of
from server.protocol.errors import ServingError
from server.protocol.zero_shot import DEFAULT_TEMPLATE, ZeroShotRequest

MANIFEST = {"format": FORMAT, "name": "m", "version": 1, "task": "classify", "architecture": "bert",
            "labels": ["a", "b"], "max_length": 16, "vocab_size": 10, "special_tokens": {}, "mask_token": None,
            "inputs": [{"name": "input_ids", "dtype": "int64", "shape": ["batch", "sequence"]}],
            "outputs": [{"name": "logits", "dtype": "float32", "shape": ["batch", "labels"]}], "cache": None,
            "variants": {"fp32": "model.onnx"}, "default_variant": None, "opset": 18, "source": {},
            "created_at": "2026-01-01T00:00:00Z"}


def _manifest(**extra: object) -> Manifest:
    return Manifest.from_json(json.dumps({**MANIFEST, **extra}))


def _field(exc: pytest.ExceptionInfo[ServingError]) -> str:
    return exc.value.message.split(":")[0]


def test_recorded_activation_and_old_packages() -> None:
    old = _manifest()    # a package made before the field: what the server did then
    assert recorded(old, "softmax") == "softmax" and recorded(old, "sigmoid") == "sigmoid"
    check_recorded(old)
    for function in ("softmax", "sigmoid", "none"):
        manifest = _manifest(head={"function_to_apply": function, "source": "config.json problem_type"})
        assert recorded(manifest, "softmax") == function
        check_recorded(manifest)
        assert manifest.to_dict()["head"]["function_to_apply"] == function   # round-trips through modelpkg
    with pytest.raises(ValueError, match="head.function_to_apply 'tanh'"):
        check_recorded(_manifest(head={"function_to_apply": "tanh"}))


def test_function_to_apply_checked_by_name() -> None:
    assert check_function(None) is None and check_function("") is None and check_function("none") == "none"
    for bad in ("Softmax", "tanh", 3):
        with pytest.raises(ServingError) as info:
            check_function(bad, "parameters.function_to_apply")   # type: ignore[arg-type]
        assert _field(info) == "parameters.function_to_apply"


def test_activations_on_logits() -> None:
    logits = np.array([[2.0, -1.0, 0.5], [0.0, 0.0, 0.0]], dtype=np.float32)
    soft = apply(logits, "softmax")
    np.testing.assert_allclose(soft.sum(axis=1), 1.0)
    np.testing.assert_allclose(soft[0], np.exp(logits[0]) / np.exp(logits[0]).sum(), rtol=1e-6)
    np.testing.assert_allclose(apply(logits, "sigmoid"), 1 / (1 + np.exp(-logits.astype(np.float64))))
    np.testing.assert_array_equal(apply(logits, "none"), logits.astype(np.float64))


def test_zero_shot_request_checks() -> None:
    request = ZeroShotRequest.build("a text", "sports, politics ,, music")
    assert request.texts == ["a text"] and request.candidate_labels == ["sports", "politics", "music"]
    assert request.hypothesis_template == DEFAULT_TEMPLATE
    assert request.hypotheses() == ["This example is sports.", "This example is politics.", "This example is music."]
    assert ZeroShotRequest.build(["t"], ["x"], "{0} or {0}?").hypotheses() == ["x or x?"]
    assert ZeroShotRequest.build(["t"], ["x"], "{{literal}} {}").hypotheses() == ["{literal} x"]
    for args, field in ((([], ["a"]), "texts"), ((["t"], []), "candidate_labels"), ((["t"], ""), "candidate_labels"),
                        ((["t"], ["a", ""]), "candidate_labels[1]"), ((["t", 1], ["a"]), "texts[1]"),
                        ((["t"], ["a"], "none"), "hypothesis_template"),
                        ((["t"], ["a"], "{0.__class__}"), "hypothesis_template"),
                        ((["t"], ["a"], "{0[0]}"), "hypothesis_template"),
                        ((["t"], ["a"], "{} {}"), "hypothesis_template"),
                        ((["t"], ["a"], "{!r}"), "hypothesis_template"),
                        ((["t"], ["a"], "{"), "hypothesis_template"),
                        ((["t"], ["a"], "x" * 2000 + "{}"), "hypothesis_template")):
        with pytest.raises(ServingError) as info:
            ZeroShotRequest.build(*args)   # type: ignore[arg-type]
        assert _field(info) == field, args


def test_nli_columns_as_the_pipeline_finds_them() -> None:
    assert nli_columns(["contradiction", "neutral", "entailment"], "m") == (2, 0)
    assert nli_columns(["ENTAILMENT", "neutral", "CONTRADICTION"], "m") == (0, 2)   # entailment first: the last
    assert nli_columns(["entailment", "contradiction"], "m") == (0, 1)
    for labels in (["alpha", "beta", "gamma"], ["entailment", "neutral"], ["LABEL_0"]):
        with pytest.raises(ServingError) as info:
            nli_columns(labels, "m")
        assert _field(info) == "model" and "'m' has no NLI label map" in info.value.message


def test_zero_shot_scores() -> None:
    logits = np.array([[[1.0, 0.0, 3.0], [0.5, 0.2, -1.0], [2.0, 1.0, 0.0]]])   # 1 text x 3 candidates
    single = scores_of(logits, 2, 0, False)
    e = np.exp(logits[0, :, 2])
    np.testing.assert_allclose(single[0], e / e.sum())
    multi = scores_of(logits, 2, 0, True)
    np.testing.assert_allclose(multi[0], np.exp(logits[0, :, 2]) / (np.exp(logits[0, :, 2]) + np.exp(logits[0, :, 0])))
    one = scores_of(logits[:, :1], 2, 0, False)   # one candidate: scored alone, as with multi_label
    np.testing.assert_allclose(one, multi[:, :1])
