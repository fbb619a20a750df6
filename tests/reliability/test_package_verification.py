"""Every file the server opens for a version is listed in parity.json with a matching sha256, and a variant serves
only if its own parity verdict passed (issue 40, item 1; server/repository/served_files.py, docs/model-package.md).

Before this rule a decoder's mixed graph was not among the files the loader required parity.json to list: a copy of
version 1 whose `model.mixed.onnx` was rewritten (embedding rows reversed: still a valid graph) and dropped from
`files` went SERVING; a `variants.<name>` verdict of "refused" under a top-level `passed: true` was served on that
variant; and tokenizer_config.json was read only when listed (so an unlisted one was silently skipped).

Each case is published as the next version under a real server polling the repository (the export's way: staged,
then renamed); the bad ones go NOT_SERVING naming the file or the variant and version 1 serves on.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Callable, Iterator

import grpc
import numpy as np
import onnx
import pytest
from onnx import numpy_helper
from tests.server_process import ServerProcess, repository_with

from protos import ortserve_pb2 as pb
from protos import ortserve_pb2_grpc as pb_grpc
from testing.launch import wait_for

CLASSIFIER, GPT = "tiny-classifier", "tiny-gpt"
REFUSED = "refused: top-1 agreement 0.5000 (limit 0.99)"


def _edit_json(path: Path, change: Callable[[dict], None]) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def _unlist(package: Path, name: str) -> None:
    _edit_json(package / "parity.json", lambda p: p["files"].pop(name))


def reversed_embedding(graph: Path, vocab_size: int) -> None:
    """The graph rewritten with its embedding's rows in reverse order: a valid graph that computes other logits."""
    model = onnx.load(str(graph))
    for init in model.graph.initializer:
        if len(init.dims) == 2 and init.dims[0] == vocab_size and init.data_type == onnx.TensorProto.FLOAT:
            init.CopyFrom(numpy_helper.from_array(np.ascontiguousarray(numpy_helper.to_array(init)[::-1]), init.name))
            break
    else:
        raise AssertionError(f"{graph.name}: no [{vocab_size}, hidden] embedding found")
    onnx.save(model, str(graph))


def tampered_mixed_graph(p: Path) -> None:
    mixed = json.loads((p / "model.json").read_text())["cache"]["mixed_graphs"]["fp32"]
    reversed_embedding(p / mixed, json.loads((p / "model.json").read_text())["vocab_size"])
    _unlist(p, mixed)


def unlisted_tokenizer_config(p: Path) -> None:
    """Another model's tokenizer_config.json (its eos_token is not this tokenizer's), not listed in parity.json."""
    _edit_json(p / "tokenizer_config.json", lambda c: c.update(eos_token="[SEP]"))
    _unlist(p, "tokenizer_config.json")


def variant_refused(variant: str) -> Callable[[Path], None]:
    """parity.json's own verdict on `variant` is "refused" while its top level still says passed."""
    def apply(p: Path) -> None:
        _edit_json(p / "parity.json", lambda r: r["variants"][variant].update(passed=False, status=REFUSED))
    return apply


def publish(repo: Path, model: str, version: int, change: Callable[[Path], None]) -> None:
    staging = repo / model / ".tmp-publish"
    shutil.copytree(repo / model / "1", staging)
    change(staging)
    os.rename(staging, repo / model / str(version))


class Status:
    def __init__(self, address: str) -> None:
        self.channel = grpc.insecure_channel(address)
        self.stub = pb_grpc.TaskServiceStub(self.channel)

    def __call__(self, model: str, version: int) -> tuple[str, str, str] | None:
        found = [m for m in self.stub.ListModels(pb.ListModelsRequest(), timeout=10).models
                 if m.name == model and m.version == version]
        return (found[0].state, found[0].reason, found[0].variant) if found else None

    def settled(self, model: str, version: int) -> tuple[str, str, str]:
        wait_for(lambda: (self(model, version) or ("",))[0] in ("NOT_SERVING", "SERVING"), 60,
                 f"{model} version {version} loaded or refused")
        found = self(model, version)
        assert found is not None
        return found


