"""Encoder tasks beside classify / fill-mask / embed, served through every door against references computed
outside the server:

- /tokenize, /detokenize and the task API's Tokenize / Detokenize for every model kind: an encoder's tokens (ids,
  special marks, offsets) equal transformers' tokenizer on the same checkpoint; round trips;
- `dimensions` on /v1/embeddings and Embed: a Matryoshka-declared MiniLM package (`python -m pipeline --embed minilm
  --embed-matryoshka`, which runs export --matryoshka) answers
  sentence-transformers' full vector cut and renormalised; a package without the declaration refuses;
- rerank and score (/v1/rerank, /v1/score, TEI's /rerank, the task API's Rerank) by a one-label cross-encoder
  (sentence-transformers' CrossEncoder on the same checkpoint) and by the MiniLM embedding model (cosine of
  sentence-transformers' vectors); bad requests refused naming the field, before compute;
- head activations (tests/head_models.py): a multi-label head scores sigmoid per label, a regression head its logit,
  a CrossEncoder saved with Identity its logit, each as transformers' pipeline / sentence-transformers answer;
  function_to_apply on Classify, KServe text mode, /v1/classify and TEI's /predict;
- zero-shot classification (ZeroShotClassify, /v1/zero-shot-classification, the client library) on random NLI
  BERT / RoBERTa heads equal to transformers' zero-shot-classification pipeline; refusals before compute.
"""
from __future__ import annotations

import json
import subprocess
import sys
import unicodedata
from pathlib import Path
from typing import Any, Iterator

import grpc
import httpx2 as httpx
import numpy as np
import pytest
from tests.pair_models import build_cross_encoder
from tests.server_process import ROOT, ServerProcess, repository_with
from tests.hf_models import minilm_dir

from protos import ortserve_pb2 as pb
from protos import ortserve_pb2_grpc as pb_grpc

MINILM, PLAIN, CROSS = "minilm-m", "tiny-embed", "tiny-cross"
CLASSIFIER, GPT = "tiny-classifier", "tiny-gpt"
QUERY = "the king rode to the castle"
DOCUMENTS = ["A river boat sailed past the harbour at dawn.",
             "The king and his soldiers held the castle through the long siege.",
             "Roses and a tree in the quiet garden.",
             "His crown and sword were kept in the throne room of the court.",
             "the fish swam near the island shore"]


