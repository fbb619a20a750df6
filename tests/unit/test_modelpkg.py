"""The package contract (modelpkg/): typed manifest round trip, the one version rule as the exporter, the
deploy pipeline and the server apply it, hashing and I/O names; and the server's layering (front doors reach
only the data plane). (That modelpkg and the pipeline import no torch or onnxruntime is
tests/pipeline/test_torch_free_imports.py: a fresh process.)"""
from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from modelpkg import (FORMAT, CacheSpec, Manifest, ManifestError, existing_versions, file_hashes, parse_version,
                      past_names, present_names, sha256_file, valid_name)
from tests.server_process import ROOT

CLASSIFIER, GPT = "tiny-classifier", "tiny-gpt"


def _manifest(**changes: object) -> dict:
    m = {"format": FORMAT, "name": "m", "version": 1, "task": "generate", "architecture": "gpt2", "labels": [],
         "max_length": 64, "vocab_size": 100, "special_tokens": {"pad": None, "eos": 3}, "mask_token": None,
         "inputs": [{"name": "input_ids", "dtype": "int64", "shape": ["batch", "sequence"]}],
         "outputs": [{"name": "logits", "dtype": "float32", "shape": ["batch", "sequence", "vocab"]}],
         "cache": {"num_layers": 2, "num_heads": 4, "head_dim": 8}, "variants": {"fp32": "model.onnx"},
         "default_variant": {"cpu": "fp32", "cuda": "fp32"}, "opset": 18,
         "source": {"checkpoint": "/x", "checkpoint_sha256": "ab"}, "created_at": "2026-11-23T00:00:00Z"}
    m.update(changes)
    return m


def test_every_exported_manifest_round_trips(tiny_repository: Path) -> None:
    for path in sorted(tiny_repository.glob("*/*/model.json")):
        data = json.loads(path.read_text())
        manifest = Manifest.from_dict(data)
        assert manifest.to_dict() == data, path
        assert list(manifest.to_dict()) == list(data), path  # key order kept too
        # The exporter writes model.json through the typed Manifest: the file is its to_json(), byte for byte.
        assert manifest.to_json() == path.read_text(), path
    gpt = Manifest.from_json((tiny_repository / GPT / "1" / "model.json").read_text())
    assert gpt.cache is not None and gpt.cache.layout in ("concat", "inplace") and gpt.cache.kv_heads >= 1
    assert Manifest.from_json((tiny_repository / CLASSIFIER / "1" / "model.json").read_text()).labels == (
        "alpha", "beta", "gamma")


def test_unknown_and_absent_fields_round_trip() -> None:
    data = _manifest(future_field={"x": [1, 2]})
    data["cache"]["future_cache_key"] = 7
    del data["created_at"], data["opset"]
    assert Manifest.from_dict(data).to_dict() == data


def test_cache_layout_and_kv_heads_default_when_absent() -> None:
    cache = Manifest.from_dict(_manifest()).cache
    assert cache == CacheSpec(num_layers=2, num_heads=4, head_dim=8)
    assert cache.layout == "concat" and cache.num_kv_heads is None and cache.kv_heads == 4
    assert "layout" not in cache.to_dict() and "num_kv_heads" not in cache.to_dict()
    gqa = Manifest.from_dict(_manifest(cache={"num_layers": 2, "num_heads": 4, "head_dim": 8, "layout": "inplace",
                                              "num_kv_heads": 2})).cache
    assert gqa.layout == "inplace" and gqa.kv_heads == 2 and gqa.to_dict()["layout"] == "inplace"
    assert gqa.past_names == past_names(2) and gqa.present_names == present_names(2)


def test_a_variants_mixed_graph_with_and_without_mixed_graphs() -> None:
    base = {"num_layers": 2, "num_heads": 2, "head_dim": 16, "layout": "inplace"}
    now = CacheSpec.from_dict({**base, "mixed_graph": "model.mixed.onnx",
                               "mixed_graphs": {"fp32": "model.mixed.onnx", "kv8": "model.kv8.mixed.onnx"}})
    assert (now.mixed_graph("fp32"), now.mixed_graph("kv8"), now.mixed_graph("int8")) == \
        ("model.mixed.onnx", "model.kv8.mixed.onnx", None)
    # Published before mixed_graphs: its one twin is fp32's, never another variant's.
    before = CacheSpec.from_dict({**base, "mixed_graph": "model.mixed.onnx"})
    assert (before.mixed_graph("fp32"), before.mixed_graph("kv8")) == ("model.mixed.onnx", None)
    assert CacheSpec.from_dict(base).mixed_graph("fp32") is None
    assert CacheSpec.from_dict({**base, "mixed_graphs": {"fp32": 3}}).mixed_graph("fp32") is None