@pytest.fixture()
def server(tiny_repository: Path, tmp_path: Path) -> Iterator[tuple[ServerProcess, Path, Status]]:
    repo = repository_with(tiny_repository, tmp_path / "repo", GPT, CLASSIFIER)
    with ServerProcess(repo, ["--poll-interval", "0.2", "--max-sequences", "4"]) as proc:
        status = Status(proc.address)
        yield proc, repo, status
        status.channel.close()


def _generate(status: Status) -> int:
    params = pb.GenerationParameters(max_new_tokens=2, ignore_eos=True, temperature=0.0)
    return status.stub.Generate(pb.GenerateRequest(model=GPT, prompt="The castle", parameters=params),
                                timeout=30).version


UNLISTED = {"model.mixed.onnx": tampered_mixed_graph, "tokenizer_config.json": unlisted_tokenizer_config}


@pytest.mark.parametrize("file", sorted(UNLISTED))
def test_an_unlisted_file_the_server_would_read_is_refused_by_name(
        server: tuple[ServerProcess, Path, Status], file: str) -> None:
    proc, repo, status = server
    publish(repo, GPT, 2, UNLISTED[file])
    state, reason, _ = status.settled(GPT, 2)
    assert state == "NOT_SERVING" and file in reason and "not listed" in reason, (file, state, reason)
    lines = [line for line in proc.lines if f"model {GPT} version 2 NOT_SERVING" in line]
    assert len(lines) == 1 and file in lines[0], lines
    assert status(GPT, 1)[:2] == ("SERVING", "") and _generate(status) == 1


def test_a_variant_serves_only_if_its_own_verdict_passed(server: tuple[ServerProcess, Path, Status]) -> None:
    proc, repo, status = server
    assert status(CLASSIFIER, 1) == ("SERVING", "", "int8")          # the package's CPU default
    # int8 refused by its own verdict: auto falls to the next variant that passed.
    publish(repo, CLASSIFIER, 2, variant_refused("int8"))
    assert status.settled(CLASSIFIER, 2) == ("SERVING", "", "fp32")
    # The decoder's only variant refused: nothing to serve, the reason names the variant and its status.
    publish(repo, GPT, 2, variant_refused("fp32"))
    state, reason, _ = status.settled(GPT, 2)
    assert state == "NOT_SERVING" and "fp32" in reason and REFUSED in reason, reason
    assert status(GPT, 1)[:2] == ("SERVING", "") and _generate(status) == 1


def test_an_explicit_variant_whose_verdict_failed_is_not_served(tiny_repository: Path, tmp_path: Path) -> None:
    repo = repository_with(tiny_repository, tmp_path / "repo", CLASSIFIER)
    with ServerProcess(repo, ["--poll-interval", "0.2", "--variant", "int8"]) as proc:
        status = Status(proc.address)
        assert status(CLASSIFIER, 1) == ("SERVING", "", "int8")
        publish(repo, CLASSIFIER, 2, variant_refused("int8"))
        state, reason, _ = status.settled(CLASSIFIER, 2)
        assert state == "NOT_SERVING" and "--variant int8" in reason and REFUSED in reason, reason
        assert status(CLASSIFIER, 1)[:2] == ("SERVING", "")
        assert not [line for line in proc.lines if "Traceback" in line]
        status.channel.close()


# ---------------------------------------------------------------------------- in process


def _package(path: Path):  # type: ignore[no-untyped-def]
    from server.repository.package import read_package
    return read_package(path, path.parent.name, int(path.name))


def _build(path: Path, variant: str = "auto"):  # type: ignore[no-untyped-def]
    from dataclasses import replace

    from server.repository.loading import build_model
    from server.runtime.metrics import Metrics
    from server.runtime.settings import ServerSettings
    from server.runtime.stats import ModelStats
    from server.runtime_config import runtime_config

    runtime = runtime_config(ServerSettings(repository=path.parent.parent, max_sequences=2))
    runtime = replace(runtime, session=replace(runtime.session, variant=variant))
    return build_model(path, path.parent.name, int(path.name), runtime, Metrics(), ModelStats())


