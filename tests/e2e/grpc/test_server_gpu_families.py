"""The families added for Hub checkpoints, in fp16 on CUDA: Llama 3 (rope scaling), Qwen3, SmolLM3, Phi-3, Gemma 2 / 3
decoders and XLM-RoBERTa, ModernBERT, DeBERTa-v3 classifiers, each exported with `--variants fp32,fp16`, the fp16
variant judged by the parity gate on CUDA (decoders: teacher-forced KL and perplexity against PyTorch fp32;
encoders: top-1 agreement), then served on CUDA.

Decoders: three prompts sent together (one batch, chunked prefill) — every served token is the fp16 graph's own
choice run offline on CUDA one sequence at a time, or ties with it within fp16's rounding, and its logprob is the
offline one within that. Encoders: the CUDA server's scores equal the CPU server's (fp32) within fp16's error.

Skips (with the reason) where onnxruntime has no CUDAExecutionProvider, e.g. the CPU wheel.
"""
from __future__ import annotations

import json
import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from tests.cuda import CUDA, NEEDS_CUDA
from tests.server_process import ServerProcess

pytestmark = NEEDS_CUDA
LLAMA_FAMILY = ("llama3", "qwen3", "smollm3", "phi3")
GEMMA = ("gemma2", "gemma3")
PROMPTS = ["To be or not", "ROMEO.", "Now is the winter of our discontent made glorious summer"]
NEW_TOKENS = 12
# A batched fp16 step and a one-row one sum in other orders (other kernels, other tilings): logits move within
# fp16's rounding, so a served greedy token may be the offline run's runner-up where the two are that close.
FP16_LOGPROB_ATOL = 2e-2
TEXTS = ["Now is the winter of our discontent", "A horse! a horse! my kingdom for a horse!", "To be",
         "The quality of mercy is not strained; it droppeth as the gentle rain from heaven"]


def _export(checkpoint: Path, task: str, repo: Path, name: str) -> dict:
    from export import ExportConfig, export_checkpoint

    result = export_checkpoint(ExportConfig(checkpoint=checkpoint, task=task, repository=repo, name=name,
                                            variants=("fp32", "fp16")))
    fp16 = result.parity["variants"]["fp16"]
    print(f"{name}: fp16 gate passed={fp16['passed']}", json.dumps(fp16.get("checks", fp16))[:600])
    return fp16


@pytest.fixture(scope="module")
def decoders(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, dict]]:
    from tests.conftest import tiny_corpus
    from tests.gemma_models import hf_gemma
    from tests.llama_models import VOCAB, hf_model
    from training.tokenizer import TokenizerConfig, save_tokenizer, train_tokenizer

    logging.getLogger("transformers").setLevel(logging.ERROR)
    root = tmp_path_factory.mktemp("fp16-decoders")
    tok = train_tokenizer(tiny_corpus(), TokenizerConfig(kind="bpe", vocab_size=VOCAB, min_frequency=1))
    tok_dir = save_tokenizer(tok, root / "tok", "bpe", 62)
    gates = {}
    for name in (*LLAMA_FAMILY, *GEMMA):
        vocab = tok.get_vocab_size()
        hf = hf_gemma(name, vocab=vocab) if name in GEMMA else hf_model(name, vocab_size=vocab)
        hf.save_pretrained(root / name)
        for f in tok_dir.iterdir():
            (root / name / f.name).write_bytes(f.read_bytes())
        gates[name] = _export(root / name, "generate", root / "repo", name)
    return root / "repo", gates


@pytest.fixture(scope="module")
def encoders(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, dict]]:
    from tests import deberta_models, modernbert_models, xlmr_models

    logging.getLogger("transformers").setLevel(logging.ERROR)
    root = tmp_path_factory.mktemp("fp16-encoders")
    sources = {
        "xlm-roberta": xlmr_models.build_checkpoints(root / "xlmr")["classify"],
        "modernbert": modernbert_models.build_checkpoints(root / "modernbert")["classify"],
        # trained a little: fp16 is judged by top-1 agreement, which a random head's near ties make a coin toss
        "deberta-v3": deberta_models.save_checkpoint(root / "deberta", "DebertaV2ForSequenceClassification",
                                                     deberta_models.unigram_tokenizer(root / "deberta-tok"),
                                                     train_steps=40),
    }
    gates = {name: _export(path, "classify", root / "repo", name) for name, path in sources.items()}
    return root / "repo", gates


