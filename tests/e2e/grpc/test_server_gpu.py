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
from tests.cuda import CUDA, NEEDS_CUDA
from tests.server_process import ServerProcess

from protos import ortserve_pb2 as pb
from protos import ortserve_pb2_grpc as pb_grpc

pytestmark = NEEDS_CUDA
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
                                   variants=("fp32", "fp16")))
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


# ---------------------------------------------------------------- encoder-decoders and weight-quantized decoders


S2S_NAMES = ("marian", "t5")
S2S_SOURCES = ["hello world", "a", "the quick brown fox", "translation, at last!"]


@pytest.fixture(scope="module")
def seq2seq_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("transformers")
    from testing.seq2seq_checkpoints import export_repository

    packages = export_repository(tmp_path_factory.mktemp("seq2seq-cuda"), S2S_NAMES)
    return packages[S2S_NAMES[0]].parent.parent


def _seq2seq_answers(repository: Path, providers: str) -> tuple[dict, str, list[str]]:
    """Greedy (with logprobs) and beam-4 answers of every package, the sources sent together (one batch)."""
    from concurrent.futures import ThreadPoolExecutor

    from clients import OrtserveClient

    answers: dict = {}
    with ServerProcess(repository, ["--providers", providers, "--max-sequences", "8"], startup_timeout=180) as proc, \
            OrtserveClient(proc.address, timeout=120) as client, ThreadPoolExecutor(len(S2S_SOURCES)) as pool:
        served_on = [client.model_info(n).providers[0] for n in S2S_NAMES]
        for name in S2S_NAMES:
            greedy = list(pool.map(lambda s: client.generate(s, name, max_new_tokens=9, logprobs=True), S2S_SOURCES))
            beams = list(pool.map(lambda s: client.generate(s, name, max_new_tokens=9, num_beams=4), S2S_SOURCES))
            answers[name] = ([[t.token_id for t in r.tokens] for r in greedy],
                             [[t.logprob for t in r.tokens] for r in greedy],
                             [[t.token_id for t in r.tokens] for r in beams])
        log = proc.output(last=400)
    return answers, log, served_on


# onnxruntime's CUDA provider runs fp32 MatMul in TF32 by default (10-bit mantissa): logprobs move by ~1e-3-1e-2,
# so CUDA's greedy ids may part from the CPU's where two tokens tie within that.
TF32_LOGPROB_ATOL = 2e-2


def _cpu_logprobs(package: Path, source: str, ids: list[int]) -> np.ndarray:
    """Teacher-forced log-softmax rows of the CPU offline decoder for target `ids` (row i predicts ids[i])."""
    from tokenizers import Tokenizer

    from testing.seq2seq_offline import load_package, stepped_logits

    pkg = load_package(package)
    src = Tokenizer.from_file(str(package / "tokenizer.json")).encode(source).ids
    rows = stepped_logits(pkg, src, [pkg.spec.decoder_start_token_id, *ids[:-1]]).astype(np.float64)
    rows -= rows.max(axis=1, keepdims=True)
    return rows - np.log(np.exp(rows).sum(axis=1, keepdims=True))