@pytest.mark.parametrize("model", [CLASSIFIER, "tiny-fill-mask", GPT])
def test_export_lists_every_file_the_server_reads_for_every_variant(tiny_repository: Path, model: str) -> None:
    """A fresh package serves: parity.json lists each variant's graphs (a decoder's mixed twin too), tokenizer.json
    and tokenizer_config.json, and every variant's own verdict passed."""
    from server.repository.served_files import refused_variants, served_files

    package = _package(tiny_repository / model / "1")
    listed = set(package.parity["files"])
    for variant in package.manifest.variants:
        assert set(served_files(package, variant)) <= listed, (variant, served_files(package, variant), listed)
    assert "tokenizer_config.json" in served_files(package, "fp32")
    if model == GPT:
        assert "model.mixed.onnx" in served_files(package, "fp32")
    assert refused_variants(package) == {}


def test_a_graph_naming_unlisted_external_data_is_refused(tiny_repository: Path, tmp_path: Path) -> None:
    """onnxruntime opens a graph's external data beside it: a listed graph rewritten to keep its weights in an
    unlisted file is refused naming that file; listed with its sha256, it loads."""
    from server.repository.package import PackageError

    path = tmp_path / CLASSIFIER / "2"
    shutil.copytree(tiny_repository / CLASSIFIER / "1", path)
    onnx.save_model(onnx.load(str(path / "model.onnx")), str(path / "model.onnx"), save_as_external_data=True,
                    location="weights.bin", size_threshold=1024)
    parity = json.loads((path / "parity.json").read_text())
    parity["files"]["model.onnx"] = _sha256(path / "model.onnx")
    (path / "parity.json").write_text(json.dumps(parity))
    with pytest.raises(PackageError, match="weights.bin is not listed in parity.json files"):
        _build(path, "fp32")
    parity["files"]["weights.bin"] = _sha256(path / "weights.bin")
    (path / "parity.json").write_text(json.dumps(parity))
    assert _build(path, "fp32").variant == "fp32"


def _sha256(path: Path) -> str:
    import hashlib
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_choose_variant_passes_over_refused_variants(tiny_repository: Path) -> None:
    from server.repository.package import PackageError
    from server.sessions import choose_variant

    manifest = _package(tiny_repository / CLASSIFIER / "1").manifest      # int8 (the CPU default), fp32
    why = {"int8": f"its parity verdict is {REFUSED!r}"}
    assert choose_variant(manifest, "auto", "cpu") == "int8"
    assert choose_variant(manifest, "auto", "cpu", why) == "fp32"
    assert choose_variant(manifest, "fp32", "cpu", why) == "fp32"
    with pytest.raises(PackageError, match=r"--variant int8: its parity verdict is 'refused: top-1"):
        choose_variant(manifest, "int8", "cpu", why)
    with pytest.raises(PackageError, match=r"no variant usable on cpu .*refused by parity.json: fp32: no verdict"):
        choose_variant(manifest, "auto", "cpu", {**why, "fp32": "no verdict"})


