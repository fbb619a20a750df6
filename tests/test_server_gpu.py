"""The CUDA path: sessions on CUDAExecutionProvider, encoder runs through IOBinding, answers equal the CPU's.

Skips (with the reason) where this onnxruntime build has no CUDAExecutionProvider, e.g. the CPU wheel.
"""
from __future__ import annotations

import json
from pathlib import Path

import grpc
import numpy as np
import onnxruntime as ort
import pytest
from server_process import ServerProcess

from protos import ortserve_pb2 as pb
from protos import ortserve_pb2_grpc as pb_grpc

CUDA = "CUDAExecutionProvider"
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(CUDA not in ort.get_available_providers(),
                       reason="this onnxruntime has no CUDAExecutionProvider (CPU build); needs onnxruntime-gpu "
                              "and an NVIDIA GPU"),
]
CLASSIFIER, GPT = "tiny-classifier", "tiny-gpt"


def test_server_runs_encoders_and_decoder_on_cuda(tiny_repository: Path) -> None:
    from tokenizers import Tokenizer

    from testing.offline import greedy_generate

    with ServerProcess(tiny_repository, ["--providers", f"{CUDA},CPUExecutionProvider"],
                       startup_timeout=180) as proc, grpc.insecure_channel(proc.address) as channel:
        stub = pb_grpc.TaskServiceStub(channel)
        info = stub.ModelInfo(pb.ModelInfoRequest(model=CLASSIFIER))
        manifest = json.loads(info.manifest_json)
        assert info.providers[0] == CUDA and info.variant == manifest["default_variant"]["cuda"]

        package = tiny_repository / CLASSIFIER / "1"
        tok = Tokenizer.from_file(str(package / "tokenizer.json"))
        tok.no_padding()
        tok.no_truncation()
        text = "The king rode to the castle."
        ids = np.array([tok.encode(text).ids], dtype=np.int64)
        cpu = ort.InferenceSession(str(package / manifest["variants"][info.variant]), providers=["CPUExecutionProvider"])
        logits = cpu.run(["logits"], {"input_ids": ids, "attention_mask": np.ones_like(ids),
                                      "token_type_ids": np.zeros_like(ids)})[0][0]
        probs = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
        result = stub.Classify(pb.ClassifyRequest(model=CLASSIFIER, inputs=[pb.TextInput(text=text)])).results[0]
        assert result.label == manifest["labels"][int(np.argmax(probs))]
        np.testing.assert_allclose(sorted(s.score for s in result.scores), sorted(probs), atol=1e-3)

        gpt_dir = tiny_repository / GPT / "1"
        gpt_manifest = json.loads((gpt_dir / "model.json").read_text())
        gtok = Tokenizer.from_file(str(gpt_dir / "tokenizer.json"))
        prompt_ids = gtok.encode("To be or not").ids
        session = ort.InferenceSession(str(gpt_dir / "model.onnx"), providers=["CPUExecutionProvider"])
        reference = greedy_generate(session, gpt_manifest, prompt_ids, 4, stop_at_eos=False)
        response = stub.Generate(pb.GenerateRequest(model=GPT, prompt="To be or not", parameters=pb.GenerationParameters(
            max_new_tokens=4, ignore_eos=True)))
        assert stub.ModelInfo(pb.ModelInfoRequest(model=GPT)).providers[0] == CUDA
        # Greedy ids can only differ where two logits tie within CUDA's float error; the first token must agree.
        assert [t.token_id for t in response.tokens][:1] == reference[:1]


def test_session_runner_binds_io_on_cuda(tiny_repository: Path) -> None:
    from server.sessions import SessionRunner

    path = tiny_repository / CLASSIFIER / "1" / "model.onnx"
    runner = SessionRunner(ort.InferenceSession(str(path), providers=[CUDA, "CPUExecutionProvider"]))
    assert runner.use_io_binding
    feeds = {"input_ids": np.array([[2, 40, 41, 3]], np.int64), "attention_mask": np.ones((1, 4), np.int64),
             "token_type_ids": np.zeros((1, 4), np.int64)}
    cpu = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(["logits"], feeds)[0]
    np.testing.assert_allclose(runner.run(feeds)["logits"], cpu, atol=1e-3)


@pytest.fixture(scope="module")
def inplace_fp16_repository(tiny_checkpoints, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny GPT as an in-place package with its fp16 variant (the gate runs it on CUDA here)."""
    from export import ExportConfig, export_checkpoint

    repo = tmp_path_factory.mktemp("inplace-fp16")
    export_checkpoint(ExportConfig(checkpoint=tiny_checkpoints.gpt, task="generate", repository=repo, name=GPT,
                                   cache_layout="inplace", variants=("fp32", "fp16")))
    return repo


def test_inplace_engine_serves_fp16_with_its_cache_on_the_gpu(inplace_fp16_repository: Path) -> None:
    """The in-place engine on CUDA: the gate passed the fp16 variant, the server picks it, its cache lives in GPU
    memory (the log says so), and concurrent greedy streams joining one batch equal an offline run of the same
    fp16 graph on CUDA, one sequence at a time."""
    from tokenizers import Tokenizer

    from testing.offline import greedy_generate

    package = inplace_fp16_repository / GPT / "1"
    manifest = json.loads((package / "model.json").read_text())
    parity = json.loads((package / "parity.json").read_text())
    assert parity["variants"]["fp16"]["passed"] is True, parity["variants"]["fp16"]
    assert manifest["default_variant"]["cuda"] == "fp16"
    tok = Tokenizer.from_file(str(package / "tokenizer.json"))
    prompts = ["To be or not", "ROMEO.", "Now is the winter of our discontent"]
    offline = ort.InferenceSession(str(package / "model.fp16.onnx"), providers=[CUDA])
    want = [greedy_generate(offline, manifest, tok.encode(p).ids, 12, stop_at_eos=False) for p in prompts]
    with ServerProcess(inplace_fp16_repository, ["--providers", f"{CUDA},CPUExecutionProvider", "--max-sequences", "4",
                                                 "--prefill-chunk-tokens", "4"], startup_timeout=180) as proc, \
            grpc.insecure_channel(proc.address) as channel:
        stub = pb_grpc.TaskServiceStub(channel)
        info = stub.ModelInfo(pb.ModelInfoRequest(model=GPT))
        assert info.providers[0] == CUDA and info.variant == "fp16"
        calls = [stub.Generate.future(pb.GenerateRequest(model=GPT, prompt=p, parameters=pb.GenerationParameters(
            max_new_tokens=12, ignore_eos=True))) for p in prompts]
        got = [[t.token_id for t in c.result().tokens] for c in calls]
        log = proc.output(last=400)
    assert "on cuda" in log, log[-2000:]
    assert got == want
