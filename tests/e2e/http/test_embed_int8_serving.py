"""An embedding package exported with `--variants fp32,int8` served by a real server process: without --variant the
server runs the package's CPU default, int8, so /v1/embeddings (the real `openai` client) answers the int8 graph's
vectors, which stay within the gate's cosine of sentence-transformers' own; `--variant fp32` on a second server
answers the fp32 graph's. Model: a sentence-transformers 6 model (Transformer + mean Pooling + Dense + Normalize)
over the tiny random BERT (tests/st_models.py).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import openai
import pytest
from tokenizers import Tokenizer

from tests.server_process import ServerProcess
from tests.st_models import save_st

st = pytest.importorskip("sentence_transformers")

NAME = "st-int8"
TEXTS = ["A man is eating food.", "Now is the winter of our discontent made glorious summer by this sun of York",
         "To be", "the king sat on his throne in the old castle"]


@pytest.fixture(scope="module")
def package(tiny_checkpoints, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(repository, the sentence-transformers folder) with NAME/1 exported with fp32 and int8."""
    from tests.conftest import one_torch_thread

    from export import ExportConfig, export_checkpoint

    root = tmp_path_factory.mktemp("embed-int8")
    checkpoint = save_st(tiny_checkpoints.mlm, root / "st", "mean")
    with one_torch_thread():
        export_checkpoint(ExportConfig(checkpoint=checkpoint, task="embed", repository=root / "repo", name=NAME,
                                       variants=("fp32", "int8")))
    return root / "repo", checkpoint


def graph_vectors(package_dir: Path, variant: str, texts: list[str]) -> np.ndarray:
    """The variant's graph run here, one text at a time (no padding: the served batch pads, the vectors do not
    depend on it beyond float noise)."""
    manifest = json.loads((package_dir / "model.json").read_text())
    tok = Tokenizer.from_file(str(package_dir / "tokenizer.json"))
    tok.no_padding()
    session = ort.InferenceSession(str(package_dir / manifest["variants"][variant]), providers=["CPUExecutionProvider"])
    out = []
    for text in texts:
        ids = np.array([tok.encode(text).ids], np.int64)
        feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
        names = {i.name for i in session.get_inputs()}
        out.append(session.run(["embeddings"], {k: v for k, v in feeds.items() if k in names})[0][0])
    return np.stack(out)


def served(server: ServerProcess) -> np.ndarray:
    client = openai.OpenAI(base_url=server.http_url + "/v1", api_key="unused")
    answer = client.embeddings.create(model=NAME, input=TEXTS)
    return np.array([d.embedding for d in sorted(answer.data, key=lambda d: d.index)], np.float32)


def test_the_default_server_answers_int8_and_fp32_on_request(package: tuple[Path, Path]) -> None:
    repo, checkpoint = package
    manifest = json.loads((repo / NAME / "1" / "model.json").read_text())
    assert manifest["default_variant"]["cpu"] == "int8"
    int8 = graph_vectors(repo / NAME / "1", "int8", TEXTS)
    fp32 = graph_vectors(repo / NAME / "1", "fp32", TEXTS)
    assert np.abs(int8 - fp32).max() > 1e-4          # the two graphs are told apart by their vectors

    with ServerProcess(repo, ["--http-port", "0"]) as server:
        got = served(server)
    np.testing.assert_allclose(got, int8, atol=2e-5)
    reference = st.SentenceTransformer(str(checkpoint), device="cpu").encode(TEXTS, batch_size=len(TEXTS))
    cosine = (got * reference).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(reference, axis=1))
    assert cosine.min() >= 0.99, cosine

    with ServerProcess(repo, ["--http-port", "0", "--variant", "fp32"]) as server:
        np.testing.assert_allclose(served(server), fp32, atol=2e-5)
