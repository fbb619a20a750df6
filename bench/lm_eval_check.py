"""lm-evaluation-harness against the OpenAI door, and against the same checkpoint in-process.

    python -m bench lm_eval_check [--repository model_repository --model gpt --checkpoint artifacts/checkpoints/lm]

A multiple-choice task of famous Shakespeare lines (which word comes next), written here as a local task so nothing
is downloaded. lm-eval scores every choice by its loglikelihood: through ortserve with its `local-completions`
model (token-id prompts, echo, logprobs 1, max_tokens 1: the prompt-scoring path of /v1/completions) and through
its `hf` model (transformers in-process, the reference). The two must pick the same answers, and each choice's
loglikelihood must agree to float tolerance. Needs bench/.venv-lmeval (bash bench/setup_lmeval.sh).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from testing.launch import ServerProcess
from bench.harness import Benchmark
from bench.results import write_json

ROOT = Path(__file__).resolve().parents[1]
VENV = ROOT / "bench" / ".venv-lmeval"
TASK = "shakespeare_next_word"
log = logging.getLogger("bench.lm_eval_check")

# (context, the word that follows, three that do not)
ITEMS = [
    ("To be, or not to be, that is the", "question", ["answer", "point", "matter"]),
    ("Now is the winter of our", "discontent", ["content", "summer", "kingdom"]),
    ("Friends, Romans, countrymen, lend me your", "ears", ["eyes", "hands", "swords"]),
    ("O Romeo, Romeo! wherefore art thou", "Romeo", ["gone", "here", "Juliet"]),
    ("All the world's a", "stage", ["play", "dream", "field"]),
    ("A horse! a horse! my kingdom for a", "horse", ["crown", "sword", "king"]),
    ("The quality of mercy is not", "strained", ["given", "known", "lost"]),
    ("If music be the food of love, play", "on", ["it", "me", "now"]),
    ("Double, double toil and", "trouble", ["labour", "sorrow", "fire"]),
    ("Something is rotten in the state of", "Denmark", ["England", "Rome", "Venice"]),
    ("Good night, good night! parting is such sweet", "sorrow", ["pain", "grief", "joy"]),
    ("Once more unto the breach, dear friends, once", "more", ["again", "now", "here"]),
    ("What's in a name? that which we call a", "rose", ["flower", "thing", "man"]),
    ("Shall I compare thee to a summer's", "day", ["night", "rose", "sun"]),
    ("Is this a dagger which I see before", "me", ["thee", "him", "us"]),
    ("Out, damned spot! out, I", "say", ["cry", "pray", "beg"]),
    ("The course of true love never did run", "smooth", ["fast", "true", "long"]),
    ("Uneasy lies the head that wears a", "crown", ["hat", "helm", "wreath"]),
    ("We are such stuff as dreams are made", "on", ["of", "from", "with"]),
    ("Cowards die many times before their", "deaths", ["lives", "hours", "days"]),
]


def write_task(folder: Path) -> None:
    data = folder / "items.jsonl"
    with data.open("w") as f:
        for i, (context, right, wrong) in enumerate(ITEMS):
            choices = [right, *wrong]
            choices = choices[i % 4:] + choices[:i % 4]        # the right answer at every position in turn
            f.write(json.dumps({"context": context, "choices": choices, "label": choices.index(right)}) + "\n")
    (folder / f"{TASK}.yaml").write_text(
        f"task: {TASK}\n"
        "dataset_path: json\n"
        f"dataset_kwargs:\n  data_files:\n    test: {data}\n"
        "test_split: test\n"
        "output_type: multiple_choice\n"
        "doc_to_text: '{{context}}'\n"
        "doc_to_choice: '{{choices}}'\n"
        "doc_to_target: label\n"
        "target_delimiter: ' '\n"
        "metric_list:\n  - metric: acc\n")


def lm_eval(args: list[str], out: Path) -> dict[str, Any]:
    """Runs lm_eval in its environment; its per-sample loglikelihoods, in document order."""
    cmd = [str(VENV / "bin" / "lm_eval"), *args, "--tasks", TASK, "--include_path", str(out.parent / "task"),
           "--output_path", str(out), "--log_samples", "--batch_size", "1"]
    log.info("%s", " ".join(cmd))
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"lm_eval failed:\n{done.stderr[-4000:]}")
    samples = sorted(out.rglob(f"samples_{TASK}_*.jsonl"))
    results = sorted(out.rglob("results_*.json"))
    docs = [json.loads(line) for line in samples[-1].read_text().splitlines()]
    docs.sort(key=lambda d: d["doc_id"])
    return {"acc": json.loads(results[-1].read_text())["results"][TASK]["acc,none"],
            "loglikelihoods": [[float(r[0][0]) for r in d["resps"]] for d in docs]}


def options(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--repository", type=Path, default=ROOT / "model_repository")
    ap.add_argument("--model", default="gpt")
    ap.add_argument("--checkpoint", type=Path, default=ROOT / "artifacts" / "checkpoints" / "lm")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "lm_eval.json")


def cli(a: argparse.Namespace) -> int | None:
    if not (VENV / ".complete").is_file():
        raise SystemExit("lm-eval is not installed: run bash bench/setup_lmeval.sh")
    versions = sorted((int(p.name) for p in (a.repository / a.model).iterdir() if p.name.isdigit()))
    manifest = json.loads((a.repository / a.model / str(versions[-1]) / "model.json").read_text())
    weights = hashlib.sha256((a.checkpoint / "model.safetensors").read_bytes()).hexdigest()
    if manifest["source"]["checkpoint_sha256"] != weights:
        raise SystemExit(f"{a.repository / a.model} (version {versions[-1]}) was not exported from {a.checkpoint}")
    with tempfile.TemporaryDirectory() as tmp, ServerProcess(a.repository, ["--http-port", "0"]) as server:
        work = Path(tmp)
        (work / "task").mkdir()
        write_task(work / "task")
        api = lm_eval(["--model", "local-completions", "--model_args",
                       f"model={a.model},base_url={server.http_url}/v1/completions,tokenizer={a.checkpoint},"
                       "num_concurrent=4,max_retries=1"], work / "api")
        hf = lm_eval(["--model", "hf", "--model_args", f"pretrained={a.checkpoint},dtype=float32",
                      "--device", "cpu"], work / "hf")
    worst = max(abs(x - y) for row_a, row_h in zip(api["loglikelihoods"], hf["loglikelihoods"], strict=True)
                for x, y in zip(row_a, row_h, strict=True))
    picks = [[max(range(len(r)), key=r.__getitem__) for r in side["loglikelihoods"]] for side in (api, hf)]
    report = {"items": len(ITEMS), "choices": sum(len(r) for r in api["loglikelihoods"]),
              "acc_ortserve": api["acc"], "acc_hf": hf["acc"], "same_picks": picks[0] == picks[1],
              "max_abs_loglikelihood_diff": worst, "first_items_ortserve": api["loglikelihoods"][:3],
              "first_items_hf": hf["loglikelihoods"][:3], "model": a.model, "version": versions[-1],
              "checkpoint": str(a.checkpoint)}
    write_json(a.out, report, indent=1)
    print(json.dumps(report, indent=1))
    return 0 if report["same_picks"] and worst < 1e-3 else 1


BENCHMARK = Benchmark(summary=__doc__, sides=("ortserve", "lm-eval-hf"), pieces=(), options=options, run=cli)
