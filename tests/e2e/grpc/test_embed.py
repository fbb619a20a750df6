"""The embeddings task end to end: `python -m export --task embed` (the real all-MiniLM-L6-v2 and the tiny MLM
checkpoint), served through every door (gRPC Embed, KServe text mode over gRPC and HTTP, POST /v1/embeddings
with the real `openai` client, the client library, the CLI, the batch script), against sentence-transformers'
own encoding of the same texts.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import grpc
import numpy as np
import openai
import pytest
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
from tests.hf_models import minilm_dir
from tests.server_process import ROOT, ServerProcess, repository_with
from tests.st_models import PROMPTS, save_st

from clients import OrtserveClient
from protos import ortserve_pb2 as pb
from protos import ortserve_pb2_grpc as pb_grpc

MINILM = "minilm"
PROMPTED = "st-prompts"   # a sentence-transformers 6 model with prompts (tests/st_models.py)
TEXTS = ["A man is eating food.",
         "Now is the winter of our discontent made glorious summer by this sun of York; and all the clouds that "
         "lour'd upon our house in the deep bosom of the ocean buried.",
         "ünïcödé, émojis 🙂 and   odd   spacing",
         "To be"]  # different lengths: one request is one padded batch


@pytest.fixture(scope="module")
def embed_repository(tiny_repository: Path, tiny_checkpoints, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """minilm (sentence-transformers config: mean pooling, normalized) through the CLI as `python -m pipeline --embed
    minilm` runs it (`python -m export <MiniLM> --task embed`), tiny-embed (the tiny MLM checkpoint, no
    sentence-transformers files: --pooling cls --normalize off) through the library, tiny-gpt beside them."""
    from tests.conftest import one_torch_thread

    from export import ExportConfig, export_checkpoint
    from pipeline.publish import publish

    root = tmp_path_factory.mktemp("embed")
    repo = repository_with(tiny_repository, root / "repo", "tiny-gpt")
    # The pipeline's publish of the embed stage (test_pipeline_embed_minilm_publishes_once then finds it held: one
    # MiniLM export, the costliest step here, for the module).
    cfg = pipeline_config(root, repo)
    log = root / "export.log"
    assert publish(repo, MINILM, "embed", cfg.embed_checkpoint, cfg.variants["embed"], log_file=log) == 1
    assert "published" in log.read_text()
    with one_torch_thread():
        export_checkpoint(ExportConfig(checkpoint=tiny_checkpoints.mlm, task="embed", repository=repo,
                                       name="tiny-embed", pooling="cls", normalize="off"))
        export_checkpoint(ExportConfig(checkpoint=st_prompts_dir(tiny_checkpoints, tmp_path_factory),
                                       task="embed", repository=repo, name=PROMPTED))
    return repo


def pipeline_config(root: Path, repository: Path):  # type: ignore[no-untyped-def]
    """`python -m pipeline --embed minilm`'s settings (what scripts/serve.sh runs)."""
    from pipeline.cli import parse_args

    return parse_args(["--workdir", str(root / "work"), "--repository", str(repository), "--embed", "minilm"])


_ST_DIRS: dict[str, Path] = {}