def test_padded_heads_round_trip_and_say_where_the_model_channels_sit() -> None:
    data = {"num_layers": 2, "num_heads": 2, "head_dim": 32, "num_kv_heads": 2, "model_head_dim": 24,
            "layout": "inplace", "future_cache_key": [1]}
    cache = CacheSpec.from_dict(data)
    assert cache.to_dict() == data and cache.extra == {"future_cache_key": [1]}
    assert (cache.head_dim, cache.real_head_dim) == (32, 24)
    assert cache.channels == [*range(12), *range(16, 28)]      # each half of the model's head starts a half
    plain = CacheSpec.from_dict({"num_layers": 2, "num_heads": 2, "head_dim": 32})
    assert plain.real_head_dim == 32 and plain.channels == list(range(32)) and "model_head_dim" not in plain.to_dict()


@pytest.mark.parametrize("change, field", [
    ({"format": "other/1"}, "format"), ({"task": "summarize"}, "task"), ({"max_length": 0}, "max_length"),
    ({"inputs": []}, "inputs"), ({"variants": {"fp32": "../x.onnx"}}, "variants"),
    ({"cache": {"num_layers": 2, "num_heads": 4}}, "cache.head_dim"),
    ({"cache": {"num_layers": 2, "num_heads": 4, "head_dim": 8, "layout": "paged"}}, "cache.layout"),
    ({"cache": {"num_layers": 2, "num_heads": 4, "head_dim": 8, "num_kv_heads": 3}}, "cache.num_kv_heads"),
    ({"cache": {"num_layers": 2, "num_heads": 4, "head_dim": 8, "model_head_dim": 12}}, "cache.model_head_dim"),
    ({"cache": {"num_layers": 2, "num_heads": 4, "head_dim": 9, "model_head_dim": 6}}, "cache.model_head_dim"),
    ({"cache": {"num_layers": 2, "num_heads": 4, "head_dim": 8, "model_head_dim": 0}}, "cache.model_head_dim"),
    ({"task": "classify", "labels": []}, "labels"), ({"task": "fill-mask"}, "mask_token"),
    ({"special_tokens": {"pad": "zero"}}, "special_tokens"),
])
def test_bad_manifests_name_the_field(change: dict, field: str) -> None:
    with pytest.raises(ManifestError, match=rf"^model\.json: {field}"):
        Manifest.from_dict(_manifest(**change))


def test_io_names_and_hashing(tmp_path: Path) -> None:
    assert past_names(2) == ["past_key_values.0.key", "past_key_values.0.value", "past_key_values.1.key",
                             "past_key_values.1.value"]
    assert present_names(1) == ["present.0.key", "present.0.value"]
    (tmp_path / "a.bin").write_bytes(b"abc")
    (tmp_path / "parity.json").write_text("{}")
    (tmp_path / ".tmp").write_text("x")
    assert sha256_file(tmp_path / "a.bin") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    assert file_hashes(tmp_path) == {"a.bin": sha256_file(tmp_path / "a.bin")}


def test_name_and_version_rules() -> None:
    assert valid_name("genre") and valid_name("a.b-c_1") and not valid_name("..") and not valid_name("a/b")
    assert [parse_version(t) for t in ("1", "12", "007", "0", "-1", "²", "1e3", " 2", "9" * 19)] == \
        [1, 12, None, None, None, None, None, None, None]
    # KServe request versions follow the same rule
    from server.protocol.errors import ServingError
    from server.protocol.kserve import parse_version as kserve_version

    assert kserve_version("") == 0 and kserve_version("12") == 12
    with pytest.raises(ServingError, match="model_version: must be a positive integer"):
        kserve_version("007", "model_version")


def test_one_version_rule_for_exporter_pipeline_and_server(tiny_repository: Path, tmp_path: Path) -> None:
    """A directory named 007 is not a version anywhere: the exporter numbers past it, the pipeline does not
    read it, the server does not load it."""
    from export.package import choose_version
    from pipeline.publish import latest_source
    from server.dataplane import DataPlane
    from server.runtime.settings import ServerSettings

    repo = tmp_path / "repo"
    shutil.copytree(tiny_repository / CLASSIFIER / "1", repo / CLASSIFIER / "007")
    shutil.copytree(tiny_repository / CLASSIFIER / "1", repo / CLASSIFIER / "2")
    assert existing_versions(repo / CLASSIFIER) == [2]
    assert choose_version(repo / CLASSIFIER, None) == 3
    assert latest_source(repo, CLASSIFIER)[0] == 2

    async def served_versions() -> list[int]:
        plane = await DataPlane.start(ServerSettings(repository=repo, providers=["CPUExecutionProvider"]), poll=False)
        try:
            return [e.version for e in plane.repository_index() if e.name == CLASSIFIER]
        finally:
            await plane.close()

    assert asyncio.run(served_versions()) == [2]


