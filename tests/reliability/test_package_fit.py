"""Packages whose parts do not belong together are refused at load (issue 25, kind 4; server/repository/consistency.py).

Every broken package here has hashes that match (parity.json is recomputed after the edit): only its content
disagrees with itself. Each was served before the load-time checks: a decoder with another model's tokenizer.json
went SERVING and answered INTERNAL (`Gather idx=... must be within [-400, 399]`), an empty vocabulary answered
empty text, a model.json max_length beyond the graph's positions failed long inputs inside the graph, and one of
10**10 broke ModelInfo (int32).

- in process: `build_model` on each package raises PackageError naming what does not fit; the good ones build;
- a real server: each bad package published as the next version over a good version 1 while clients keep
  generating and classifying: it goes NOT_SERVING with its reason, logged on ONE line, and version 1 answers
  every request.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import grpc
import pytest
from tests.server_process import ServerProcess, repository_with

from protos import ortserve_pb2 as pb
from protos import ortserve_pb2_grpc as pb_grpc
from testing.launch import wait_for

CLASSIFIER, FILL_MASK, GPT = "tiny-classifier", "tiny-fill-mask", "tiny-gpt"


def rehash(package: Path) -> None:
    """parity.json's sha256 of every listed file made to match the (edited) files."""
    parity = json.loads((package / "parity.json").read_text())
    for name in parity["files"]:
        parity["files"][name] = hashlib.sha256((package / name).read_bytes()).hexdigest()
    (package / "parity.json").write_text(json.dumps(parity))


def edit_json(path: Path, change: Callable[[dict], None]) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def _shift_vocabulary(tokenizer: dict) -> None:
    """Another model's vocabulary: the same tokens at ids 400 higher (special tokens stay)."""
    special = {t["id"] for t in tokenizer["added_tokens"]}
    vocab = tokenizer["model"]["vocab"]
    tokenizer["model"]["vocab"] = {tok: (i if i in special else i + 400) for tok, i in vocab.items()}


def foreign_vocabulary(p: Path) -> None:
    edit_json(p / "tokenizer.json", _shift_vocabulary)


def empty_vocabulary(p: Path) -> None:
    def empty(tokenizer: dict) -> None:
        tokenizer["model"]["vocab"], tokenizer["model"]["merges"] = {}, []
    edit_json(p / "tokenizer.json", empty)


def same_size_foreign_tokenizer(source: Path) -> Callable[[Path], None]:
    """The classifier's WordPiece tokenizer.json (also 400 tokens) in the GPT package."""
    def apply(p: Path) -> None:
        shutil.copyfile(source / "tokenizer.json", p / "tokenizer.json")
    return apply


def manifest(**changes: Any) -> Callable[[Path], None]:
    def apply(p: Path) -> None:
        edit_json(p / "model.json", lambda m: m.update(changes))
    return apply


# name -> (model, how it is broken, a phrase of the reason)
CASES: dict[str, tuple[str, Callable[[Path], None] | str, str]] = {
    "gpt-foreign-vocabulary": (GPT, foreign_vocabulary, "outside the graph's vocabulary of 400 (model.json vocab_size)"),
    "gpt-empty-vocabulary": (GPT, empty_vocabulary, "tokenizer.json: its vocabulary is empty"),
    "gpt-same-size-tokenizer": (GPT, "wordpiece", "tokenizer_config.json names unk_token '<|endoftext|>'"),
    "gpt-max-length-beyond-positions": (GPT, manifest(max_length=512),
                                        "model.json max_length 512: position 511 fails in the graph"),
    "gpt-vocab-size-beyond-graph": (GPT, manifest(vocab_size=1000), "logits have shape"),
    "classifier-max-length-int32": (CLASSIFIER, manifest(max_length=10 ** 10),
                                    "model.json: max_length must be in 1..2147483647"),
    "classifier-max-length-beyond-positions": (CLASSIFIER, manifest(max_length=1000),
                                               "model.json max_length 1000: the graph fails on a sequence of 256"),
    "classifier-foreign-vocabulary": (CLASSIFIER, foreign_vocabulary, "outside the graph's vocabulary of 400"),
    "classifier-vocab-size-beyond-graph": (CLASSIFIER, manifest(vocab_size=1000),
                                           "model.json vocab_size 1000: token id 999 fails in the graph"),
    "fill-mask-mask-token-missing": (FILL_MASK, manifest(mask_token="[MSK]"),
                                     "model.json mask_token: '[MSK]' is not a token of tokenizer.json"),
    "fill-mask-special-token-missing": (FILL_MASK, manifest(special_tokens={"pad": 0, "unk": 1, "cls": 2, "sep": 3,
                                                                            "mask": 4, "eos": 5000}),
                                        "model.json special_tokens.eos: id 5000 is not a token of tokenizer.json"),
}


def broken_copy(repository: Path, model: str, case: str, dest: Path) -> Path:
    shutil.copytree(repository / model / "1", dest)
    how = CASES[case][1]
    if how == "wordpiece":
        how = same_size_foreign_tokenizer(repository / CLASSIFIER / "1")
    how(dest)
    rehash(dest)
    return dest


# ---------------------------------------------------------------------------- in process

def _build(path: Path, name: str) -> Any:
    from server.runtime_config import runtime_config
    from server.repository.loading import build_model
    from server.runtime.metrics import Metrics
    from server.runtime.settings import ServerSettings
    from server.runtime.stats import ModelStats

    runtime = runtime_config(ServerSettings(repository=path.parent, max_sequences=2))
    return build_model(path, name, 2, runtime, Metrics(), ModelStats())