@pytest.fixture(scope="module")
def cross_encoder(tiny_checkpoints, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_cross_encoder(tiny_checkpoints, tmp_path_factory.mktemp("cross"))


@pytest.fixture(scope="module")
def heads(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from tests.conftest import one_torch_thread
    from tests.head_models import build_heads

    with one_torch_thread():
        return build_heads(tmp_path_factory.mktemp("heads"))


@pytest.fixture(scope="module")
def repository(tiny_repository: Path, tiny_checkpoints, cross_encoder: Path, heads: dict[str, Path],
               tmp_path_factory: pytest.TempPathFactory) -> Path:
    """minilm-m (MiniLM declared Matryoshka, published by the pipeline's embed stage: its `python -m export --task
    embed --matryoshka`), tiny-embed (no declaration), tiny-cross (one-label pair classifier), the shared tiny
    classifier (3 labels) and GPT, and the heads of tests/head_models.py (under their names there)."""
    from tests.conftest import one_torch_thread

    from export import ExportConfig, export_checkpoint
    from pipeline.run import Pipeline

    root = tmp_path_factory.mktemp("encoder-tasks")
    repo = repository_with(tiny_repository, root / "repo", CLASSIFIER, GPT)
    # test_pipeline_embed_matryoshka_declares_it starts from this version 1 (a MiniLM export is the costliest step
    # here: done once for the module).
    pipeline = Pipeline(matryoshka_config(root / "work", repo))
    pipeline.publish("embed", pipeline.cfg.embed_checkpoint)
    assert pipeline.published == {MINILM: 1}
    with one_torch_thread():
        export_checkpoint(ExportConfig(checkpoint=tiny_checkpoints.mlm, task="embed", repository=repo, name=PLAIN,
                                       pooling="cls", normalize="off"))
        export_checkpoint(ExportConfig(checkpoint=cross_encoder, task="classify", repository=repo, name=CROSS))
        for name, checkpoint in heads.items():
            export_checkpoint(ExportConfig(checkpoint=checkpoint, task="classify", repository=repo, name=name))
    return repo


def matryoshka_config(workdir: Path, repository: Path, matryoshka: bool = True):  # type: ignore[no-untyped-def]
    """`python -m pipeline --embed minilm [--embed-matryoshka]`'s settings, MiniLM published as MINILM."""
    from pipeline.cli import parse_args

    return parse_args(["--workdir", str(workdir), "--repository", str(repository), "--embed", "minilm",
                       "--name", f"embed={MINILM}", *(["--embed-matryoshka"] if matryoshka else [])])


@pytest.fixture(scope="module")
def server(repository: Path) -> Iterator[ServerProcess]:
    proc = ServerProcess(repository, ["--http-port", "0", "--max-queue-delay-ms", "2"])
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def http(server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.http_url, timeout=60) as client:
        yield client


@pytest.fixture(scope="module")
def tasks(server: ServerProcess) -> Iterator[pb_grpc.TaskServiceStub]:
    with grpc.insecure_channel(server.address) as channel:
        yield pb_grpc.TaskServiceStub(channel)


def assert_ranked(indices: list[int], reference: np.ndarray, atol: float = 1e-5) -> None:
    """`indices` rank the documents as `reference` scores them, ties within atol in either order: the tiny
    cross-encoder scores same-topic documents within 1e-7 of each other, so batching may swap them."""
    assert len(set(indices)) == len(indices) and set(indices) <= set(range(len(reference))), indices
    ranked = reference[indices]
    assert all(a >= b - atol for a, b in zip(ranked, ranked[1:])), (indices, reference)
    rest = [i for i in range(len(reference)) if i not in indices]
    assert all(reference[i] <= ranked.min() + atol for i in rest), (indices, reference)


def refused(response: httpx.Response, status: int = 400) -> str:
    """The field a refusal names (OpenAI's `param`, or the start of a plain {"error": message})."""
    assert response.status_code == status, response.text
    error = response.json()["error"]
    return error["param"] if isinstance(error, dict) else error.split(":")[0]


def batches(server: ServerProcess) -> dict[str, float]:
    """Batches each model's batcher ran (ortserve_batch_size_count, from the metrics)."""
    found = {}
    for line in httpx.get(f"{server.http_url}/metrics").text.splitlines():
        if line.startswith("ortserve_batch_size_count"):
            name, value = line.rsplit(" ", 1)
            found[name] = float(value)
    return found


def grpc_refused(call: Any, request: Any) -> str:
    with pytest.raises(grpc.RpcError) as info:
        call(request)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value.details()
    return info.value.details().split(":")[0]


# ---------------------------------------------------------------------------- tokenize


@pytest.mark.parametrize("name", [MINILM, CLASSIFIER])
def test_encoder_tokens_equal_transformers(http: httpx.Client, tasks: pb_grpc.TaskServiceStub, tiny_checkpoints,
                                           repository: Path, name: str) -> None:
    from transformers import AutoTokenizer

    reference = AutoTokenizer.from_pretrained(str(minilm_dir() if name == MINILM else tiny_checkpoints.classifier))
    text = "The King's  castle, ünïcödé and [MASK] words: rode!"
    want = reference(text, return_offsets_mapping=True, return_special_tokens_mask=True)
    answer = http.post("/tokenize", json={"model": name, "prompt": text, "return_token_strs": True})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["tokens"] == want["input_ids"] and body["count"] == len(want["input_ids"])
    assert body["token_strs"] == reference.convert_ids_to_tokens(want["input_ids"])
    assert body["offsets"] == [list(o) for o in want["offset_mapping"]]
    specials = set(reference.all_special_ids)
    assert body["special"] == [bool(m) or i in specials for i, m in zip(want["input_ids"], want["special_tokens_mask"])]
    assert body["special"][0] and body["special"][-1] and body["special"][body["token_strs"].index("[MASK]")]
    assert body["max_model_len"] == json.loads((repository / name / "1" / "model.json").read_text())["max_length"]
    for token, (start, stop) in zip(body["token_strs"], body["offsets"]):
        if stop > start:   # each token's characters, as the vocabulary writes them (uncased: lowercased, no accents)
            plain = "".join(c for c in unicodedata.normalize("NFD", text[start:stop]) if not unicodedata.combining(c))
            assert token.removeprefix("##") in (text[start:stop], plain.lower()) or token == "[UNK]"
    response = tasks.Tokenize(pb.TokenizeRequest(model=name, prompt=text))
    fields = zip(body["tokens"], body["token_strs"], body["special"], body["offsets"])
    assert [(t.id, t.text, t.special, t.start, t.stop) for t in response.tokens] == \
        [(i, s, m, a, b) for i, s, m, (a, b) in fields]
    assert response.max_length == body["max_model_len"] and response.version == 1


@pytest.mark.parametrize("name", [MINILM, CLASSIFIER, GPT])
def test_tokenize_round_trips(http: httpx.Client, tasks: pb_grpc.TaskServiceStub, repository: Path,
                              name: str) -> None:
    """detokenize(tokenize(text)) is the tokenizer's own decoding (tokenizers on the package's file); the ids
    without the special tokens decode to a text that tokenizes to the same ids."""
    from tokenizers import Tokenizer

    reference = Tokenizer.from_file(str(repository / name / "1" / "tokenizer.json"))
    text = "the king and the castle, by the river"
    tokens = http.post("/tokenize", json={"model": name, "prompt": text}).json()
    ids = tokens["tokens"]
    whole = http.post("/detokenize", json={"model": name, "tokens": ids})
    assert whole.status_code == 200 and whole.json() == {"prompt": reference.decode(ids, skip_special_tokens=False)}
    inner = [i for i, special in zip(ids, tokens["special"]) if not special]
    assert len(inner) == len(ids) - (0 if name == GPT else 2)        # [CLS] ... [SEP]
    back = tasks.Detokenize(pb.DetokenizeRequest(model=name, tokens=inner)).text
    assert back == text
    again = tasks.Tokenize(pb.TokenizeRequest(model=name, prompt=back))
    assert [t.id for t in again.tokens] == ids


def test_tokenize_refusals(http: httpx.Client, tasks: pb_grpc.TaskServiceStub) -> None:
    max_length = http.post("/tokenize", json={"model": MINILM, "prompt": "a"}).json()["max_model_len"]
    assert refused(http.post("/tokenize", json={"model": MINILM, "prompt": "a" * ((max_length + 1) * 100 + 1)})) \
        == "prompt"
    assert refused(http.post("/detokenize", json={"model": MINILM, "tokens": [101, 10 ** 6]})) == "tokens[1]"
    assert refused(http.post("/detokenize", json={"model": CLASSIFIER, "tokens": [1] * (max_length * 4)})) == "tokens"
    assert refused(http.post("/tokenize", json={"model": MINILM, "prompt": "a", "add_special_tokens": False})) \
        == "add_special_tokens"
    assert refused(http.post("/tokenize", json={"model": "nope", "prompt": "a"}), 404) == "model"
    assert grpc_refused(tasks.Detokenize, pb.DetokenizeRequest(model=MINILM, tokens=[-1])) == "tokens[0]"


# ---------------------------------------------------------------------------- dimensions


@pytest.fixture(scope="module")
def full_vectors() -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(minilm_dir()), device="cpu").encode([QUERY, *DOCUMENTS], convert_to_numpy=True)


def cut(vectors: np.ndarray, n: int) -> np.ndarray:
    short = vectors[:, :n].astype(np.float64)
    return short / np.linalg.norm(short, axis=1, keepdims=True)


@pytest.mark.parametrize("n", [1, 64, 383, 384])
def test_dimensions_equal_the_full_vector_cut_and_renormalised(http: httpx.Client, tasks: pb_grpc.TaskServiceStub,
                                                               full_vectors: np.ndarray, n: int) -> None:
    texts = [QUERY, *DOCUMENTS]
    answer = http.post("/v1/embeddings", json={"model": MINILM, "input": texts, "dimensions": n,
                                               "encoding_format": "float"})
    assert answer.status_code == 200, answer.text
    got = np.array([d["embedding"] for d in answer.json()["data"]])
    assert got.shape == (len(texts), n)
    np.testing.assert_allclose(got, cut(full_vectors, n), atol=2e-5 if n > 1 else 1e-6)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    response = tasks.Embed(pb.EmbedRequest(model=MINILM, texts=texts, dimensions=n))
    assert response.dimension == n and response.normalized
    np.testing.assert_array_equal(np.array([e.values for e in response.embeddings], dtype=np.float32),
                                  got.astype(np.float32))


def test_dimensions_refused_naming_the_field(http: httpx.Client, tasks: pb_grpc.TaskServiceStub) -> None:
    for model, n in ((MINILM, 0), (MINILM, -3), (MINILM, 385), (PLAIN, 32), (PLAIN, 65)):
        assert refused(http.post("/v1/embeddings", json={"model": model, "input": "a", "dimensions": n})) \
            == "dimensions", (model, n)
        assert grpc_refused(tasks.Embed, pb.EmbedRequest(model=model, texts=["a"], dimensions=n)) == "dimensions"
    message = http.post("/v1/embeddings", json={"model": PLAIN, "input": "a", "dimensions": 32}).json()["error"]
    assert "Matryoshka" in message["message"]
    full = http.post("/v1/embeddings", json={"model": PLAIN, "input": "a", "dimensions": 64})
    assert full.status_code == 200 and len(full.json()["data"][0]["embedding"]) == 64
    unset = tasks.Embed(pb.EmbedRequest(model=PLAIN, texts=["a"]))
    assert unset.dimension == 64


# ---------------------------------------------------------------------------- rerank and score


@pytest.fixture(scope="module")
def cross_reference(cross_encoder: Path) -> tuple[np.ndarray, np.ndarray]:
    """sentence-transformers' CrossEncoder on the checkpoint: (sigmoid scores, logits) of (QUERY, document)."""
    import torch
    from sentence_transformers import CrossEncoder

    model = CrossEncoder(str(cross_encoder), device="cpu")
    pairs = [(QUERY, d) for d in DOCUMENTS]
    scores = model.predict(pairs, convert_to_numpy=True)
    logits = model.predict(pairs, activation_fn=torch.nn.Identity(), convert_to_numpy=True)
    return np.asarray(scores, dtype=np.float64), np.asarray(logits, dtype=np.float64)


def test_cross_encoder_rerank_equals_sentence_transformers(http: httpx.Client, tasks: pb_grpc.TaskServiceStub,
                                                           cross_reference: tuple[np.ndarray, np.ndarray]) -> None:
    scores, logits = cross_reference
    assert scores.max() - scores.min() > 0.05, scores    # a ranking, not ties
    answer = http.post("/v1/rerank", json={"model": CROSS, "query": QUERY, "documents": DOCUMENTS})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    got = [r["index"] for r in body["results"]]
    assert_ranked(got, scores)
    assert len(got) == len(DOCUMENTS)
    np.testing.assert_allclose([r["relevance_score"] for r in body["results"]], scores[got], atol=1e-5)
    assert [r["document"]["text"] for r in body["results"]] == [DOCUMENTS[i] for i in got]
    assert body["model"] == CROSS and body["usage"]["total_tokens"] > 5 * 4
    top = http.post("/v1/rerank", json={"model": CROSS, "query": QUERY, "top_n": 2, "return_documents": False,
                                        "documents": [{"text": d} for d in DOCUMENTS]}).json()
    assert len(top["results"]) == 2 and "document" not in top["results"][0]
    assert_ranked([r["index"] for r in top["results"]], scores)
    tei = http.post("/rerank", json={"model": CROSS, "query": QUERY, "texts": DOCUMENTS, "raw_scores": True,
                                     "return_text": True}).json()
    assert_ranked([r["index"] for r in tei], logits, atol=1e-4)
    assert len(tei) == len(DOCUMENTS) and tei[0]["text"] == DOCUMENTS[tei[0]["index"]]
    np.testing.assert_allclose([r["score"] for r in tei], logits[[r["index"] for r in tei]], atol=1e-4)
    score = http.post("/v1/score", json={"model": CROSS, "text_1": QUERY, "text_2": DOCUMENTS}).json()
    np.testing.assert_allclose([d["score"] for d in score["data"]], scores, atol=1e-5)
    assert [d["index"] for d in score["data"]] == list(range(len(DOCUMENTS)))
    pairwise = http.post("/v1/score", json={"model": CROSS, "text_1": [QUERY] * 5, "text_2": DOCUMENTS}).json()
    np.testing.assert_allclose([d["score"] for d in pairwise["data"]], scores, atol=1e-5)
    response = tasks.Rerank(pb.RerankRequest(model=CROSS, query=QUERY, documents=DOCUMENTS, top_n=3,
                                             return_documents=True))
    top3 = [r.index for r in response.results]
    assert_ranked(top3, scores)
    assert len(top3) == 3 and response.results[0].document == DOCUMENTS[top3[0]]
    np.testing.assert_allclose([r.score for r in response.results], scores[top3], atol=1e-5)


def test_embedding_rerank_equals_cosine_of_sentence_transformers(http: httpx.Client, tasks: pb_grpc.TaskServiceStub,
                                                                 full_vectors: np.ndarray) -> None:
    unit = full_vectors / np.linalg.norm(full_vectors, axis=1, keepdims=True)
    cosine = unit[1:] @ unit[0]
    order = list(np.argsort(-cosine, kind="stable"))
    body = http.post("/v1/rerank", json={"model": MINILM, "query": QUERY, "documents": DOCUMENTS}).json()
    assert [r["index"] for r in body["results"]] == order
    np.testing.assert_allclose([r["relevance_score"] for r in body["results"]], cosine[order], atol=1e-5)
    score = http.post("/v1/score", json={"model": MINILM, "text_1": [QUERY, DOCUMENTS[0]],
                                         "text_2": [DOCUMENTS[1], DOCUMENTS[2]]}).json()
    np.testing.assert_allclose([d["score"] for d in score["data"]], [unit[0] @ unit[2], unit[1] @ unit[3]], atol=1e-5)
    response = tasks.Rerank(pb.RerankRequest(model=MINILM, query=QUERY, documents=DOCUMENTS))
    np.testing.assert_allclose([r.score for r in response.results], cosine[order], atol=1e-5)


def test_rerank_refusals_name_the_field(http: httpx.Client, tasks: pb_grpc.TaskServiceStub,
                                        server: ServerProcess) -> None:
    before = batches(server)
    many = ["a"] * 100_000
    for model in (CROSS, MINILM):
        rerank = {"model": model, "query": QUERY, "documents": DOCUMENTS}
        for change, field in (({"documents": []}, "documents"), ({"documents": many}, "documents"),
                              ({"top_n": 0}, "top_n"), ({"top_n": -1}, "top_n"), ({"query": " "}, "query"),
                              ({"documents": ["a", ""]}, "documents[1]"), ({"documents": ["a", 5]}, "documents[1]"),
                              ({"documents": ["a", "x" * 100_000]}, "documents[1]"),
                              ({"rank_fields": ["title"]}, "rank_fields")):
            assert refused(http.post("/v1/rerank", json={**rerank, **change})) == field, (model, change)
        assert refused(http.post("/rerank", json={"model": model, "query": QUERY, "texts": many})) == "texts"
        assert refused(http.post("/rerank", json={"model": model, "query": QUERY, "texts": []})) == "texts"
        assert refused(http.post("/v1/score", json={"model": model, "text_1": ["a", "b"], "text_2": ["a"] * 3})) \
            == "text_2"
        assert refused(http.post("/v1/score", json={"model": model, "text_1": "a", "text_2": []})) == "text_2"
        for request, field in ((pb.RerankRequest(model=model, query=QUERY), "documents"),
                               (pb.RerankRequest(model=model, query=QUERY, documents=many), "documents"),
                               (pb.RerankRequest(model=model, query=QUERY, documents=DOCUMENTS, top_n=0), "top_n"),
                               (pb.RerankRequest(model=model, documents=DOCUMENTS), "query")):
            assert grpc_refused(tasks.Rerank, request) == field
    long_query = "castle " * 300     # fits the character bound, not the 256 tokens
    assert refused(http.post("/v1/rerank", json={"model": MINILM, "query": long_query, "documents": ["a"]})) \
        == "query"
    assert refused(http.post("/v1/rerank", json={"model": CROSS, "query": long_query, "documents": ["a"]})) \
        == "documents[0]"      # the pair of query and document is what overflows
    for model in (CLASSIFIER, GPT):   # three labels: no single relevance; a generation model: no scores at all
        assert refused(http.post("/v1/rerank", json={"model": model, "query": QUERY, "documents": DOCUMENTS})) \
            == "model"
    assert batches(server) == before      # every refusal came before compute: no batch ran
    ok = http.post("/v1/rerank", json={"model": MINILM, "query": long_query, "documents": ["a"], "truncate": True})
    assert ok.status_code == 200 and ok.json()["usage"]["total_tokens"] == 256 + 3


def test_pipeline_embed_matryoshka_declares_it(repository: Path, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str], tiny_checkpoints) -> None:
    """`python -m pipeline --embed minilm --embed-matryoshka` publishes the package with the declaration (version 1:
    the module's repository fixture published it so); the flag without --embed, and `export --matryoshka` of another
    task, are one-line refusals."""
    from pipeline.cli import parse_args
    from pipeline.run import Pipeline

    repo = repository_with(repository, tmp_path / "repo", MINILM)   # a copy: the module's server serves the original
    cfg = matryoshka_config(tmp_path / "work", repo)
    assert cfg.embed_matryoshka and cfg.embed_checkpoint == minilm_dir()
    manifest = json.loads((repo / MINILM / "1" / "model.json").read_text())
    assert manifest["embedding"]["matryoshka"] is True
    # The same checkpoint again: nothing new; without the declaration now: a new version that has none.
    again = Pipeline(cfg)
    again.publish("embed", cfg.embed_checkpoint)
    assert again.published == {} and again.skipped == [f"publish-{MINILM}"]
    plain = Pipeline(matryoshka_config(tmp_path / "work", repo, matryoshka=False))
    assert not plain.cfg.embed_matryoshka
    plain.publish("embed", cfg.embed_checkpoint)
    assert plain.published == {MINILM: 2}
    manifest = json.loads((repo / MINILM / "2" / "model.json").read_text())
    assert manifest["embedding"]["matryoshka"] is False
    with pytest.raises(SystemExit):
        parse_args(["--workdir", str(tmp_path / "w"), "--repository", str(tmp_path / "r"), "--embed-matryoshka"])
    assert "--embed-matryoshka: needs --embed" in capsys.readouterr().err
    done = subprocess.run([sys.executable, "-m", "export", str(tiny_checkpoints.classifier), "--task", "classify",
                           "--repository", str(tmp_path / "other"), "--name", "x", "--matryoshka"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [
        "error: --matryoshka: declares an embedding model's vectors; the task is 'classify', not embed"]
    assert not (tmp_path / "other" / "x").exists()


# ---------------------------------------------------------------- the client library


def test_client_library_tokenizes_embeds_shortened_and_reranks(server: ServerProcess, http: httpx.Client,
                                                               full_vectors: np.ndarray,
                                                               cross_reference: tuple[np.ndarray, np.ndarray]) -> None:
    """OrtserveClient / AsyncOrtserveClient: tokenize, detokenize, embed with dimensions and rerank answer what the
    references outside the server give; a refused field comes back as OrtserveError naming it."""
    import asyncio

    from clients import AsyncOrtserveClient, OrtserveClient, OrtserveError

    scores, _ = cross_reference
    with OrtserveClient(server.address, timeout=60) as client:
        tokens = client.tokenize(QUERY, MINILM)
        want = http.post("/tokenize", json={"model": MINILM, "prompt": QUERY, "return_token_strs": True}).json()
        assert tokens.ids == want["tokens"] and tokens.max_length == want["max_model_len"]
        assert tokens.tokens[0].special and QUERY[tokens.tokens[1].start:tokens.tokens[1].stop] == "the"
        assert client.detokenize(tokens.ids[1:-1], MINILM) == QUERY
        vectors = client.embed([QUERY, *DOCUMENTS], MINILM, dimensions=64)
        np.testing.assert_allclose([v.values for v in vectors], cut(full_vectors, 64), atol=2e-5)
        ranked = client.rerank(QUERY, DOCUMENTS, CROSS, top_n=2, return_documents=True)
        top2 = [r.index for r in ranked]
        assert_ranked(top2, scores)
        assert len(top2) == 2 and ranked[0].document == DOCUMENTS[top2[0]]
        np.testing.assert_allclose([r.score for r in ranked], scores[top2], atol=1e-5)
        with pytest.raises(OrtserveError, match="top_n"):
            client.rerank(QUERY, DOCUMENTS, CROSS, top_n=0)
        with pytest.raises(OrtserveError, match="dimensions"):
            client.embed(QUERY, PLAIN, dimensions=8)

    async def run() -> None:
        async with AsyncOrtserveClient(server.address, timeout=60) as aclient:
            assert (await aclient.tokenize(QUERY, MINILM)).ids == tokens.ids
            assert await aclient.detokenize(tokens.ids[1:-1], MINILM) == QUERY
            got = await aclient.rerank(QUERY, DOCUMENTS, CROSS)
            assert_ranked([r.index for r in got], scores)
            assert len(got) == len(DOCUMENTS) and got[0].document == ""
            assert len((await aclient.embed(QUERY, MINILM, dimensions=1))[0].values) == 1
    asyncio.run(run())


# ---------------------------------------------------------------- head activations (function_to_apply)

MULTI, REGRESSION, CE_IDENTITY, NLI_BERT, NLI_ROBERTA = "multi-label", "regression", "ce-identity", "nli-bert", \
    "nli-roberta"
HEAD_TEXTS = ["The king and his soldiers held the castle.", "Roses in the quiet garden", "a boat at dawn"]


def text_pipeline(checkpoint: Path):
    from transformers import pipeline

    return pipeline("text-classification", model=str(checkpoint), top_k=None, device="cpu")


def by_label(rows: list[list[dict[str, Any]]]) -> list[dict[str, float]]:
    return [{d["label"]: d["score"] for d in row} for row in rows]


def assert_scores(got: list[dict[str, float]], want: list[dict[str, float]], atol: float = 1e-5) -> None:
    for g, w in zip(got, want, strict=True):
        assert g.keys() == w.keys(), (g, w)
        np.testing.assert_allclose([g[k] for k in w], [w[k] for k in w], atol=atol)


def classify_grpc(tasks: pb_grpc.TaskServiceStub, model: str, function: str = "") -> list[dict[str, float]]:
    response = tasks.Classify(pb.ClassifyRequest(model=model, inputs=[pb.TextInput(text=t) for t in HEAD_TEXTS],
                                                 function_to_apply=function))
    for r in response.results:   # best first, the label the best one
        assert [s.score for s in r.scores] == sorted((s.score for s in r.scores), reverse=True)
        assert r.label == r.scores[0].label
    return [{s.label: s.score for s in r.scores} for r in response.results]


def test_multi_label_and_regression_heads_score_as_transformers(tasks: pb_grpc.TaskServiceStub, http: httpx.Client,
                                                                heads: dict[str, Path], repository: Path) -> None:
    """The package records the head's activation; Classify answers sigmoid of transformers' logits per label for a
    multi_label_classification head (not summing to 1) and the logit itself for a regression head."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    for name, function in ((MULTI, "sigmoid"), (REGRESSION, "none")):
        head = json.loads((repository / name / "1" / "model.json").read_text())["head"]
        assert head["function_to_apply"] == function and head["source"] == "config.json problem_type"
        model = AutoModelForSequenceClassification.from_pretrained(str(heads[name])).eval()
        tokens = AutoTokenizer.from_pretrained(str(heads[name]))(HEAD_TEXTS, padding=True, return_tensors="pt")
        with torch.no_grad():
            logits = model(**tokens).logits.double().numpy()
        scores = 1 / (1 + np.exp(-logits)) if function == "sigmoid" else logits
        labels = [model.config.id2label[i] for i in range(logits.shape[1])]
        want = [dict(zip(labels, row)) for row in scores]
        got = classify_grpc(tasks, name)
        assert_scores(got, want)
        assert_scores(got, by_label(text_pipeline(heads[name])(HEAD_TEXTS)))   # the pipeline's own default
        body = http.post("/v1/classify", json={"model": name, "inputs": HEAD_TEXTS}).json()
        assert body["labels"] == labels and body["version"] == 1
        assert_scores(by_label(body["results"]), want)
    sums = [sum(row.values()) for row in classify_grpc(tasks, MULTI)]
    assert all(abs(s - 1) > 0.1 for s in sums), sums
    softmax = classify_grpc(tasks, MULTI, "softmax")   # what the server answered before: far from the sigmoid
    assert max(abs(softmax[i][k] - v) for i, row in enumerate(classify_grpc(tasks, MULTI)) for k, v in row.items()) > 0.1


def kserve_classify(http: httpx.Client, model: str, parameters: dict[str, Any]) -> httpx.Response:
    return http.post(f"/v2/models/{model}/infer", json={
        "inputs": [{"name": "text", "datatype": "BYTES", "shape": [len(HEAD_TEXTS)], "data": HEAD_TEXTS}],
        "parameters": parameters})


@pytest.mark.parametrize("function", ["softmax", "sigmoid", "none"])
def test_function_to_apply_on_every_door(tasks: pb_grpc.TaskServiceStub, http: httpx.Client, heads: dict[str, Path],
                                         server: ServerProcess, function: str) -> None:
    """A request's function_to_apply over the recorded one, equal to the pipeline's with the same argument: gRPC
    Classify, KServe text mode (REST and gRPC), /v1/classify and TEI's /predict (raw_scores = "none")."""
    pipe = text_pipeline(heads[MULTI])
    want = by_label(pipe(HEAD_TEXTS, function_to_apply=function))
    assert_scores(classify_grpc(tasks, MULTI, function), want)
    answer = kserve_classify(http, MULTI, {"function_to_apply": function})
    assert answer.status_code == 200, answer.text
    outputs = {o["name"]: o for o in answer.json()["outputs"]}
    labels = list(pipe.model.config.id2label.values())
    probabilities = np.array(outputs["probabilities"]["data"]).reshape(len(HEAD_TEXTS), len(labels))
    assert_scores([dict(zip(labels, row)) for row in probabilities], want)
    from protos import grpc_service_pb2 as kserve_pb
    from protos import grpc_service_pb2_grpc as kserve_grpc

    infer = kserve_pb.ModelInferRequest(model_name=MULTI)
    infer.inputs.add(name="text", datatype="BYTES", shape=[len(HEAD_TEXTS)]).contents.bytes_contents.extend(
        t.encode() for t in HEAD_TEXTS)
    infer.parameters["function_to_apply"].string_param = function
    with grpc.insecure_channel(server.address) as channel:     # KServe text mode on the gRPC door too
        reply = kserve_grpc.GRPCInferenceServiceStub(channel).ModelInfer(infer, timeout=60)
    index = [o.name for o in reply.outputs].index("probabilities")
    grpc_probabilities = np.frombuffer(reply.raw_output_contents[index], dtype="<f4").reshape(probabilities.shape)
    assert_scores([dict(zip(labels, row)) for row in grpc_probabilities], want)
    body = http.post("/v1/classify", json={"model": MULTI, "inputs": HEAD_TEXTS, "function_to_apply": function,
                                           "top_k": 2})
    assert body.status_code == 200, body.text
    top2 = body.json()["results"]
    assert [len(r) for r in top2] == [2] * len(HEAD_TEXTS)
    for row, w in zip(top2, want):
        best = sorted(w.values(), reverse=True)[:2]
        np.testing.assert_allclose([d["score"] for d in row], best, atol=1e-5)
    predict = {"model": MULTI, "inputs": [[t] for t in HEAD_TEXTS]}
    predict.update({"raw_scores": True} if function == "none" else {"function_to_apply": function})
    batch = http.post("/predict", json=predict)
    assert batch.status_code == 200, batch.text
    assert_scores(by_label(batch.json()), want)
    one = http.post("/predict", json={"model": MULTI, "inputs": HEAD_TEXTS[0], "function_to_apply": function}).json()
    assert_scores(by_label([one]), want[:1])
    pair = pipe({"text": HEAD_TEXTS[0], "text_pair": HEAD_TEXTS[1]}, function_to_apply=function)   # a text pair
    got = http.post("/predict", json={"model": MULTI, "inputs": HEAD_TEXTS[:2], "function_to_apply": function}).json()
    assert_scores(by_label([got]), by_label([pair]))


def test_function_to_apply_refused_naming_it(tasks: pb_grpc.TaskServiceStub, http: httpx.Client,
                                             server: ServerProcess) -> None:
    before = batches(server)
    for bad in ("tanh", "Softmax", "x" * 300):
        assert grpc_refused(tasks.Classify, pb.ClassifyRequest(model=MULTI, inputs=[pb.TextInput(text="a")],
                                                               function_to_apply=bad)) == "function_to_apply"
        assert refused(http.post("/v1/classify", json={"model": MULTI, "inputs": "a", "function_to_apply": bad})) \
            == "function_to_apply"
        assert refused(http.post("/predict", json={"model": MULTI, "inputs": "a", "function_to_apply": bad})) \
            == "function_to_apply"
        assert refused(kserve_classify(http, MULTI, {"function_to_apply": bad})) == "parameters.function_to_apply"
    assert refused(http.post("/predict", json={"model": MULTI, "inputs": "a", "raw_scores": True,
                                               "function_to_apply": "sigmoid"})) == "raw_scores"
    assert refused(http.post("/v1/classify", json={"model": MULTI, "inputs": [["a", "b", "c"]]})) == "inputs[0]"
    assert refused(http.post("/v1/classify", json={"model": GPT, "inputs": "a"})) == "model"
    assert batches(server) == before


def test_cross_encoder_activation_recorded_and_served(http: httpx.Client, tasks: pb_grpc.TaskServiceStub,
                                                      heads: dict[str, Path], repository: Path) -> None:
    """A CrossEncoder saved with activation_fn Identity: the package records "none" and rerank / score answer
    CrossEncoder.predict's raw logits; raw_scores still means the logits."""
    from sentence_transformers import CrossEncoder

    head = json.loads((repository / CE_IDENTITY / "1" / "model.json").read_text())["head"]
    assert head == {"function_to_apply": "none", "source": "config_sentence_transformers.json activation_fn"}
    want = np.asarray(CrossEncoder(str(heads[CE_IDENTITY]), device="cpu").predict([(QUERY, d) for d in DOCUMENTS]),
                      dtype=np.float64)
    assert (want < 0).any() or (want > 1).any(), want     # logits, not probabilities
    score = http.post("/v1/score", json={"model": CE_IDENTITY, "text_1": QUERY, "text_2": DOCUMENTS}).json()
    np.testing.assert_allclose([d["score"] for d in score["data"]], want, atol=1e-4)
    for raw in (False, True):
        response = tasks.Rerank(pb.RerankRequest(model=CE_IDENTITY, query=QUERY, documents=DOCUMENTS, raw_scores=raw))
        np.testing.assert_allclose([r.score for r in response.results], want[[r.index for r in response.results]],
                                   atol=1e-4)


# ---------------------------------------------------------------- zero-shot classification

CANDIDATES = ["royalty", "gardening", "sailing boats", "war"]


def zero_shot_reference(checkpoint: Path, texts: list[str], multi_label: bool, template: str | None,
                        candidates: list[str] = CANDIDATES) -> list[dict]:
    from transformers import pipeline

    pipe = pipeline("zero-shot-classification", model=str(checkpoint), device="cpu")
    kwargs = {"hypothesis_template": template} if template else {}
    answers = pipe(texts, candidate_labels=candidates, multi_label=multi_label, **kwargs)
    return answers if isinstance(answers, list) else [answers]


def assert_zero_shot(got: list[tuple[str, list[str], list[float]]], want: list[dict]) -> None:
    """Same sequences, the same score per label, labels best first (labels within float noise of each other may
    come in either order)."""
    for (sequence, labels, scores), w in zip(got, want, strict=True):
        assert sequence == w["sequence"] and sorted(labels) == sorted(w["labels"])
        ref = dict(zip(w["labels"], w["scores"]))
        np.testing.assert_allclose(scores, [ref[label] for label in labels], atol=1e-5)
        assert all(a >= b - 1e-6 for a, b in zip(scores, scores[1:])), scores
        exact = all(abs(a - b) > 1e-4 for a, b in zip(w["scores"], w["scores"][1:]))
        assert labels == w["labels"] or not exact


@pytest.mark.parametrize("name", [NLI_BERT, NLI_ROBERTA])
@pytest.mark.parametrize("multi_label", [False, True])
def test_zero_shot_equals_the_transformers_pipeline(tasks: pb_grpc.TaskServiceStub, http: httpx.Client,
                                                    heads: dict[str, Path], name: str, multi_label: bool) -> None:
    texts = HEAD_TEXTS[:2]
    for template in (None, "It is about {}!"):
        want = zero_shot_reference(heads[name], texts, multi_label, template)
        response = tasks.ZeroShotClassify(pb.ZeroShotClassifyRequest(
            model=name, texts=texts, candidate_labels=CANDIDATES, hypothesis_template=template or "",
            multi_label=multi_label))
        assert response.model == name and response.version == 1 and response.tokens > len(texts) * len(CANDIDATES)
        assert_zero_shot([(r.sequence, list(r.labels), list(r.scores)) for r in response.results], want)
        if not multi_label:
            assert all(abs(sum(r.scores) - 1) < 1e-5 for r in response.results)
        body = http.post("/v1/zero-shot-classification", json={
            "model": name, "inputs": texts, "candidate_labels": ", ".join(CANDIDATES), "multi_label": multi_label,
            **({"hypothesis_template": template} if template else {})})
        assert body.status_code == 200, body.text
        assert_zero_shot([(r["sequence"], r["labels"], r["scores"]) for r in body.json()["results"]], want)
    # One candidate: scored alone (entailment vs contradiction) even without multi_label, as the pipeline does.
    single = tasks.ZeroShotClassify(pb.ZeroShotClassifyRequest(model=name, texts=texts[:1],
                                                               candidate_labels=CANDIDATES[:1]))
    one = zero_shot_reference(heads[name], texts[:1], False, None, CANDIDATES[:1])
    np.testing.assert_allclose(single.results[0].scores, one[0]["scores"], atol=1e-5)
    assert 0 < single.results[0].scores[0] < 1


def test_zero_shot_truncation_cuts_the_text_only(tasks: pb_grpc.TaskServiceStub, heads: dict[str, Path]) -> None:
    """With truncate, a long text is cut and the hypothesis kept, as the pipeline's "only_first" truncation (RoBERTa:
    its package and its tokenizer agree on the 62-token limit the pipeline truncates at); without, refused."""
    long_text = "The king and his soldiers rode to the old castle by the river " * 6     # ~170 tokens
    for multi_label in (False, True):
        want = zero_shot_reference(heads[NLI_ROBERTA], [long_text], multi_label, None)
        response = tasks.ZeroShotClassify(pb.ZeroShotClassifyRequest(
            model=NLI_ROBERTA, texts=[long_text], candidate_labels=CANDIDATES, multi_label=multi_label, truncate=True))
        assert_zero_shot([(r.sequence, list(r.labels), list(r.scores)) for r in response.results], want)
        assert response.tokens == 62 * len(CANDIDATES)
    assert grpc_refused(tasks.ZeroShotClassify, pb.ZeroShotClassifyRequest(
        model=NLI_ROBERTA, texts=[long_text], candidate_labels=CANDIDATES)) == "texts[0]"
    assert grpc_refused(tasks.ZeroShotClassify, pb.ZeroShotClassifyRequest(   # the hypothesis alone is too long
        model=NLI_ROBERTA, texts=["a"], candidate_labels=["x", "castle " * 80], truncate=True)) == "candidate_labels[1]"


def test_zero_shot_refusals_name_the_field(tasks: pb_grpc.TaskServiceStub, http: httpx.Client,
                                           server: ServerProcess) -> None:
    before = batches(server)
    ok = {"model": NLI_BERT, "inputs": ["a text"], "candidate_labels": CANDIDATES}
    for change, field in (({"model": CLASSIFIER}, "model"), ({"model": MULTI}, "model"), ({"model": GPT}, "model"),
                          ({"candidate_labels": []}, "candidate_labels"), ({"candidate_labels": ""}, "candidate_labels"),
                          ({"candidate_labels": ["a", " "]}, "candidate_labels[1]"),
                          ({"candidate_labels": ["a", 3]}, "candidate_labels[1]"),
                          ({"candidate_labels": [f"l{i}" for i in range(2000)]}, "candidate_labels"),
                          ({"inputs": ["a"] * 300}, "candidate_labels"),      # 300 x 4 pairs > 1024 rows
                          ({"inputs": []}, "inputs"), ({"inputs": ["a", 5]}, "inputs[1]"),
                          ({"inputs": ["a", "x" * 100_000]}, "inputs[1]"),
                          ({"hypothesis_template": "no field"}, "hypothesis_template"),
                          ({"hypothesis_template": "{0.__class__}"}, "hypothesis_template"),
                          ({"hypothesis_template": "{} and {}"}, "hypothesis_template"),
                          ({"hypothesis_template": "{:>40}"}, "hypothesis_template"),
                          ({"hypothesis_template": "{"}, "hypothesis_template")):
        assert refused(http.post("/v1/zero-shot-classification", json={**ok, **change})) == field, change
    request = pb.ZeroShotClassifyRequest(model=NLI_BERT, texts=["a"], candidate_labels=CANDIDATES)
    for change, field in (({"model": CLASSIFIER}, "model"), ({"texts": []}, "texts"),
                          ({"candidate_labels": []}, "candidate_labels"),
                          ({"hypothesis_template": "{x}"}, "hypothesis_template"),
                          ({"texts": ["castle " * 300]}, "texts[0]")):   # fits the character bound, not 62 tokens
        changed = pb.ZeroShotClassifyRequest()
        changed.CopyFrom(request)
        for key, value in change.items():
            if isinstance(value, list):
                del getattr(changed, key)[:]
                getattr(changed, key).extend(value)
            else:
                setattr(changed, key, value)
        assert grpc_refused(tasks.ZeroShotClassify, changed) == field, change
    assert batches(server) == before      # every refusal came before compute
    with grpc.insecure_channel(server.address) as channel:
        with pytest.raises(grpc.RpcError) as info:
            pb_grpc.TaskServiceStub(channel).ZeroShotClassify(pb.ZeroShotClassifyRequest(model="nope", texts=["a"],
                                                                                         candidate_labels=["b"]))
    assert info.value.code() == grpc.StatusCode.NOT_FOUND


def test_client_library_zero_shot_and_function_to_apply(server: ServerProcess, heads: dict[str, Path]) -> None:
    import asyncio

    from clients import AsyncOrtserveClient, OrtserveClient, OrtserveError

    want = zero_shot_reference(heads[NLI_BERT], HEAD_TEXTS, True, None)
    with OrtserveClient(server.address, timeout=60) as client:
        got = client.zero_shot_classify(HEAD_TEXTS, CANDIDATES, NLI_BERT, multi_label=True)
        assert_zero_shot([(r.sequence, r.labels, r.scores) for r in got], want)
        raw = client.classify(HEAD_TEXTS, MULTI, function_to_apply="none")
        assert_scores([{s.label: s.score for s in r.scores} for r in raw],
                      by_label(text_pipeline(heads[MULTI])(HEAD_TEXTS, function_to_apply="none")), atol=1e-4)
        with pytest.raises(OrtserveError, match="function_to_apply"):
            client.classify("a", MULTI, function_to_apply="tanh")
        with pytest.raises(OrtserveError, match="model"):
            client.zero_shot_classify("a", CANDIDATES, CLASSIFIER)

    async def run() -> None:
        async with AsyncOrtserveClient(server.address, timeout=60) as aclient:
            answer = await aclient.zero_shot_classify(HEAD_TEXTS, ", ".join(CANDIDATES), NLI_BERT, multi_label=True)
            assert_zero_shot([(r.sequence, r.labels, r.scores) for r in answer], want)
    asyncio.run(run())


def test_cli_classify_function_to_apply(server: ServerProcess, heads: dict[str, Path],
                                        capsys: pytest.CaptureFixture[str]) -> None:
    from clients.__main__ import main

    code = main(["--address", server.address, "--json", "classify", HEAD_TEXTS[0], "--model", MULTI,
                 "--function-to-apply", "none"])
    out = capsys.readouterr().out
    assert code == 0, out
    got = {s["label"]: s["score"] for s in json.loads(out)[0]["scores"]}
    assert_scores([got], by_label(text_pipeline(heads[MULTI])(HEAD_TEXTS[:1], function_to_apply="none")), atol=1e-4)