def st_prompts_dir(tiny_checkpoints, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A sentence-transformers 6 model over the tiny BERT: mean pooling, Dense(64 -> 32, tanh), Normalize, prompts
    "query" (the default) and "passage"."""
    if "st" not in _ST_DIRS:
        _ST_DIRS["st"] = save_st(tiny_checkpoints.mlm, tmp_path_factory.mktemp("st") / "st", "mean",
                                 prompts=PROMPTS, default_prompt_name="query")
    return _ST_DIRS["st"]


@pytest.fixture(scope="module")
def server(embed_repository: Path) -> Iterator[ServerProcess]:
    proc = ServerProcess(embed_repository, ["--http-port", "0", "--max-queue-delay-ms", "5"])
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def reference() -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(minilm_dir()), device="cpu")
    return model.encode(TEXTS, batch_size=len(TEXTS), convert_to_numpy=True)


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


def test_manifest_records_pooling(embed_repository: Path) -> None:
    m = json.loads((embed_repository / MINILM / "1" / "model.json").read_text())
    assert m["task"] == "embed" and m["max_length"] == 256
    assert m["embedding"] == {"pooling": "mean", "normalize": True, "dimension": 384,
                              "pooling_source": "sentence-transformers config", "matryoshka": False,
                              "modules": ["Transformer", "Pooling", "Normalize"], "prompts": {},
                              "default_prompt_name": None}
    assert m["outputs"] == [{"name": "embeddings", "dtype": "float32", "shape": ["batch", 384]}]
    parity = json.loads((embed_repository / MINILM / "1" / "parity.json").read_text())
    assert parity["passed"] and parity["variants"]["fp32"]["min_cosine"] >= 0.99999
    assert parity["variants"]["fp32"]["reference"] == "sentence-transformers"
    tiny = json.loads((embed_repository / "tiny-embed" / "1" / "model.json").read_text())
    assert tiny["embedding"]["pooling"] == "cls" and tiny["embedding"]["normalize"] is False


def test_grpc_embed_equals_sentence_transformers(server: ServerProcess, reference: np.ndarray) -> None:
    with grpc.insecure_channel(server.address) as channel:
        response = pb_grpc.TaskServiceStub(channel).Embed(pb.EmbedRequest(model=MINILM, texts=TEXTS))
    got = np.array([e.values for e in response.embeddings], dtype=np.float32)
    assert response.dimension == 384 and response.normalized and response.version == 1
    assert got.shape == reference.shape == (len(TEXTS), 384)
    assert (cosine(got, reference) >= 0.99999).all(), cosine(got, reference)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    assert [e.tokens for e in response.embeddings][3] == 4  # [CLS] to be [SEP]


def test_openai_embeddings_equal_grpc(server: ServerProcess, reference: np.ndarray) -> None:
    client = openai.OpenAI(base_url=f"{server.http_url}/v1", api_key="x", max_retries=0)
    as_base64 = client.embeddings.create(model=MINILM, input=TEXTS)  # the client asks base64 by default
    as_float = client.embeddings.create(model=MINILM, input=TEXTS, encoding_format="float")
    one = client.embeddings.create(model=MINILM, input=TEXTS[0])
    a = np.array([d.embedding for d in as_base64.data], dtype=np.float32)
    b = np.array([d.embedding for d in as_float.data], dtype=np.float32)
    np.testing.assert_array_equal(a, b)
    assert [d.index for d in as_float.data] == [0, 1, 2, 3] and as_float.model == MINILM
    assert (cosine(a, reference) >= 0.99999).all()
    assert cosine(np.array(one.data[0].embedding), reference[0]) >= 0.99999
    with OrtserveClient(server.address, timeout=30) as grpc_client:
        vectors = grpc_client.embed(TEXTS, MINILM)
    assert as_float.usage.prompt_tokens == sum(v.tokens for v in vectors) == as_float.usage.total_tokens
    np.testing.assert_allclose(b, np.array([v.values for v in vectors]), rtol=1e-6, atol=1e-7)
    with pytest.raises(openai.BadRequestError) as info:
        client.embeddings.create(model="tiny-gpt", input="x")
    assert "not embed" in info.value.body["message"]
    with pytest.raises(openai.BadRequestError) as dims:
        client.embeddings.create(model=MINILM, input="x", dimensions=128)
    assert dims.value.body["param"] == "dimensions"
    with pytest.raises(openai.BadRequestError) as tokens:
        client.embeddings.create(model=MINILM, input=[[1, 2, 3]])
    assert tokens.value.body["param"] == "input"


def test_async_client_embed_equals_sync(server: ServerProcess) -> None:
    import asyncio

    from clients import AsyncOrtserveClient

    async def run() -> list:
        async with AsyncOrtserveClient(server.address, timeout=30) as client:
            return await client.embed(TEXTS, MINILM)

    got = asyncio.run(run())
    with OrtserveClient(server.address, timeout=30) as client:
        ref = client.embed(TEXTS, MINILM)
    assert [v.tokens for v in got] == [v.tokens for v in ref] and all(v.normalized for v in got)
    np.testing.assert_allclose(np.array([v.values for v in got]), np.array([v.values for v in ref]), atol=1e-6)


def test_kserve_text_mode_grpc_and_http(server: ServerProcess, reference: np.ndarray) -> None:
    texts = np.array([t.encode() for t in TEXTS], dtype=object)
    g = tgrpc.InferInput("text", [len(TEXTS)], "BYTES")
    g.set_data_from_numpy(texts)
    via_grpc = tgrpc.InferenceServerClient(server.address).infer(MINILM, [g]).as_numpy("embedding")
    h = thttp.InferInput("text", [len(TEXTS)], "BYTES")
    h.set_data_from_numpy(texts)
    http_client = thttp.InferenceServerClient(f"{server.host}:{server.http_port}")
    try:
        via_http = http_client.infer(MINILM, [h]).as_numpy("embedding")
    finally:
        http_client.close()
    assert via_grpc.shape == (len(TEXTS), 384) and via_grpc.dtype == np.float32
    np.testing.assert_allclose(via_http, via_grpc, rtol=1e-6, atol=1e-7)
    assert (cosine(via_grpc, reference) >= 0.99999).all()


def test_tiny_cls_embedding_equals_torch(server: ServerProcess, tiny_checkpoints) -> None:
    """The non-sentence-transformers path: [CLS] pooling, not normalized, against the training model."""
    import torch

    from training.checkpoint import load_model

    model, _ = load_model(tiny_checkpoints.mlm, kind="bert-classifier", num_labels=2)
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tiny_checkpoints.mlm / "tokenizer.json"))
    tok.no_padding()
    tok.no_truncation()
    with OrtserveClient(server.address, timeout=30) as client:
        got = client.embed(["the king sat", "a boat"], "tiny-embed")
    for text, vector in zip(["the king sat", "a boat"], got):
        ids = torch.tensor([tok.encode(text).ids])
        with torch.no_grad():
            expected = model.encode(ids, torch.ones_like(ids), torch.zeros_like(ids))[0, 0].numpy()
        np.testing.assert_allclose(np.array(vector.values), expected, rtol=1e-4, atol=1e-4)
        assert not vector.normalized


def test_cli_and_batch_embed(server: ServerProcess, embed_repository: Path, tmp_path: Path) -> None:
    cli = subprocess.run([sys.executable, "-m", "clients", "--address", server.address, "--json", "embed",
                          "--model", MINILM, *TEXTS[:2]], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert cli.returncode == 0, cli.stderr
    printed = json.loads(cli.stdout)
    assert len(printed) == 2 and len(printed[0]["values"]) == 384 and printed[0]["normalized"] is True
    human = subprocess.run([sys.executable, "-m", "clients", "--address", server.address, "embed", "--model",
                            MINILM, TEXTS[0]], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert human.returncode == 0 and "dim 384" in human.stdout and "norm 1.0000" in human.stdout

    source = tmp_path / "texts.txt"
    source.write_text("\n".join(TEXTS) + "\n")
    outputs = []
    for where in (["--address", server.address], ["--local", str(embed_repository)]):
        out = tmp_path / f"out-{len(outputs)}.jsonl"
        run = subprocess.run([sys.executable, "-m", "clients.batch", "embed", str(source), "-o", str(out),
                              "--model", MINILM, "--no-progress", *where], cwd=ROOT, capture_output=True, text=True,
                             timeout=300)
        assert run.returncode == 0, run.stderr[-2000:]
        outputs.append([json.loads(line) for line in out.read_text().splitlines()])
    for a, b in zip(*outputs, strict=True):
        assert a["id"] == b["id"] and a["tokens"] == b["tokens"]
        assert cosine(np.array(a["embedding"]), np.array(b["embedding"])) >= 0.99999


def test_export_validate_reruns_the_embedding_gate(embed_repository: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "export", "validate", str(embed_repository / MINILM / "1")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "parity OK" in done.stdout and "min cosine" in done.stdout


def test_export_embed_refuses_a_decoder(tiny_checkpoints, tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "export", str(tiny_checkpoints.gpt), "--task", "embed",
                           "--repository", str(tmp_path), "--name", "x"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2 and "--task embed" in done.stderr and "Traceback" not in done.stderr


def test_pipeline_embed_minilm_publishes_once(embed_repository: Path, tmp_path: Path) -> None:
    """`python -m pipeline --embed minilm` (what scripts/serve.sh runs): the MiniLM package (version 1: published by
    the embed_repository fixture with these settings), skipped once held."""
    from pipeline.publish import publish

    repo = repository_with(embed_repository, tmp_path / "repo", MINILM)   # a copy: the module's server serves it
    cfg = pipeline_config(tmp_path, repo)
    assert cfg.embed_checkpoint == minilm_dir() and cfg.names["embed"] == MINILM
    assert publish(cfg.repository, MINILM, "embed", cfg.embed_checkpoint, cfg.variants["embed"]) is None
    assert sorted(p.name for p in (repo / MINILM).iterdir() if p.name.isdigit()) == ["1"]


def test_embed_gate_breach_publishes_nothing(tiny_checkpoints, tmp_path: Path) -> None:
    """The embedding builder's refusal goes through the shared skeleton: its own failure lines, parity.json's
    report on the exception, no version directory and no staging left behind."""
    from export import ExportConfig, ParityFailure, Tolerances, export_checkpoint

    cfg = ExportConfig(checkpoint=tiny_checkpoints.mlm, task="embed", repository=tmp_path, name="tight",
                       tolerances=Tolerances(fp32_atol=-1.0, fp32_noise_factor=0.0))   # a limit no graph can meet
    with pytest.raises(ParityFailure) as caught:
        export_checkpoint(cfg)
    message = str(caught.value)
    assert message.startswith("parity gate failed for tight; nothing published\n  batch1: max |onnx - torch|")
    assert caught.value.report["passed"] is False and caught.value.report["variants"]["fp32"]["status"] == "FAILED"
    assert not (tmp_path / "tight").exists()


@pytest.fixture(scope="module")
def prompted_reference(tiny_checkpoints, tmp_path_factory: pytest.TempPathFactory):
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(st_prompts_dir(tiny_checkpoints, tmp_path_factory)), device="cpu")
    return {name: model.encode(TEXTS, prompt_name=name, batch_size=len(TEXTS)) for name in (None, "passage")}


def _close(got, ref: np.ndarray) -> None:
    got = np.asarray(got, dtype=np.float32)
    assert got.shape == ref.shape == (len(TEXTS), 32)
    assert (cosine(got, ref) >= 0.9999).all(), cosine(got, ref)
    np.testing.assert_allclose(got, ref, atol=1e-4)


def test_prompt_name_through_grpc_and_http(server: ServerProcess, prompted_reference) -> None:
    """The named prompt (and, unnamed, the default one) prepended as SentenceTransformer.encode does, through gRPC
    Embed, the client library, /v1/embeddings and TEI's /embed; an unknown name is refused naming prompt_name."""
    import httpx2 as httpx

    default, passage = prompted_reference[None], prompted_reference["passage"]
    assert not np.allclose(default, passage, atol=1e-3)      # the two prompts give different vectors
    with grpc.insecure_channel(server.address) as channel:
        stub = pb_grpc.TaskServiceStub(channel)
        named = stub.Embed(pb.EmbedRequest(model=PROMPTED, texts=TEXTS, prompt_name="passage"))
        unnamed = stub.Embed(pb.EmbedRequest(model=PROMPTED, texts=TEXTS))
        with pytest.raises(grpc.RpcError) as unknown:
            stub.Embed(pb.EmbedRequest(model=PROMPTED, texts=TEXTS, prompt_name="nope"))
        with pytest.raises(grpc.RpcError) as none_known:
            stub.Embed(pb.EmbedRequest(model=MINILM, texts=TEXTS, prompt_name="query"))
    _close([e.values for e in named.embeddings], passage)
    _close([e.values for e in unnamed.embeddings], default)
    assert unknown.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert unknown.value.details().startswith("prompt_name") and "passage, query" in unknown.value.details()
    assert none_known.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "known: none" in none_known.value.details()
    with OrtserveClient(server.address, timeout=30) as client:
        _close([v.values for v in client.embed(TEXTS, PROMPTED, prompt_name="passage")], passage)
    cli = subprocess.run([sys.executable, "-m", "clients", "--address", server.address, "--json", "embed", "--model",
                          PROMPTED, "--prompt-name", "passage", *TEXTS], cwd=ROOT, capture_output=True, text=True,
                         timeout=60)
    assert cli.returncode == 0, cli.stderr
    _close([v["values"] for v in json.loads(cli.stdout)], passage)

    openai_client = openai.OpenAI(base_url=f"{server.http_url}/v1", api_key="x", max_retries=0)
    answer = openai_client.embeddings.create(model=PROMPTED, input=TEXTS, encoding_format="float",
                                             extra_body={"prompt_name": "passage"})
    _close([d.embedding for d in answer.data], passage)
    _close([d.embedding for d in openai_client.embeddings.create(model=PROMPTED, input=TEXTS,
                                                                 encoding_format="float").data], default)
    with pytest.raises(openai.BadRequestError) as refused:
        openai_client.embeddings.create(model=PROMPTED, input=TEXTS, extra_body={"prompt_name": "nope"})
    assert refused.value.body["param"] == "prompt_name" and "passage, query" in refused.value.body["message"]

    with httpx.Client(base_url=server.http_url, timeout=30) as http:
        tei = http.post("/embed", json={"model": PROMPTED, "inputs": TEXTS, "prompt_name": "passage"})
        assert tei.status_code == 200, tei.text
        _close(tei.json(), passage)
        bad = http.post("/embed", json={"model": PROMPTED, "inputs": TEXTS, "prompt_name": "nope"})
        assert bad.status_code == 400 and bad.json()["error"].startswith("prompt_name")
        # TEI normalizes by default: the tiny cls model's raw vectors come back with unit length
        unit = http.post("/embed", json={"model": "tiny-embed", "inputs": ["the king sat"]})
        assert unit.status_code == 200 and abs(np.linalg.norm(unit.json()[0]) - 1.0) < 1e-5
        kept = http.post("/embed", json={"model": PROMPTED, "inputs": "x", "normalize": False})
        assert kept.status_code == 400 and kept.json()["error"].startswith("normalize")
