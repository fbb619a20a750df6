"""XLM-RoBERTa packages served by one real server process through every door, against `transformers` on the same
checkpoints (tests/xlmr_models.py: random XLMRoberta* models, a Unigram tokenizer in XLMRobertaTokenizerFast's
layout, pairs as `<s> A </s></s> B </s>` without token types):

- the task API over gRPC: Classify (text pairs), Rerank (a one-label cross-encoder), FillMask, TokenClassify, Embed;
- KServe v2 over gRPC and REST: text mode (text + text_pair) and raw tensors of a padded batch;
- HTTP: /v1/classify (pairs), /v1/rerank, /v1/embeddings, /v1/token-classify.

Every reference is transformers' model on ids from transformers' own tokenizer of the checkpoint.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

import grpc
import httpx2 as httpx
import numpy as np
import pytest
import torch
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp

from protos import ortserve_pb2 as pb
from protos import ortserve_pb2_grpc as pb_grpc
from tests.door_calls import triton_inputs
from tests.server_process import ServerProcess
from tests.xlmr_models import LABELS, TAGS, build_checkpoints, hf_feeds, hf_model

pytest.importorskip("transformers")

PAIRS = [("A horse! a horse! my kingdom for a horse!", "Withdraw, my lord."),
         ("Now is the winter of our discontent", "made glorious summer by this sun of York."),
         ("To be", "or not to be")]
QUERY = "the king and his crown"
DOCUMENTS = ["Now is the winter of our discontent", "the castle of the king", "To be, or not to be", "a horse"]
MASKED = "Now is the <mask> of our discontent"
TEXTS = [a for a, _ in PAIRS]


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def _logits(ckpt: Path, task: str, feeds: dict[str, torch.Tensor]) -> np.ndarray:
    with torch.no_grad():
        out = hf_model(ckpt, task)(**feeds)
    return (out.last_hidden_state if task == "embed" else out.logits).numpy()


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return build_checkpoints(tmp_path_factory.mktemp("xlmr"))


@pytest.fixture(scope="module")
def server(checkpoints: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """The five packages (the cross-encoder exported as a one-label classifier), one server with the HTTP door."""
    from tests.conftest import one_torch_thread

    from export import ExportConfig, export_checkpoint

    repo = tmp_path_factory.mktemp("xlmr-repo")
    with one_torch_thread():
        for key, ckpt in checkpoints.items():
            task = "classify" if key == "rerank" else key
            extra = {"pooling": "mean", "normalize": "on"} if task == "embed" else {}
            export_checkpoint(ExportConfig(checkpoint=ckpt, task=task, repository=repo, name=f"xlmr-{key}", **extra))
    with ServerProcess(repo, ["--http-port", "0", "--max-queue-delay-ms", "2"]) as proc:
        yield proc


@pytest.fixture(scope="module")
def references(checkpoints: dict[str, Path]) -> dict[str, np.ndarray]:
    """transformers' answers: pair probabilities (one pair at a time: no padding at all), the cross-encoder's
    relevance per document, the fill-mask distribution at the mask, per-token tag probabilities and the mean-pooled,
    normalised vectors of TEXTS (padded batches)."""
    out = {"pairs": np.array([_softmax(_logits(checkpoints["classify"], "classify",
                                               hf_feeds(checkpoints["classify"], [a], [b]))[0]) for a, b in PAIRS])}
    rerank = checkpoints["rerank"]
    out["relevance"] = _sigmoid(_logits(rerank, "rerank", hf_feeds(rerank, [QUERY] * len(DOCUMENTS), DOCUMENTS))[:, 0])
    ckpt = checkpoints["fill-mask"]
    feeds = hf_feeds(ckpt, [MASKED])
    from transformers import AutoTokenizer

    out["mask_position"] = np.array(int((feeds["input_ids"][0] == AutoTokenizer.from_pretrained(ckpt).mask_token_id)
                                        .nonzero()[0, 0]))
    out["mask_probs"] = _softmax(_logits(ckpt, "fill-mask", feeds)[0, int(out["mask_position"])])
    ckpt = checkpoints["token-classify"]
    feeds = hf_feeds(ckpt, TEXTS)
    out["tags"] = _softmax(_logits(ckpt, "token-classify", feeds))
    out["real_tokens"] = feeds["attention_mask"].sum(1).numpy()
    feeds = hf_feeds(checkpoints["embed"], TEXTS)
    hidden = _logits(checkpoints["embed"], "embed", feeds)
    keep = feeds["attention_mask"].numpy()[..., None]
    mean = (hidden * keep).sum(1) / keep.sum(1)
    out["vectors"] = mean / np.linalg.norm(mean, axis=1, keepdims=True)
    assert np.abs(out["pairs"][0] - out["pairs"][1]).max() > 1e-3       # inputs move the answers
    alone = _softmax(_logits(checkpoints["classify"], "classify", hf_feeds(checkpoints["classify"], [PAIRS[0][0]])))
    assert np.abs(alone[0] - out["pairs"][0]).max() > 1e-3               # a dropped text_pair would show
    assert np.ptp(out["relevance"]) > 1e-3
    return out


def _check_tags(entities: list[tuple[int, str, float]], probs: np.ndarray, real: int) -> None:
    """Every token but <s> and </s> answered, each with transformers' best tag and its probability."""
    assert len(entities) == real - 2
    for index, label, score in entities:
        assert label == TAGS[int(probs[index].argmax())]
        assert abs(score - float(probs[index].max())) <= 1e-4


