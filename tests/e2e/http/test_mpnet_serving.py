"""MPNet packages served by one real server process, against sentence-transformers and transformers on the same
checkpoints (tests/mpnet_models.py: random MPNet* models, a WordPiece tokenizer in MPNetTokenizer's layout, one text
past relative distance 128):

- embeddings over the OpenAI door (the real `openai` client) and the task API over gRPC, from an MPNetModel under
  all-mpnet-base-v2's module stack (Pooling mean + Normalize), equal to SentenceTransformer.encode;
- Classify and FillMask over gRPC, equal to transformers' MPNetForSequenceClassification / MPNetForMaskedLM.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

import grpc
import numpy as np
import openai
import pytest

from protos import ortserve_pb2 as pb
from protos import ortserve_pb2_grpc as pb_grpc
from tests.mpnet_models import LABELS, LONG, TEXTS, build_checkpoints, hf_feeds, hf_outputs, save_sentence_transformer
from tests.server_process import ServerProcess

st = pytest.importorskip("sentence_transformers")
BATCH = TEXTS + [LONG]
MASKED = "Now is the <mask> of our discontent"


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("mpnet")
    out = build_checkpoints(root)
    out["st"] = save_sentence_transformer(out["embed"], root / "st")
    return out


@pytest.fixture(scope="module")
def server(checkpoints: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    from export import ExportConfig, export_checkpoint
    from tests.conftest import one_torch_thread

    repo = tmp_path_factory.mktemp("mpnet-repo")
    with one_torch_thread():
        for name, (key, task) in {"mpnet-embed": ("st", "embed"), "mpnet-classify": ("classify", "classify"),
                                  "mpnet-fill-mask": ("fill-mask", "fill-mask")}.items():
            export_checkpoint(ExportConfig(checkpoint=checkpoints[key], task=task, repository=repo, name=name))
    with ServerProcess(repo, ["--http-port", "0", "--max-queue-delay-ms", "2"]) as proc:
        yield proc


def test_embeddings_over_openai_and_grpc_equal_sentence_transformers(server: ServerProcess, checkpoints) -> None:
    want = st.SentenceTransformer(str(checkpoints["st"]), device="cpu").encode(BATCH, convert_to_numpy=True)
    assert float(np.abs(want[0] - want[1]).max()) > 1e-2          # the texts move the vectors
    client = openai.OpenAI(base_url=f"{server.http_url}/v1", api_key="x", max_retries=0)
    answer = client.embeddings.create(model="mpnet-embed", input=BATCH, encoding_format="float")
    assert [d.index for d in answer.data] == list(range(len(BATCH)))
    np.testing.assert_allclose(np.array([d.embedding for d in answer.data]), want, atol=1e-5)
    with grpc.insecure_channel(server.address) as channel:
        response = pb_grpc.TaskServiceStub(channel).Embed(pb.EmbedRequest(model="mpnet-embed", texts=BATCH))
    assert response.dimension == 32 and response.normalized
    np.testing.assert_allclose(np.array([list(e.values) for e in response.embeddings]), want, atol=1e-5)
    assert response.embeddings[-1].tokens > 129                    # the long text, past distance 128, not cut


def test_classify_and_fill_mask_over_grpc_equal_transformers(server: ServerProcess, checkpoints) -> None:
    ckpt = checkpoints["classify"]
    probs = _softmax(hf_outputs(ckpt, "classify", hf_feeds(ckpt, BATCH)).numpy())
    assert float(np.abs(probs[0] - probs[1]).max()) > 1e-3
    ckpt = checkpoints["fill-mask"]
    feeds = hf_feeds(ckpt, [MASKED])
    from transformers import AutoTokenizer

    mask_id = AutoTokenizer.from_pretrained(ckpt).mask_token_id
    position = int((feeds["input_ids"][0] == mask_id).nonzero()[0, 0])
    mask_probs = _softmax(hf_outputs(ckpt, "fill-mask", feeds).numpy()[0, position])
    with grpc.insecure_channel(server.address) as channel:
        stub = pb_grpc.TaskServiceStub(channel)
        got = stub.Classify(pb.ClassifyRequest(model="mpnet-classify", inputs=[pb.TextInput(text=t) for t in BATCH]))
        for res, row in zip(got.results, probs, strict=True):
            served = {s.label: s.score for s in res.scores}
            np.testing.assert_allclose([served[lab] for lab in LABELS], row, atol=1e-4)
            assert res.label == LABELS[int(row.argmax())]
        res = stub.FillMask(pb.FillMaskRequest(model="mpnet-fill-mask", texts=[MASKED], top_k=3))
    [masked] = res.results[0].masks
    assert masked.position == position
    assert [c.token_id for c in masked.candidates] == list(np.argsort(-mask_probs)[:3])
    np.testing.assert_allclose([c.score for c in masked.candidates], np.sort(mask_probs)[::-1][:3], rtol=1e-4,
                               atol=1e-6)
