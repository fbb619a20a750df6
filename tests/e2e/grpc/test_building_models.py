"""Models the deploy pipeline is still building are listed with their stage and refused as UNAVAILABLE naming it
(issue 41): the first run serves at once and each model joins when it passes its gate. The pipeline's side (it writes
`<repository>/<name>/.building.json`, modelpkg.building) is tests/pipeline/test_deploy_chain.py; here a real server
reads such a status written as the pipeline writes it."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import grpc
import httpx2 as httpx
import pytest

from modelpkg import Building, clear_building, write_building
from protos import grpc_service_pb2 as kserve_pb
from protos import grpc_service_pb2_grpc as kserve_grpc
from protos import ortserve_pb2 as pb
from protos import ortserve_pb2_grpc as pb_grpc
from testing.launch import wait_for
from tests.server_process import ServerProcess, repository_with

CLASSIFIER, SOON = "tiny-classifier", "genre"


def test_a_model_being_built_is_listed_with_its_stage_and_refused_naming_it(tiny_repository: Path,
                                                                          tmp_path: Path) -> None:
    repo = repository_with(tiny_repository, tmp_path / "repo", CLASSIFIER)
    write_building(repo / SOON, Building(task="classify", stage="training", progress=0.42, log="artifacts/logs/genre.log"))
    with ServerProcess(repo, ["--poll-interval", "0.2", "--http-port", "0"]) as server, \
            grpc.insecure_channel(server.address) as channel:
        stub, kserve = pb_grpc.TaskServiceStub(channel), kserve_grpc.GRPCInferenceServiceStub(channel)
        stage = "training 42% (log: artifacts/logs/genre.log)"
        listed = {m.name: m for m in stub.ListModels(pb.ListModelsRequest(), timeout=10).models}
        assert (listed[SOON].state, listed[SOON].version, listed[SOON].task, listed[SOON].reason) == \
            ("BUILDING", 0, "classify", stage)
        assert listed[CLASSIFIER].state == "SERVING"
        info = stub.ModelInfo(pb.ModelInfoRequest(model=SOON), timeout=10)
        assert (info.status.state, info.status.reason) == ("BUILDING", stage)
        with pytest.raises(grpc.RpcError) as refused:
            stub.Classify(pb.ClassifyRequest(model=SOON, inputs=[pb.TextInput(text="x")]), timeout=10)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        assert refused.value.details() == f"model 'genre' is being built: {stage}"
        index = kserve.RepositoryIndex(kserve_pb.RepositoryIndexRequest(), timeout=10).models
        assert [(m.name, m.state) for m in index if m.name == SOON] == [(SOON, "BUILDING")]
        http = httpx.Client(base_url=server.http_url, timeout=10)
        models = {m["id"]: m for m in http.get("/v1/models").json()["data"]}
        assert models[SOON]["state"] == "BUILDING" and models[SOON]["stage"] == stage
        answer = http.post("/v2/models/genre/infer", json={"inputs": [
            {"name": "text", "shape": [1], "datatype": "BYTES", "data": ["x"]}]})
        assert answer.status_code == 503 and "is being built: training 42%" in answer.text, answer.text
        # The stage moves on; then the package is published (staged, renamed) and the status removed: it serves.
        write_building(repo / SOON, Building(task="classify", stage="exporting", log="artifacts/logs/genre.log"))
        wait_for(lambda: _reason(stub, SOON) == "exporting (log: artifacts/logs/genre.log)", 10, "the new stage")
        staging = repo / SOON / ".tmp-publish"
        shutil.copytree(repo / CLASSIFIER / "1", staging)
        os.rename(staging, repo / SOON / "1")
        clear_building(repo / SOON)
        wait_for(lambda: _state(stub, SOON) == "SERVING", 30, "the published model to serve")
        answer = stub.Classify(pb.ClassifyRequest(model=SOON, inputs=[pb.TextInput(text="x")]), timeout=10)
        assert answer.version == 1
        assert "BUILDING" not in {m.state for m in stub.ListModels(pb.ListModelsRequest(), timeout=10).models}
        http.close()


def _status(stub: pb_grpc.TaskServiceStub, name: str) -> pb.ModelStatus | None:
    found = [m for m in stub.ListModels(pb.ListModelsRequest(), timeout=10).models if m.name == name]
    return found[-1] if found else None


def _reason(stub: pb_grpc.TaskServiceStub, name: str) -> str:
    status = _status(stub, name)
    return status.reason if status is not None else ""


def _state(stub: pb_grpc.TaskServiceStub, name: str) -> str:
    status = _status(stub, name)
    return status.state if status is not None else ""
