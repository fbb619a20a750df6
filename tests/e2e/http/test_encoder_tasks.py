"""Encoder tasks beside classify / fill-mask / embed, served through every door against references computed
outside the server:

- /tokenize, /detokenize and the task API's Tokenize / Detokenize for every model kind: an encoder's tokens (ids,
  special marks, offsets) equal transformers' tokenizer on the same checkpoint; round trips;
- `dimensions` on /v1/embeddings and Embed: a Matryoshka-declared MiniLM package (export --matryoshka) answers
  sentence-transformers' full vector cut and renormalised; a package without the declaration refuses;
- rerank and score (/v1/rerank, /v1/score, TEI's /rerank, the task API's Rerank) by a one-label cross-encoder
  (sentence-transformers' CrossEncoder on the same checkpoint) and by the MiniLM embedding model (cosine of
  sentence-transformers' vectors); bad requests refused naming the field, before compute.
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
def repository(tiny_repository: Path, tiny_checkpoints, cross_encoder: Path,
               tmp_path_factory: pytest.TempPathFactory) -> Path:
    """minilm-m (MiniLM declared Matryoshka, through the CLI), tiny-embed (no declaration), tiny-cross (one-label
    pair classifier), and the shared tiny classifier (3 labels) and GPT."""
    from tests.conftest import one_torch_thread

    from export import ExportConfig, export_checkpoint

    repo = repository_with(tiny_repository, tmp_path_factory.mktemp("encoder-tasks") / "repo", CLASSIFIER, GPT)
    done = subprocess.run([sys.executable, "-m", "export", str(minilm_dir()), "--task", "embed", "--repository",
                           str(repo), "--name", MINILM, "--matryoshka"], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    with one_torch_thread():
        export_checkpoint(ExportConfig(checkpoint=tiny_checkpoints.mlm, task="embed", repository=repo, name=PLAIN,
                                       pooling="cls", normalize="off"))
        export_checkpoint(ExportConfig(checkpoint=cross_encoder, task="classify", repository=repo, name=CROSS))
    return repo


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


def test_pipeline_embed_matryoshka_declares_it(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                               tiny_checkpoints) -> None:
    """`python -m pipeline --embed minilm --embed-matryoshka` publishes the package with the declaration; the flag
    without --embed, and `export --matryoshka` of another task, are one-line refusals."""
    from pipeline.cli import parse_args
    from pipeline.run import Pipeline

    cfg = parse_args(["--workdir", str(tmp_path / "work"), "--repository", str(tmp_path / "repo"),
                      "--embed", "minilm", "--embed-matryoshka"])
    assert cfg.embed_matryoshka
    Pipeline(cfg).publish("embed", cfg.embed_checkpoint)
    manifest = json.loads((tmp_path / "repo" / cfg.names["embed"] / "1" / "model.json").read_text())
    assert manifest["embedding"]["matryoshka"] is True
    # The same checkpoint again: nothing new; without the declaration now: a new version that has none.
    again = Pipeline(cfg)
    again.publish("embed", cfg.embed_checkpoint)
    assert again.published == {} and again.skipped == [f"publish-{cfg.names['embed']}"]
    plain = Pipeline(parse_args(["--workdir", str(tmp_path / "work"), "--repository", str(tmp_path / "repo"),
                                 "--embed", "minilm"]))
    plain.publish("embed", cfg.embed_checkpoint)
    assert plain.published == {cfg.names["embed"]: 2}
    manifest = json.loads((tmp_path / "repo" / cfg.names["embed"] / "2" / "model.json").read_text())
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