@pytest.mark.parametrize("model", [CLASSIFIER, FILL_MASK, GPT])
def test_the_good_packages_pass_the_checks(tiny_repository: Path, model: str) -> None:
    assert _build(tiny_repository / model / "1", model).task


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_package_whose_parts_disagree_is_refused_naming_what(tiny_repository: Path, tmp_path: Path,
                                                               case: str) -> None:
    from server.repository.package import PackageError

    model, _, phrase = CASES[case]
    path = broken_copy(tiny_repository, model, case, tmp_path / model / "2")
    with pytest.raises(PackageError) as info:
        _build(path, model)
    assert phrase in str(info.value) and "\n" not in str(info.value), str(info.value)


# ---------------------------------------------------------------------------- a server publishing them

SERVER_CASES = ["gpt-foreign-vocabulary", "gpt-empty-vocabulary", "gpt-same-size-tokenizer",
                "gpt-max-length-beyond-positions", "classifier-max-length-int32",
                "classifier-max-length-beyond-positions", "classifier-foreign-vocabulary"]
# Prompts whose tokens cover the vocabulary's upper half (with another model's ids they would be 400 higher)
# and a text long enough to reach positions the claimed max_length would allow.
PROMPT = "The castle garden was quiet; a soldier walked by the river and the king's banner rose over the harbour."


class Clients:
    """Generation (a text prompt) and classification in loops, each answer's version recorded, every failure kept."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.versions: dict[str, list[int]] = {GPT: [], CLASSIFIER: []}
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(m,)) for m in (GPT, CLASSIFIER, GPT)]

    def _one(self, stub: pb_grpc.TaskServiceStub, model: str, i: int) -> int:
        if model == GPT:
            params = pb.GenerationParameters(max_new_tokens=4, ignore_eos=True, temperature=0.0)
            response = stub.Generate(pb.GenerateRequest(model=GPT, prompt=f"{PROMPT} {i}", parameters=params),
                                     timeout=30)
            assert len(response.tokens) == 4
            return response.version
        text = (PROMPT + " ") * 3   # ~100 tokens: within the real 128 positions
        response = stub.Classify(pb.ClassifyRequest(model=CLASSIFIER, inputs=[pb.TextInput(text=text)]), timeout=30)
        stub.ModelInfo(pb.ModelInfoRequest(model=CLASSIFIER), timeout=30)
        return response.version

    def _run(self, model: str) -> None:
        with grpc.insecure_channel(self.address) as channel:
            stub = pb_grpc.TaskServiceStub(channel)
            i = 0
            while not self._stop.is_set():
                i += 1
                try:
                    self.versions[model].append(self._one(stub, model, i))
                except Exception as exc:  # noqa: BLE001 - every failure is reported at the end
                    self.failures.append(f"{model}: {exc!r}"[:300])
                time.sleep(0.01)

    def __enter__(self) -> "Clients":
        for t in self._threads:
            t.start()
        wait_for(lambda: all(len(v) > 3 for v in self.versions.values()), 30, "clients running on version 1")
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=30)




@pytest.fixture()
def publishing(tiny_repository: Path, tmp_path: Path) -> Iterator[tuple[ServerProcess, Path]]:
    repo = repository_with(tiny_repository, tmp_path / "repo", GPT, CLASSIFIER)
    with ServerProcess(repo, ["--poll-interval", "0.2", "--max-sequences", "4"]) as proc:
        yield proc, repo


def test_a_bad_version_published_over_a_good_one_is_refused_and_the_good_one_serves_on(
        tiny_repository: Path, publishing: tuple[ServerProcess, Path]) -> None:
    proc, repo = publishing
    next_version = {GPT: 2, CLASSIFIER: 2}
    refused_in: list[float] = []
    with Clients(proc.address) as clients, grpc.insecure_channel(proc.address) as channel:
        stub = pb_grpc.TaskServiceStub(channel)

        def status(model: str, version: int) -> tuple[str, str] | None:
            found = [m for m in stub.ListModels(pb.ListModelsRequest(), timeout=10).models
                     if m.name == model and m.version == version]
            return (found[0].state, found[0].reason) if found else None

        for case in SERVER_CASES:
            model, _, phrase = CASES[case]
            version = next_version[model]
            next_version[model] += 1
            staging = repo / model / ".tmp-publish"      # published the way export does: write, then rename
            broken_copy(tiny_repository, model, case, staging)
            os.rename(staging, repo / model / str(version))
            published = time.monotonic()
            wait_for(lambda: (status(model, version) or ("",))[0] in ("NOT_SERVING", "SERVING"), 60,
                     f"{case}: version {version} loaded or refused")
            state, reason = status(model, version)
            refused_in.append(time.monotonic() - published)
            assert state == "NOT_SERVING" and phrase in reason, (case, state, reason)
            # ONE log line names it (no traceback), and version 1 is still the one serving.
            lines = [line for line in proc.lines if f"model {model} version {version} NOT_SERVING" in line]
            assert len(lines) == 1 and phrase in lines[0], lines
            assert status(model, 1) == ("SERVING", "")
            marks = {m: len(v) for m, v in clients.versions.items()}
            wait_for(lambda: all(len(v) > marks[m] + 2 for m, v in clients.versions.items()), 30, "traffic goes on")
    assert not clients.failures, clients.failures[:5]
    assert all(set(v) == {1} for v in clients.versions.values()), {m: set(v) for m, v in clients.versions.items()}
    assert not [line for line in proc.lines if "Traceback" in line]
    print(f"\n{len(SERVER_CASES)} bad versions refused, each {min(refused_in):.2f}-{max(refused_in):.2f}s after "
          f"publication (poll 0.2 s); requests answered by version 1: "
          f"{ {m: len(v) for m, v in clients.versions.items()} }, failed: {len(clients.failures)}")