def test_external_data_of_a_file_that_is_not_a_graph_is_none(tiny_repository: Path, tmp_path: Path) -> None:
    """The external-data reader never raises: a truncated graph, bytes that are no protobuf, JSON, an empty file
    name none (onnxruntime's load then says what is wrong); a self-contained graph names none either."""
    from server.repository.external_data import external_data_files

    graph = (tiny_repository / GPT / "1" / "model.mixed.onnx").read_bytes()
    cases = {"cut-10": graph[:10], "cut-half": graph[: len(graph) // 2], "cut-3": graph[:-3], "junk": b"\xff" * 100,
             "nested": b"\x3a\x05" * 3, "json": b'{"a": 1}', "empty": b""}
    for name, data in cases.items():
        (tmp_path / name).write_bytes(data)
        assert external_data_files(tmp_path / name) == [], name
    assert external_data_files(tiny_repository / GPT / "1" / "model.mixed.onnx") == []
    assert external_data_files(tmp_path / "missing.onnx") == []


# ---------------------------------------------------------------------------- the probe: a variant checked where it serves


def probe_answered_otherwise(variant: str, kind: str = "answer") -> Callable[[Path], None]:
    """The variant's recorded probe answer (or an encoder-decoder's recorded encoder output: kind "encoder") scaled
    by 1.5 and listed with its new sha256: to the server, exactly what a CPU whose kernels compute that variant
    otherwise (the int8 saturation of issue 40 item 8) looks like."""
    def apply(p: Path) -> None:
        from modelpkg import sha256_file

        with np.load(p / "probe.npz", allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
        arrays[f"{kind}.{variant}"] = arrays[f"{kind}.{variant}"] * 1.5
        with open(p / "probe.npz", "wb") as f:
            np.savez(f, **arrays)
        _edit_json(p / "parity.json", lambda r: r["files"].update({"probe.npz": sha256_file(p / "probe.npz")}))
    return apply


@pytest.mark.parametrize("model", [CLASSIFIER, "tiny-fill-mask", GPT])
def test_every_cpu_variant_answers_its_probe_as_it_did_at_export(tiny_repository: Path, model: str) -> None:
    """Export records each CPU variant's answer to the probe (an encoder's padded batch, a decoder's first prompt
    with its cache zeroed); loaded here, each answers it within the tolerance, so none is passed over."""
    from server.repository.probe import probe_mismatch
    from server.sessions import create_session
    from server.runtime.settings import ServerSettings
    from server.runtime_config import runtime_config

    package = _package(tiny_repository / model / "1")
    probe = package.parity["probe"]
    assert probe["file"] in package.parity["files"] and set(probe["variants"]) == set(package.manifest.variants)
    session_config = runtime_config(ServerSettings(repository=tiny_repository)).session
    for variant in probe["variants"]:
        assert probe_mismatch(package, variant, create_session(package, variant, session_config)) is None, variant
    assert _build(tiny_repository / model / "1").notes == ()


def test_a_variant_answering_otherwise_here_is_passed_over_or_refused_by_name(tiny_repository: Path,
                                                                            tmp_path: Path) -> None:
    from server.repository.package import PackageError

    path = tmp_path / CLASSIFIER / "2"
    shutil.copytree(tiny_repository / CLASSIFIER / "1", path)
    probe_answered_otherwise("int8")(path)
    model = _build(path)
    assert model.variant == "fp32" and len(model.notes) == 1
    assert model.notes[0].startswith("variant int8 not served: its probe answers differently on this CPU")
    with pytest.raises(PackageError) as info:
        _build(path, "int8")
    assert str(info.value).startswith("--variant int8: its probe answers differently on this CPU")


def test_a_served_version_says_which_variant_it_passed_over(server: tuple[ServerProcess, Path, Status]) -> None:
    proc, repo, status = server
    publish(repo, CLASSIFIER, 2, probe_answered_otherwise("int8"))
    state, reason, variant = status.settled(CLASSIFIER, 2)
    assert (state, variant) == ("SERVING", "fp32") and reason.startswith("variant int8 not served: its probe"), reason
    assert any("variant int8 not served" in line for line in proc.lines)


# ---------------------------------------------------------------------------- an encoder-decoder's probe


@pytest.fixture(scope="module")
def seq2seq_package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small random Marian exported with fp32 and int8 (testing/seq2seq_checkpoints.py). READ-ONLY."""
    torch = pytest.importorskip("torch")
    from export import ExportConfig, export_checkpoint
    from testing.seq2seq_checkpoints import write_checkpoint

    root = tmp_path_factory.mktemp("s2s-probe")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return export_checkpoint(ExportConfig(checkpoint=write_checkpoint("marian", root / "ckpt"), task="generate",
                                              repository=root / "repo", name="marian",
                                              variants=("fp32", "int8"))).package_dir
    finally:
        torch.set_num_threads(before)


def _default_and_other(package: Path) -> tuple[str, str]:
    manifest = json.loads((package / "model.json").read_text())
    default = manifest["default_variant"]["cpu"]
    return default, next(v for v in manifest["variants"] if v != default)


def test_an_encoder_decoder_records_its_encoder_and_decoder_answers_and_answers_them_here(
        seq2seq_package: Path) -> None:
    """Export records, for each CPU variant, the encoder's output on a padded source batch and the decoder's logits
    of a first call and one step on that variant's own encoder output; loaded here, each answers within the
    tolerance, and the probe is among the files parity.json lists with their sha256."""
    from modelpkg import sha256_file
    from server.repository.probe import probe_mismatch
    from server.repository.served_files import served_files
    from server.runtime.settings import ServerSettings
    from server.runtime_config import runtime_config
    from server.sessions import create_session

    package = _package(seq2seq_package)
    probe = package.parity["probe"]
    assert set(probe["variants"]) == {"fp32", "int8"} and probe["file"] == "probe.npz"
    assert package.parity["files"]["probe.npz"] == sha256_file(seq2seq_package / "probe.npz")
    with np.load(seq2seq_package / "probe.npz", allow_pickle=False) as data:
        arrays = {k: data[k] for k in data.files}
    spec = package.manifest.encoder_decoder
    rows, width = arrays["feed.input_ids"].shape
    assert rows > 1 and (arrays["feed.attention_mask"].sum(axis=1) < width).any()     # a padded batch
    assert arrays["target.input_ids"].shape == (rows, 3)
    assert (arrays["target.input_ids"][:, 0] == spec.decoder_start_token_id).all()
    for variant in ("fp32", "int8"):
        assert "probe.npz" in served_files(package, variant)
        assert arrays[f"encoder.{variant}"].shape == (rows, spec.num_heads, width, spec.head_dim)
        assert arrays[f"answer.{variant}"].shape == (rows, 3, spec.target_vocab_size)
        assert np.abs(arrays[f"answer.{variant}"]).max() > 0
    config = runtime_config(ServerSettings(repository=seq2seq_package.parent.parent)).session
    for variant in ("fp32", "int8"):
        def open_graph(graph: str, variant: str = variant):  # type: ignore[no-untyped-def]
            return create_session(package, variant, config, graph)
        assert probe_mismatch(package, variant, create_session(package, variant, config), open_graph) is None
    assert _build(seq2seq_package).notes == ()


@pytest.mark.parametrize("kind,what", [("encoder", "its encoder's output"), ("answer", "its answer")])
def test_an_encoder_decoder_variant_answering_otherwise_is_passed_over_by_name(
        seq2seq_package: Path, tmp_path: Path, kind: str, what: str) -> None:
    from server.repository.package import PackageError

    default, other = _default_and_other(seq2seq_package)
    path = tmp_path / "marian" / "2"
    shutil.copytree(seq2seq_package, path)
    probe_answered_otherwise(default, kind)(path)
    model = _build(path)
    assert model.variant == other and len(model.notes) == 1, model.notes
    assert model.notes[0].startswith(f"variant {default} not served: its probe answers differently on this CPU "
                                     f"({what}: largest difference"), model.notes
    with pytest.raises(PackageError, match=f"--variant {default}: its probe answers differently on this CPU"):
        _build(path, default)


def test_a_served_encoder_decoder_says_which_variant_it_passed_over(seq2seq_package: Path, tmp_path: Path) -> None:
    """Through a real server: the fresh package serves its default variant with no reason; a copy whose recorded
    answer for that variant was rewritten (its sha256 too) serves the other, saying why, and translates."""
    default, other = _default_and_other(seq2seq_package)
    repo = tmp_path / "repo"
    shutil.copytree(seq2seq_package, repo / "marian" / "1")
    with ServerProcess(repo, ["--poll-interval", "0.2", "--max-sequences", "4"]) as proc:
        status = Status(proc.address)
        assert status.settled("marian", 1) == ("SERVING", "", default)
        publish(repo, "marian", 2, probe_answered_otherwise(default))
        state, reason, variant = status.settled("marian", 2)
        assert (state, variant) == ("SERVING", other), (state, variant, reason)
        assert reason.startswith(f"variant {default} not served: its probe answers differently on this CPU"), reason
        assert any(f"variant {default} not served" in line for line in proc.lines)
        params = pb.GenerationParameters(max_new_tokens=3, ignore_eos=True, temperature=0.0)
        reply = status.stub.Generate(pb.GenerateRequest(model="marian", prompt="hello world", parameters=params),
                                     timeout=30)
        assert reply.version == 2 and reply.usage.completion_tokens == 3
        status.channel.close()