def test_task_api_over_grpc_answers_as_transformers(server: ServerProcess, references) -> None:
    with grpc.insecure_channel(server.address) as channel:
        stub = pb_grpc.TaskServiceStub(channel)
        got = stub.Classify(pb.ClassifyRequest(model="xlmr-classify",
                                               inputs=[pb.TextInput(text=a, text_pair=b) for a, b in PAIRS]))
        for res, probs in zip(got.results, references["pairs"], strict=True):
            served = {s.label: s.score for s in res.scores}
            np.testing.assert_allclose([served[lab] for lab in LABELS], probs, atol=1e-4)
            assert res.label == LABELS[int(probs.argmax())]

        ranked = stub.Rerank(pb.RerankRequest(model="xlmr-rerank", query=QUERY, documents=DOCUMENTS))
        want = references["relevance"]
        assert [r.index for r in ranked.results] == list(np.argsort(-want, kind="stable"))
        np.testing.assert_allclose([r.score for r in ranked.results], np.sort(want)[::-1], atol=1e-5)

        res = stub.FillMask(pb.FillMaskRequest(model="xlmr-fill-mask", texts=[MASKED], top_k=3))
        [masked] = res.results[0].masks
        probs = references["mask_probs"]
        assert masked.position == int(references["mask_position"])
        assert [c.token_id for c in masked.candidates] == list(np.argsort(-probs)[:3])
        np.testing.assert_allclose([c.score for c in masked.candidates], np.sort(probs)[::-1][:3], rtol=1e-4,
                                   atol=1e-6)

        res = stub.TokenClassify(pb.TokenClassifyRequest(model="xlmr-token-classify", texts=TEXTS,
                                                         keep_all_labels=True))
        assert list(res.labels) == TAGS
        for answer, probs, real in zip(res.results, references["tags"], references["real_tokens"], strict=True):
            _check_tags([(e.index, e.label, e.score) for e in answer.entities], probs, int(real))

        emb = stub.Embed(pb.EmbedRequest(model="xlmr-embed", texts=TEXTS))
        np.testing.assert_allclose(np.array([list(e.values) for e in emb.embeddings]), references["vectors"],
                                   atol=1e-4)


def test_kserve_text_mode_and_raw_tensors_over_grpc_and_rest(server: ServerProcess, checkpoints, references) -> None:
    texts = {"text": np.array([a.encode() for a, _ in PAIRS], dtype=object),
             "text_pair": np.array([b.encode() for _, b in PAIRS], dtype=object)}
    grpc_client = tgrpc.InferenceServerClient(server.address)
    rest = thttp.InferenceServerClient(f"{server.host}:{server.http_port}")
    try:
        for client, module in ((grpc_client, tgrpc), (rest, thttp)):
            answer = client.infer("xlmr-classify", triton_inputs(module, texts))
            np.testing.assert_allclose(answer.as_numpy("probabilities"), references["pairs"], atol=1e-4)
            assert [x.decode() for x in answer.as_numpy("label")] == [LABELS[int(p.argmax())]
                                                                     for p in references["pairs"]]
        # raw tensors: padded batches as the manifest's two inputs (no token types), logits equal transformers'
        ckpt = checkpoints["classify"]
        feeds = hf_feeds(ckpt, [a for a, _ in PAIRS], [b for _, b in PAIRS])
        raw = grpc_client.infer("xlmr-classify", triton_inputs(tgrpc, {k: v.numpy() for k, v in feeds.items()}))
        np.testing.assert_allclose(raw.as_numpy("logits"), _logits(ckpt, "classify", feeds), atol=1e-4)

        ckpt = checkpoints["fill-mask"]
        feeds = hf_feeds(ckpt, [t.replace("the", "<mask>", 1) for t in TEXTS])
        real = feeds["attention_mask"].numpy().astype(bool)
        assert not real.all()       # padding is exercised
        raw = rest.infer("xlmr-fill-mask", triton_inputs(thttp, {k: v.numpy() for k, v in feeds.items()}))
        got, want = raw.as_numpy("logits"), _logits(ckpt, "fill-mask", feeds)
        assert got.shape == want.shape
        assert float(np.abs(got - want)[real].max()) <= 1e-4
    finally:
        grpc_client.close()
        rest.close()


def test_http_routes_answer_as_transformers(server: ServerProcess, references) -> None:
    with httpx.Client(base_url=server.http_url, timeout=60) as http:
        r = http.post("/v1/classify", json={"model": "xlmr-classify", "inputs": [list(p) for p in PAIRS]})
        assert r.status_code == 200, r.text
        for row, probs in zip(r.json()["results"], references["pairs"], strict=True):
            served = {s["label"]: s["score"] for s in row}
            np.testing.assert_allclose([served[lab] for lab in LABELS], probs, atol=1e-4)
            assert row[0]["label"] == LABELS[int(probs.argmax())]

        r = http.post("/v1/rerank", json={"model": "xlmr-rerank", "query": QUERY, "documents": DOCUMENTS,
                                          "top_n": 2})
        assert r.status_code == 200, r.text
        want = references["relevance"]
        best = list(np.argsort(-want, kind="stable")[:2])
        assert [d["index"] for d in r.json()["results"]] == best
        np.testing.assert_allclose([d["relevance_score"] for d in r.json()["results"]], want[best], atol=1e-5)

        r = http.post("/v1/embeddings", json={"model": "xlmr-embed", "input": TEXTS})
        assert r.status_code == 200, r.text
        got = np.array([d["embedding"] for d in sorted(r.json()["data"], key=lambda d: d["index"])])
        np.testing.assert_allclose(got, references["vectors"], atol=1e-4)

        r = http.post("/v1/token-classify", json={"model": "xlmr-token-classify", "inputs": TEXTS,
                                                  "ignore_labels": []})
        assert r.status_code == 200, r.text
        for entities, probs, real in zip(r.json()["results"], references["tags"], references["real_tokens"],
                                         strict=True):
            _check_tags([(e["index"], e["entity"], e["score"]) for e in entities], probs, int(real))