def test_seq2seq_engine_serves_on_cuda_and_answers_as_the_cpu_does(seq2seq_repository: Path) -> None:
    """Marian and T5 through the one engine with CUDA first: the encoder runs and the cross keys/values live on the
    GPU; the fp32 self cache stays in host memory, where the self-attention op runs (onnxruntime's CUDA
    GroupQueryAttention takes fp16 only; a self cache bound in GPU memory gave wrong answers from the second
    token on, measured on an H100 with onnxruntime-gpu 1.31: logprobs off by up to 0.98). Each greedy token of a
    batch of four is the CPU offline decoder's choice (or ties with it within TF32's error) and its logprob is the
    CPU's within that error; beam-4 answers (slot forks copied on the device) equal the CPU server's, or score
    the same under the CPU decoder."""
    cuda, cuda_log, cuda_on = _seq2seq_answers(seq2seq_repository, f"{CUDA},CPUExecutionProvider")
    cpu, _, cpu_on = _seq2seq_answers(seq2seq_repository, "CPUExecutionProvider")
    assert cuda_on == [CUDA] * len(S2S_NAMES) and cpu_on == ["CPUExecutionProvider"] * len(S2S_NAMES)
    assert "cache stays in host memory" in cuda_log and "of float32 on cpu" in cuda_log, cuda_log[-2000:]
    for name in S2S_NAMES:
        package = seq2seq_repository / name / "1"
        spec = json.loads((package / "model.json").read_text())["encoder_decoder"]
        (ids, logprobs, beams), (cpu_ids, _, cpu_beams) = cuda[name], cpu[name]
        worst_lp, worst_tie, departures = 0.0, 0.0, 0
        for source, row_ids, row_lp in zip(S2S_SOURCES, ids, logprobs, strict=True):
            rows = _cpu_logprobs(package, source, row_ids)
            forced = {0: spec.get("forced_bos_token_id"), len(row_ids) - 1: spec.get("forced_eos_token_id")}
            for i, (token, lp) in enumerate(zip(row_ids, row_lp, strict=True)):
                if forced.get(i) is not None:
                    continue
                worst_lp = max(worst_lp, abs(lp - rows[i, token]))
                tie = float(rows[i].max() - rows[i, token])
                worst_tie, departures = max(worst_tie, tie), departures + (tie > 0)
        print(f"{name}: greedy equal to the CPU server's {ids == cpu_ids}, largest logprob difference "
              f"{worst_lp:.2e}, {departures} steps off the CPU argmax (by at most {worst_tie:.2e}), "
              f"beams equal {beams == cpu_beams}")
        assert worst_lp <= TF32_LOGPROB_ATOL and worst_tie <= 2 * TF32_LOGPROB_ATOL, name
        for source, got, want in zip(S2S_SOURCES, beams, cpu_beams, strict=True):
            if got != want:
                score = {tuple(h): _cpu_logprobs(package, source, h)[np.arange(len(h)), h].sum() / len(h)
                         for h in (got, want)}
                assert abs(score[tuple(got)] - score[tuple(want)]) <= 2 * TF32_LOGPROB_ATOL, (name, source, score)


def test_weight_quantized_variants_run_their_matmuls_on_cuda(tiny_checkpoints, tmp_path: Path) -> None:
    """w8 / w4 graphs (MatMulNBits) on a CUDA session: onnxruntime's profile places every MatMulNBits node on the
    CUDA provider, and each step's logits on CUDA are within 3e-2 of the same graph's on the CPU while the greedy
    ids agree (CPU accuracy level 4 quantizes activations to int8, CUDA does not: export/config.py's
    weights_mixed_atol is the gate's bound for such differences)."""
    from tokenizers import Tokenizer

    from export import ExportConfig, export_checkpoint
    from export.config import Tolerances
    from testing.offline import greedy_inplace

    export_checkpoint(ExportConfig(checkpoint=tiny_checkpoints.gpt, task="generate", repository=tmp_path, name=GPT,
                                   variants=("fp32", "w8", "w4")))
    package = tmp_path / GPT / "1"
    manifest = json.loads((package / "model.json").read_text())
    tok = Tokenizer.from_file(str(package / "tokenizer.json"))
    ids = tok.encode("To be or not to be, that is the question").ids
    atol = Tolerances().weights_mixed_atol
    for variant in ("w8", "w4"):
        path = str(package / manifest["variants"][variant])
        opts = ort.SessionOptions()
        opts.enable_profiling = True
        opts.profile_file_prefix = str(tmp_path / f"profile-{variant}")
        on_cuda = ort.InferenceSession(path, opts, providers=[CUDA, "CPUExecutionProvider"])
        cuda_logits: list[np.ndarray] = []
        got = greedy_inplace(on_cuda, manifest, ids, 8, stop_at_eos=False, step_logits=cuda_logits)
        events = json.loads(Path(on_cuda.end_profiling()).read_text())
        placed = {(e["args"].get("op_name"), e["args"].get("provider")) for e in events
                  if e.get("cat") == "Node" and "op_name" in e.get("args", {})}
        assert {p for op, p in placed if op == "MatMulNBits"} == {CUDA}, (variant, sorted(placed))
        print(variant, "placement:", sorted(placed))
        cpu_logits: list[np.ndarray] = []
        want = greedy_inplace(ort.InferenceSession(path, providers=["CPUExecutionProvider"]), manifest, ids, 8,
                              stop_at_eos=False, step_logits=cpu_logits)
        same = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), len(got))
        worst = max(float(np.abs(a - b).max()) for a, b in zip(cuda_logits[:same + 1], cpu_logits[:same + 1]))
        print(variant, "cuda", got, "cpu", want, "largest logit difference", worst)
        assert same >= 1 and worst <= atol, (variant, got, want, worst)
