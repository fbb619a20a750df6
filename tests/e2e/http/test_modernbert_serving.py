"""ModernBERT packages served by a real server process through every door, against transformers and
sentence-transformers on the same checkpoints (tests/modernbert_models.py: local window of 8, texts longer than it):

- the task API over gRPC: Classify, FillMask, TokenClassify, Embed;
- KServe v2 over gRPC (ModelInfer, raw tensors of a padded batch) and REST (/v2/models/{m}/infer, JSON tensors);
- HTTP: /v1/embeddings, /v1/token-classify.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

import grpc
import httpx2 as httpx
import numpy as np
import pytest
from tests.modernbert_models import (LABELS, TAGS, TEXTS, build_checkpoints, hf_logits, padded_batch,
                                     st_embeddings)
from tests.server_process import ServerProcess
from tritonclient.grpc import service_pb2 as kserve_pb, service_pb2_grpc as kserve_grpc

from tokenizers import Tokenizer

from protos import ortserve_pb2 as pb
from protos import ortserve_pb2_grpc as pb_grpc

pytest.importorskip("transformers")

TASKS = {"mb-classify": "classify", "mb-fill-mask": "fill-mask", "mb-token-classify": "token-classify",
         "mb-embed": "embed"}


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return build_checkpoints(tmp_path_factory.mktemp("modernbert"))


@pytest.fixture(scope="module")
def server(checkpoints, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, grpc.Channel]]:
    """The four packages exported, a server on them (HTTP door too) and a gRPC channel to it."""
    from tests.conftest import one_torch_thread
    from export import ExportConfig, export_checkpoint

    repo = tmp_path_factory.mktemp("modernbert-serving")
    with one_torch_thread():
        for name, task in TASKS.items():
            extra = {"pooling": "cls", "normalize": "on"} if task == "embed" else {}
            export_checkpoint(ExportConfig(checkpoint=checkpoints[task], task=task, repository=repo, name=name,
                                           **extra))
    with ServerProcess(repo, ["--http-port", "0", "--max-queue-delay-ms", "2"]) as proc:
        with grpc.insecure_channel(proc.address) as channel:
            yield proc, channel


def test_task_api_answers_equal_transformers(server, checkpoints) -> None:
    stub = pb_grpc.TaskServiceStub(server[1])
    got = stub.Classify(pb.ClassifyRequest(model="mb-classify", inputs=[pb.TextInput(text=t) for t in TEXTS]))
    want = _softmax(hf_logits(checkpoints["classify"], "classify",
                              padded_batch(checkpoints["classify"], TEXTS)).numpy())
    for res, probs in zip(got.results, want, strict=True):
        served = {s.label: s.score for s in res.scores}
        np.testing.assert_allclose([served[lab] for lab in LABELS], probs, atol=1e-4)

    ckpt = checkpoints["fill-mask"]
    text = TEXTS[0].replace("winter", "[MASK]")
    feeds = padded_batch(ckpt, [text])
    mask_id = Tokenizer.from_file(str(ckpt / "tokenizer.json")).token_to_id("[MASK]")
    pos = feeds["input_ids"][0].tolist().index(mask_id)
    probs = _softmax(hf_logits(ckpt, "fill-mask", feeds)[0, pos].numpy())
    res = stub.FillMask(pb.FillMaskRequest(model="mb-fill-mask", texts=[text], top_k=3))
    [masked] = res.results[0].masks
    assert masked.position == pos
    assert [c.token_id for c in masked.candidates] == list(np.argsort(-probs)[:3])
    np.testing.assert_allclose([c.score for c in masked.candidates], np.sort(probs)[::-1][:3], rtol=1e-4, atol=1e-6)

    res = stub.TokenClassify(pb.TokenClassifyRequest(model="mb-token-classify", texts=TEXTS, keep_all_labels=True))
    assert list(res.labels) == TAGS
    ckpt = checkpoints["token-classify"]
    probs = _softmax(hf_logits(ckpt, "token-classify", padded_batch(ckpt, TEXTS)).numpy())
    for row, answer in zip(probs, res.results, strict=True):
        assert answer.entities
        for e in answer.entities:
            assert e.label == TAGS[int(row[e.index].argmax())]
            assert abs(e.score - float(row[e.index].max())) <= 1e-4

    emb = stub.Embed(pb.EmbedRequest(model="mb-embed", texts=TEXTS))
    want = st_embeddings(checkpoints["embed"], "cls", True, TEXTS)
    np.testing.assert_allclose(np.array([list(e.values) for e in emb.embeddings]), want, atol=1e-4)


def test_kserve_raw_tensors_over_grpc_and_rest(server, checkpoints) -> None:
    """A padded batch (pad rows beyond the window of every real token included) as raw tensors: the graph's logits
    at every position equal transformers'."""
    ckpt = checkpoints["fill-mask"]
    feeds = {k: v.numpy() for k, v in padded_batch(ckpt, TEXTS).items()}
    want = hf_logits(ckpt, "fill-mask", padded_batch(ckpt, TEXTS)).numpy()
    req = kserve_pb.ModelInferRequest(model_name="mb-fill-mask")
    for name, value in feeds.items():
        req.inputs.add(name=name, datatype="INT64", shape=list(value.shape))
        req.raw_input_contents.append(value.tobytes())
    out = kserve_grpc.GRPCInferenceServiceStub(server[1]).ModelInfer(req)
    got = np.frombuffer(out.raw_output_contents[0], dtype=np.float32).reshape(out.outputs[0].shape)
    assert float(np.abs(got - want).max()) <= 1e-4

    ckpt = checkpoints["classify"]
    feeds = {k: v.numpy() for k, v in padded_batch(ckpt, TEXTS).items()}
    body = {"inputs": [{"name": n, "datatype": "INT64", "shape": list(v.shape), "data": v.ravel().tolist()}
                       for n, v in feeds.items()]}
    answer = httpx.post(f"{server[0].http_url}/v2/models/mb-classify/infer", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    [logits] = answer.json()["outputs"]
    got = np.array(logits["data"], dtype=np.float32).reshape(logits["shape"])
    assert float(np.abs(got - hf_logits(ckpt, "classify", padded_batch(ckpt, TEXTS)).numpy()).max()) <= 1e-4


def test_http_routes_answer_as_the_references(server, checkpoints) -> None:
    with httpx.Client(base_url=server[0].http_url, timeout=60) as http:
        answer = http.post("/v1/embeddings", json={"model": "mb-embed", "input": TEXTS})
        assert answer.status_code == 200, answer.text
        got = np.array([d["embedding"] for d in sorted(answer.json()["data"], key=lambda d: d["index"])])
        np.testing.assert_allclose(got, st_embeddings(checkpoints["embed"], "cls", True, TEXTS), atol=1e-4)

        answer = http.post("/v1/token-classify", json={"model": "mb-token-classify", "inputs": TEXTS,
                                                      "ignore_labels": []})
        assert answer.status_code == 200, answer.text
        ckpt = checkpoints["token-classify"]
        probs = _softmax(hf_logits(ckpt, "token-classify", padded_batch(ckpt, TEXTS)).numpy())
        for row, entities in zip(probs, answer.json()["results"], strict=True):
            assert entities
            for e in entities:
                assert e["entity"] == TAGS[int(row[e["index"]].argmax())]
                assert abs(e["score"] - float(row[e["index"]].max())) <= 1e-4