def test_raw_model_infer_on_an_encoder_goes_through_the_batcher(tiny_repository: Path, tmp_path: Path) -> None:
    """Concurrent raw requests of different lengths share batches, and each gets exactly its own answer."""
    from server.dataplane import DataPlane
    from server.runtime.settings import ServerSettings

    repo = tmp_path / "repo"
    shutil.copytree(tiny_repository / CLASSIFIER, repo / CLASSIFIER)
    rng = np.random.default_rng(0)
    requests = []
    for i in range(12):
        ids = rng.integers(5, 300, size=(1 + i % 3, 4 + i), dtype=np.int64)
        requests.append({"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)})

    async def run() -> tuple[list[np.ndarray], list[np.ndarray], list[int]]:
        # fp32: int8's dynamic quantization scales by the whole batch's range, so its answers depend on the batch
        settings = ServerSettings(repository=repo, providers=["CPUExecutionProvider"], max_queue_delay_ms=50,
                                  variant="fp32")
        plane = await DataPlane.start(settings, poll=False)
        try:
            together = await asyncio.gather(*(plane.infer(CLASSIFIER, 0, r, ["logits"]) for r in requests))
            alone = [await plane.infer(CLASSIFIER, 0, r) for r in requests]
            sizes = [b.batch_size for b in plane.statistics(CLASSIFIER)[0].batches]
            return [t.outputs["logits"] for t in together], [a.outputs["logits"] for a in alone], sizes
        finally:
            await plane.close()

    together, alone, sizes = asyncio.run(run())
    assert max(sizes) > 3  # rows of several requests in one run
    for t, a, r in zip(together, alone, requests):
        assert t.shape == (r["input_ids"].shape[0], 3)
        np.testing.assert_allclose(t, a, atol=1e-4)  # padding to a longer batch changes nothing


def test_raw_decoder_calls_refused_concat_packages_not_served(tiny_checkpoints, tmp_path: Path) -> None:
    """DecoderModel.infer: a decoder refuses raw graph calls with INVALID_ARGUMENT naming the model (never
    reaching onnxruntime; docs/protocol.md); a concat-layout package is not served (its reason says how to
    re-export it), which leaves the in-place one serving."""
    from tests.conftest import one_torch_thread
    from export import ExportConfig, export_checkpoint
    from server.dataplane import DataPlane
    from server.protocol.errors import Code, ServingError
    from server.runtime.settings import ServerSettings
    from testing.concat_decoder import concat_package

    repo = tmp_path / "repo"
    with one_torch_thread():
        concat_package(tiny_checkpoints.gpt, repo, "gpt-concat")   # what export wrote before the in-place cache
        export_checkpoint(ExportConfig(checkpoint=tiny_checkpoints.gpt, task="generate", repository=repo,
                                       name="gpt-inplace"))
    cache = CacheSpec.from_dict(json.loads((repo / "gpt-concat" / "1" / "model.json").read_text())["cache"])
    ids = np.array([[5, 6, 7]], dtype=np.int64)
    feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids), "position_ids": np.arange(3, dtype=np.int64)[None]}
    feeds.update({n: np.zeros((1, cache.kv_heads, 0, cache.head_dim), np.float32) for n in cache.past_names})

    async def run() -> None:
        plane = await DataPlane.start(ServerSettings(repository=repo, providers=["CPUExecutionProvider"]), poll=False)
        try:
            status = {m.name: m for m in plane.list_models()}["gpt-concat"]
            assert status.state == "NOT_SERVING" and "re-export the checkpoint" in status.reason
            with pytest.raises(ServingError) as info:
                await plane.infer("gpt-inplace", 0, feeds)
            assert info.value.code is Code.INVALID_ARGUMENT and info.value.message.startswith("model:")
            assert (await plane.generate("gpt-inplace", 0, "x", _greedy(4))).output.usage.completion_tokens == 4
        finally:
            await plane.close()

    asyncio.run(run())


def _greedy(n: int):  # type: ignore[no-untyped-def]
    from server.generation import GenerationParams

    return GenerationParams.validate(max_new_tokens=n, ignore_eos=True)
