"""The largest allowed token-classify and rerank requests: bounded memory, a loop that keeps answering, memory given
back (issue 40, kind 6; server/admission.py, server/text/prefix_cut.py, server/encoders/memory.py).

The probe's cases: one token-classify request of 1,024 texts x ~3,000 characters with truncation and every label
kept (522,240 entities) stalled gRPC health and HTTP ready for 1.6 s and left RSS ~900 MiB higher; one /v1/rerank
of 1,024 documents x 25,600 characters with truncate took RSS from 342 to 2,405 MiB, most of it still held after.
Here a BERT-shaped token classifier and a cross-encoder with max_length 512 (small widths: what is measured is the
request's own memory and the loop, not the model's) serve with `--max-request-memory-mb 256`, which makes ~512
such texts the largest allowed token-classify request:

- 1,024 texts are refused before compute, INVALID_ARGUMENT / 400 naming `texts` and the limit;
- during the largest allowed request (512 texts, every label kept: 261,120 entities) gRPC health and HTTP ready
  answer within a bound;
- a rerank of 512 documents x 25,600 characters with truncate leaves RSS near where it started.
"""
from __future__ import annotations

import json
import random
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tests.server_process import ServerProcess

from protos import ortserve_pb2 as pb
from protos import ortserve_pb2_grpc as pb_grpc

MAX_LENGTH = 512
LABELS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
WORDS = "the king walked to Ravenspurgh sadly Benedick quarrelled with Dogberry in Messina castle".split()
HEALTH_BOUND_S = 1.0     # the loop's worst answer during the largest allowed request (a shared 2-core machine)
RSS_MARGIN_MIB = 200     # what a rerank may leave behind (before: gigabytes)


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import torch
    import transformers

    from export import ExportConfig, export_checkpoint
    from tests.conftest import family_tokenizers

    root = tmp_path_factory.mktemp("encoder_memory")
    tok_dir = family_tokenizers(root)["wordpiece"]
    vocab = json.loads((tok_dir / "tokenizer.json").read_text())
    size = len(vocab["model"]["vocab"])
    torch.manual_seed(0)
    repo = root / "repo"
    for name, cls, task, extra in (("tok", transformers.BertForTokenClassification, "token-classify",
                                    {"id2label": dict(enumerate(LABELS))}),
                                   ("xenc", transformers.BertForSequenceClassification, "classify", {"num_labels": 1})):
        config = transformers.BertConfig(vocab_size=size, pad_token_id=0, max_position_embeddings=MAX_LENGTH,
                                         hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                         intermediate_size=64, **extra)
        ckpt = root / name
        ckpt.mkdir()
        for f in tok_dir.iterdir():
            (ckpt / f.name).write_bytes(f.read_bytes())
        cls(config).eval().save_pretrained(ckpt)
        export_checkpoint(ExportConfig(checkpoint=ckpt, task=task, repository=repo, name=name, variants=("fp32",)))
    return repo


def _text(rng: random.Random, chars: int) -> str:
    out, n = [], 0
    while n < chars:
        out.append(rng.choice(WORDS))
        n += len(out[-1]) + 1
    return " ".join(out)[:chars]


def _rss_mib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS"):
            return int(line.split()[1]) // 1024
    raise AssertionError("no VmRSS")


def _probe(proc: ServerProcess, stop: threading.Event, worst: list[float]) -> None:
    """gRPC health and HTTP ready, one after the other, until stopped: the worst latency of each."""
    with grpc.insecure_channel(proc.address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        while not stop.is_set():
            started = time.monotonic()
            assert health.Check(health_pb2.HealthCheckRequest(), timeout=30).status == 1
            middle = time.monotonic()
            with urllib.request.urlopen(f"{proc.http_url}/v2/health/ready", timeout=30) as response:
                assert response.status == 200
            worst[0] = max(worst[0], middle - started)
            worst[1] = max(worst[1], time.monotonic() - middle)
            time.sleep(0.02)


def test_the_largest_requests_are_bounded_keep_the_loop_answering_and_give_memory_back(repository: Path) -> None:
    rng = random.Random(0)
    args = ["--http-port", "0", "--max-request-memory-mb", "256"]
    with ServerProcess(repository, args) as proc, \
            grpc.insecure_channel(proc.address, options=[("grpc.max_receive_message_length", 256 << 20)]) as channel:
        stub = pb_grpc.TaskServiceStub(channel)

        def classify(texts: list[str]) -> pb.TokenClassifyResponse:
            return stub.TokenClassify(pb.TokenClassifyRequest(model="tok", texts=texts, keep_all_labels=True,
                                                              truncate=True), timeout=300)

        # Over the bound: refused by name before compute, on both doors.
        too_many = [_text(rng, 3000) for _ in range(1024)]
        with pytest.raises(grpc.RpcError) as refused:
            classify(too_many)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert refused.value.details().startswith("texts:") and "max_request_memory_mb 256" in refused.value.details()
        body = json.dumps({"model": "tok", "inputs": too_many, "ignore_labels": [], "truncate": True}).encode()
        request = urllib.request.Request(f"{proc.http_url}/v1/token-classify", data=body,
                                         headers={"content-type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as http_refused:
            urllib.request.urlopen(request, timeout=300)
        assert http_refused.value.code == 400 and "max_request_memory_mb" in http_refused.value.read().decode()

        # The largest allowed: the loop keeps answering meanwhile.
        stop, worst = threading.Event(), [0.0, 0.0]
        prober = threading.Thread(target=_probe, args=(proc, stop, worst))
        prober.start()
        try:
            started = time.monotonic()
            answer = classify(too_many[:512])
            took = time.monotonic() - started
        finally:
            stop.set()
            prober.join()
        assert sum(len(r.entities) for r in answer.results) == 512 * (MAX_LENGTH - 2)   # [CLS] and [SEP] left out
        assert max(worst) < HEALTH_BOUND_S, worst

        # A rerank of long documents with truncate: memory comes back. A first small one grows the cross-encoder
        # session's own buffers (a batch's worth, kept by onnxruntime for the next batch).
        documents = [_text(rng, 25_600) for _ in range(512)]
        stub.Rerank(pb.RerankRequest(model="xenc", query="the king", documents=documents[:64], truncate=True),
                    timeout=300)
        time.sleep(7)
        before = _rss_mib(proc.proc.pid)
        ranked = stub.Rerank(pb.RerankRequest(model="xenc", query="the king", documents=documents, truncate=True),
                             timeout=300)
        assert sorted(r.index for r in ranked.results) == list(range(512))
        # The allocator's trims follow a large request (1 s and 5 s after it): RSS must be back within the margin
        # by 7 s after it, polled so that a return at the first trim ends the wait there.
        returned_by = time.monotonic() + 7
        while True:
            after = _rss_mib(proc.proc.pid)
            if after - before < RSS_MARGIN_MIB or time.monotonic() > returned_by:
                break
            time.sleep(0.25)
        assert after - before < RSS_MARGIN_MIB, (before, after)
    print(f"\ntoken-classify of 512 texts (261,120 entities) in {took:.1f}s; worst gRPC health {worst[0] * 1000:.0f} ms,"
          f" HTTP ready {worst[1] * 1000:.0f} ms; rerank of 512 x 25,600 chars: RSS {before} -> {after} MiB")
