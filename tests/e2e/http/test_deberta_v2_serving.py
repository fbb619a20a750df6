"""DeBERTa-v2 / v3 packages served by a real server process through every door, against `transformers`:

- a v2-shaped classifier (token types, so pairs reach the graph as types 0 / 1): the task API's Classify over
  gRPC, KServe text mode (text + text_pair) over gRPC and REST, and raw KServe tensors;
- a v3-shaped masked LM (the task API's FillMask), token classifier (POST /v1/token-classify) and DebertaV2Model
  embedder (POST /v1/embeddings).
Every answer equals transformers on the same text, tokenized by the checkpoint's tokenizer.json.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import grpc
import httpx2 as httpx
import numpy as np
import pytest
import torch
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp

from protos import ortserve_pb2 as pb
from protos import ortserve_pb2_grpc as pb_grpc
from tests.deberta_models import LABELS, V2_SHAPE, pair_feeds, save_checkpoint, unigram_tokenizer
from tests.door_calls import triton_inputs
from tests.server_process import ServerProcess

transformers = pytest.importorskip("transformers")

PAIRS = [("A horse! a horse! my kingdom for a horse!", "Withdraw, my lord."),
         ("Now is the winter of our discontent", "made glorious summer by this sun."),
         ("To be", "or not to be")]
MASKED = "Now is the [MASK] of our discontent"


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("deberta-serving")
    tok = unigram_tokenizer(root / "tok")
    return {"classify": save_checkpoint(root / "cls", "DebertaV2ForSequenceClassification", tok, **V2_SHAPE),
            "fill-mask": save_checkpoint(root / "mlm", "DebertaV2ForMaskedLM", tok),
            "token-classify": save_checkpoint(root / "tok-cls", "DebertaV2ForTokenClassification", tok),
            "embed": save_checkpoint(root / "base", "DebertaV2Model", tok)}


@pytest.fixture(scope="module")
def server(checkpoints: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    from tests.conftest import one_torch_thread

    from export import ExportConfig, export_checkpoint

    repo = tmp_path_factory.mktemp("deberta-repo")
    with one_torch_thread():
        for task, ckpt in checkpoints.items():
            export_checkpoint(ExportConfig(checkpoint=ckpt, task=task, repository=repo, name=f"deberta-{task}"))
    proc = ServerProcess(repo, ["--http-port", "0", "--max-queue-delay-ms", "2"])
    try:
        yield proc
    finally:
        proc.stop()


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _hf(ckpt: Path, cls: str) -> Any:
    return getattr(transformers, cls).from_pretrained(ckpt).eval()


def test_pair_classifier_through_grpc_kserve_and_http(server: ServerProcess, checkpoints) -> None:
    ckpt = checkpoints["classify"]
    hf = _hf(ckpt, "DebertaV2ForSequenceClassification")
    want = []
    for pair in PAIRS:   # one pair at a time: the reference sees no padding at all
        with torch.no_grad():
            want.append(_softmax(hf(**pair_feeds(ckpt, [pair])).logits[0].numpy()))
    want = np.array(want)
    with torch.no_grad():  # a pair's token types matter to this model: the check below would see them dropped
        untyped = hf(**{**pair_feeds(ckpt, PAIRS[:1]), "token_type_ids": None}).logits[0].numpy()
    assert np.abs(_softmax(untyped) - want[0]).max() > 1e-4

    with grpc.insecure_channel(server.address) as ch:
        got = pb_grpc.TaskServiceStub(ch).Classify(pb.ClassifyRequest(
            model="deberta-classify", inputs=[pb.TextInput(text=a, text_pair=b) for a, b in PAIRS]))
    for res, probs in zip(got.results, want):
        served = {s.label: s.score for s in res.scores}
        np.testing.assert_allclose([served[lab] for lab in LABELS], probs, atol=1e-4)
        assert res.label == LABELS[int(probs.argmax())]

    texts = {"text": np.array([a.encode() for a, _ in PAIRS], dtype=object),
             "text_pair": np.array([b.encode() for _, b in PAIRS], dtype=object)}
    kserve_grpc = tgrpc.InferenceServerClient(server.address).infer("deberta-classify", triton_inputs(tgrpc, texts))
    np.testing.assert_allclose(kserve_grpc.as_numpy("probabilities"), want, atol=1e-4)
    rest = thttp.InferenceServerClient(f"{server.host}:{server.http_port}")
    try:
        kserve_http = rest.infer("deberta-classify", triton_inputs(thttp, texts))
        np.testing.assert_allclose(kserve_http.as_numpy("probabilities"), want, atol=1e-4)
        assert [x.decode() for x in kserve_http.as_numpy("label")] == [LABELS[int(p.argmax())] for p in want]
        # raw tensors: the padded batch of pairs, the manifest's three inputs, logits equal transformers'
        feeds = pair_feeds(ckpt, PAIRS)
        raw = rest.infer("deberta-classify", triton_inputs(thttp, {k: v.numpy() for k, v in feeds.items()}))
        with torch.no_grad():
            ref = hf(**feeds).logits.numpy()
        np.testing.assert_allclose(raw.as_numpy("logits"), ref, atol=1e-4)
    finally:
        rest.close()


def test_fill_mask_token_classify_and_embed_served(server: ServerProcess, checkpoints) -> None:
    from tokenizers import Tokenizer

    ckpt = checkpoints["fill-mask"]
    hf = _hf(ckpt, "DebertaV2ForMaskedLM")
    feeds = pair_feeds(ckpt, [(MASKED, None)])
    mask_id = Tokenizer.from_file(str(ckpt / "tokenizer.json")).token_to_id("[MASK]")
    pos = int((feeds["input_ids"][0] == mask_id).nonzero()[0, 0])
    with torch.no_grad():
        probs = _softmax(hf(**feeds).logits[0, pos].numpy())
    with grpc.insecure_channel(server.address) as ch:
        res = pb_grpc.TaskServiceStub(ch).FillMask(pb.FillMaskRequest(model="deberta-fill-mask", texts=[MASKED],
                                                                      top_k=3))
    masks = res.results[0].masks
    assert [m.position for m in masks] == [pos]
    assert [c.token_id for c in masks[0].candidates] == list(np.argsort(-probs)[:3])
    np.testing.assert_allclose([c.score for c in masks[0].candidates], np.sort(probs)[::-1][:3], rtol=1e-4, atol=1e-6)

    text = PAIRS[0][0]
    ckpt = checkpoints["token-classify"]
    hf = _hf(ckpt, "DebertaV2ForTokenClassification")
    feeds = pair_feeds(ckpt, [(text, None)])
    with torch.no_grad():
        probs = _softmax(hf(**feeds).logits[0].numpy())
    with httpx.Client(base_url=server.http_url, timeout=60) as client:
        r = client.post("/v1/token-classify", json={"model": "deberta-token-classify", "inputs": text,
                                                      "ignore_labels": []})
        assert r.status_code == 200, r.text
        entities = r.json()["results"][0]
        assert len(entities) == int(feeds["attention_mask"].sum()) - 2   # every token but [CLS] / [SEP]
        for e in entities:
            assert e["entity"] == LABELS[int(probs[e["index"]].argmax())]
            assert abs(e["score"] - float(probs[e["index"]].max())) <= 1e-4

        ckpt = checkpoints["embed"]
        feeds = pair_feeds(ckpt, [(t, None) for t, _ in PAIRS])
        with torch.no_grad():
            hidden = _hf(ckpt, "DebertaV2Model")(**feeds).last_hidden_state
        keep = feeds["attention_mask"][..., None].float()
        want = ((hidden * keep).sum(1) / keep.sum(1)).numpy()
        r = client.post("/v1/embeddings", json={"model": "deberta-embed", "input": [t for t, _ in PAIRS]})
        assert r.status_code == 200, r.text
        got = np.array([d["embedding"] for d in r.json()["data"]])
        np.testing.assert_allclose(got, want, atol=1e-4)