def test_fp16_decoders_pass_the_gate_on_cuda_and_serve_as_the_offline_graph(decoders) -> None:
    from clients import OrtserveClient
    from testing.offline import greedy_inplace

    repo, gates = decoders
    refused = {n: g for n, g in gates.items() if not g["passed"]}
    assert not refused, refused
    with ServerProcess(repo, ["--providers", f"{CUDA},CPUExecutionProvider", "--max-sequences", "4",
                              "--prefill-chunk-tokens", "4"], startup_timeout=300) as proc, \
            OrtserveClient(proc.address, timeout=120) as client, ThreadPoolExecutor(len(PROMPTS)) as pool:
        served = {}
        for name in gates:
            info = client.model_info(name)
            assert (info.providers[0], info.variant) == (CUDA, "fp16"), name
            served[name] = list(pool.map(lambda p: client.generate(p, name, max_new_tokens=NEW_TOKENS,
                                                                    ignore_eos=True, logprobs=True), PROMPTS))
        log = proc.output(last=600)
    assert log.count("on cuda") >= len(gates), log[-3000:]
    for name, answers in served.items():
        package = repo / name / "1"
        manifest = json.loads((package / "model.json").read_text())
        offline = ort.InferenceSession(str(package / manifest["variants"]["fp16"]), providers=[CUDA])
        tok = _tokenizer(package)
        worst_lp, worst_tie, departures = 0.0, 0.0, 0
        for prompt, answer in zip(PROMPTS, answers, strict=True):
            ids = [t.token_id for t in answer.tokens]
            assert len(ids) == NEW_TOKENS, (name, prompt)
            steps: list[np.ndarray] = []
            greedy_inplace(offline, manifest, tok.encode(prompt).ids, NEW_TOKENS, stop_at_eos=False,
                           step_logits=steps, forced=ids)
            for row, token, lp in zip(_log_softmax(np.stack(steps)), ids, [t.logprob for t in answer.tokens]):
                worst_lp = max(worst_lp, abs(lp - row[token]))
                tie = float(row.max() - row[token])
                worst_tie, departures = max(worst_tie, tie), departures + (tie > 0)
        print(f"{name}: served fp16 on CUDA vs the offline fp16 graph: largest logprob difference {worst_lp:.2e}, "
              f"{departures} steps off the offline argmax (by at most {worst_tie:.2e})")
        assert worst_lp <= FP16_LOGPROB_ATOL and worst_tie <= FP16_LOGPROB_ATOL, name


def test_fp16_encoders_pass_the_gate_on_cuda_and_answer_as_the_cpu_server(encoders) -> None:
    repo, gates = encoders
    refused = {n: g for n, g in gates.items() if not g["passed"]}
    assert not refused, refused
    cuda = _classify(repo, f"{CUDA},CPUExecutionProvider", gates)
    cpu = _classify(repo, "CPUExecutionProvider", gates)
    for name in gates:
        (cuda_variant, cuda_scores), (cpu_variant, cpu_scores) = cuda[name], cpu[name]
        assert (cuda_variant, cpu_variant) == ("fp16", "fp32"), name
        worst = float(np.abs(cuda_scores - cpu_scores).max())
        print(f"{name}: CUDA fp16 vs CPU fp32 served scores, largest difference {worst:.2e}; labels equal "
              f"{(cuda_scores.argmax(1) == cpu_scores.argmax(1)).all()}")
        assert worst <= FP16_LOGPROB_ATOL, name


def _classify(repo: Path, providers: str, names) -> dict[str, tuple[str, np.ndarray]]:
    """Each model's served variant and its score rows for TEXTS (one request, labels in the manifest's order)."""
    from clients import OrtserveClient

    out = {}
    with ServerProcess(repo, ["--providers", providers], startup_timeout=300) as proc, \
            OrtserveClient(proc.address, timeout=120) as client:
        for name in names:
            labels = json.loads((repo / name / "1" / "model.json").read_text())["labels"]
            results = client.classify(TEXTS, name)
            scores = np.array([[{s.label: s.score for s in r.scores}[label] for label in labels] for r in results])
            out[name] = (client.model_info(name).variant, scores)
    return out


def _tokenizer(package: Path):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(package / "tokenizer.json"))


def _log_softmax(rows: np.ndarray) -> np.ndarray:
    rows = rows.astype(np.float64) - rows.max(axis=1, keepdims=True)
    return rows - np.log(np.exp(rows).sum(axis=1, keepdims=True))
