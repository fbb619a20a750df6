"""HTTP front door vs gRPC: per-request overhead, throughput, and /v1/completions streaming vs vLLM.

    python -m bench http --repository model_repository --classifier genre --embedder minilm \
        --out bench/results/http.json
    python -m bench http --streams-only              # the streaming piece alone (needs bash bench/setup_vllm.sh)
    python -m bench http --render-only --out bench/results/http.json --docs docs/BENCHMARKS.md

Pieces (one ortserve process serving both ports, so both protocols reach the same data plane):
  overhead    batch 1, sequential, interleaved: p50 / p90 latency of the same request over gRPC (task API) and
              HTTP (KServe v2 REST text mode; and POST /v1/embeddings), for classify and embed
  throughput  16 client threads, each with its own connection: requests/s over gRPC and over HTTP
  streams     POST /v1/completions stream=true, driven by the same `openai`-client load script against
              ortserve and vLLM's OpenAI server on the same random GPT-2 124M checkpoint (bench/generation.py's
              material): tokens/s summed over 1 / 8 / 16 concurrent streams and time to first token
"""
from __future__ import annotations

import argparse
import logging
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

from bench.machine import describe
from bench.sides import sides_lines, vllm_label
from bench.stats import percentile
from testing.closedloop import drive, shared
from bench.harness import Benchmark
from bench.results import DOCS, publish, read_json, run_header

ROOT = Path(__file__).resolve().parents[1]
log = logging.getLogger("bench.http")
TEXTS = ["Once more unto the breach, dear friends, once more;",
         "Now is the winter of our discontent made glorious summer by this sun of York.",
         "A man is eating food.", "The quality of mercy is not strained."]


def _grpc_call(address: str, task: str, model: str) -> Callable[[int], Any]:
    import grpc

    from protos import ortserve_pb2 as pb
    from protos import ortserve_pb2_grpc as pb_grpc

    stub = pb_grpc.TaskServiceStub(grpc.insecure_channel(address))
    if task == "classify":
        return lambda i: stub.Classify(pb.ClassifyRequest(model=model, inputs=[pb.TextInput(text=TEXTS[i % 4])]))
    return lambda i: stub.Embed(pb.EmbedRequest(model=model, texts=[TEXTS[i % 4]]))


def _http_call(url: str, task: str, model: str, route: str) -> Callable[[int], Any]:
    import httpx2 as httpx

    client = httpx.Client(timeout=60)
    if route == "openai":
        return lambda i: client.post(f"{url}/v1/embeddings", json={"model": model, "input": TEXTS[i % 4],
                                                                    "encoding_format": "float"}).raise_for_status()
    return lambda i: client.post(f"{url}/v2/models/{model}/infer", json={"inputs": [
        {"name": "text", "datatype": "BYTES", "shape": [1], "data": [TEXTS[i % 4]]}]}).raise_for_status()


def overhead(calls: dict[str, Callable[[int], Any]], requests: int) -> dict[str, Any]:
    """Sequential batch-1 calls, interleaved round-robin so drift hits every protocol alike."""
    times: dict[str, list[float]] = {k: [] for k in calls}
    for i in range(10):
        for call in calls.values():
            call(i)
    for i in range(requests):
        for name, call in calls.items():
            t = time.perf_counter()
            call(i)
            times[name].append((time.perf_counter() - t) * 1e3)
    return {k: {"p50_ms": percentile(v, 50), "p90_ms": percentile(v, 90), "n": len(v)} for k, v in times.items()}


def throughput(make: Callable[[], Callable[[int], Any]], clients: int, requests: int) -> dict[str, float]:
    """`clients` threads, each with its own client, `requests` calls in all."""
    per = [make() for _ in range(clients)]
    for call in per:
        call(0)
    run = drive(lambda c, i, first: per[c](i), clients, shared(requests))
    return {"requests_per_s": requests / run.wall, "seconds": run.wall, "clients": clients}


def stream_load(base_url: str, model: str, prompts: list[str], concurrency: int, max_tokens: int) -> dict[str, Any]:
    """The openai-client load script: `concurrency` streams at once; tokens/s summed, TTFT per stream."""
    import openai

    client = openai.OpenAI(base_url=base_url, api_key="bench", max_retries=0, timeout=600)

    def one(prompt: str) -> tuple[float, float, int]:
        started = time.perf_counter()
        first = None
        tokens = 0
        stream = client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens, temperature=0,
                                           stream=True, stream_options={"include_usage": True},
                                           extra_body={"ignore_eos": True})
        for chunk in stream:
            if chunk.choices and chunk.choices[0].text and first is None:
                first = time.perf_counter() - started
            if chunk.usage is not None:
                tokens = chunk.usage.completion_tokens
        return first or float("nan"), time.perf_counter() - started, tokens

    one(prompts[-1])  # warm-up: the first stream of a fresh server pays for lazy initialisation
    t = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        results = list(pool.map(one, prompts[:concurrency]))
    wall = time.perf_counter() - t
    ttft = [r[0] * 1e3 for r in results]
    return {"concurrency": concurrency, "tokens_per_s": sum(r[2] for r in results) / wall,
            "ttft_p50_ms": statistics.median(ttft), "ttft_max_ms": max(ttft), "wall_s": wall}


def streams_piece(threads: int, levels: tuple[int, ...], max_tokens: int, with_vllm: bool,
                  model: str = "gpt2", repeats: int = 2) -> dict[str, Any]:
    """Both servers up at once, taking turns level by level (a second apart: vLLM's OpenMP threads spin for a
    while after work); each figure is the median of `repeats` runs."""
    from bench.generation import Config, material, prompts, start_vllm
    from tokenizers import Tokenizer
    from testing.launch import ServerProcess

    cfg = Config(threads=threads, model=model)
    ckpt, repo, pool = material(cfg)
    tok = Tokenizer.from_file(str(repo / "gpt" / "1" / "tokenizer.json"))
    texts = [tok.decode(p) for p in prompts(pool, max(levels) + 1, cfg.prompt_tokens, salt=7)]
    servers: dict[str, Any] = {}
    urls: dict[str, str] = {}
    sides: dict[str, Any] = {"ortserve": {"threads": threads, "binding": "not pinned (onnxruntime's default)",
                                          "intra_op_spinning": "off (server default)", "max_sequences": 32}}
    try:
        servers["ortserve"] = ServerProcess(repo, ["--http-port", "0", "--intra-op-threads", str(threads),
                                                   "--max-sequences", "32"], startup_timeout=600)
        urls["ortserve"] = f"{servers['ortserve'].http_url}/v1"
        if with_vllm:
            servers["vllm"] = start_vllm(ckpt, cfg)
            urls["vllm"] = f"http://127.0.0.1:{servers['vllm'].port}/v1"
            sides["vllm"] = servers["vllm"].describe()
        runs: dict[str, dict[int, list[dict[str, Any]]]] = {k: {n: [] for n in levels} for k in urls}
        for _ in range(repeats):
            for n in levels:
                for name, url in urls.items():
                    runs[name][n].append(stream_load(url, "gpt", texts, n, max_tokens))
                    time.sleep(1.0)
    finally:
        for server in servers.values():
            server.stop()
    out: dict[str, Any] = {"prompt_tokens": cfg.prompt_tokens, "repeats": repeats, "sides": sides}
    for name, by_level in runs.items():
        out[name] = [{"concurrency": n, "tokens_per_s": statistics.median(r["tokens_per_s"] for r in rs),
                      "ttft_p50_ms": statistics.median(r["ttft_p50_ms"] for r in rs),
                      "ttft_max_ms": max(r["ttft_max_ms"] for r in rs), "runs": rs} for n, rs in by_level.items()]
    return out


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}" if b else "n/a"


def render(r: dict[str, Any]) -> list[str]:
    """The HTTP block of docs/BENCHMARKS.md (bench/results.py keeps it when the rest is rewritten)."""
    lines = [*run_header("HTTP front door vs gRPC, and /v1/completions streaming vs vLLM (bench/http.py)", r),
             "- One ortserve process serves both ports, so both protocols reach the same data plane and model. "
             "Clients: grpc stubs of the task API; httpx (KServe v2 REST text mode, OpenAI embeddings).", ""]
    for task in ("classify", "embed"):
        over = r.get(f"overhead_{task}")
        if not over:
            continue
        base = over["grpc"]["p50_ms"]
        lines += [f"### {task}: batch 1, sequential, interleaved", "",
                  "| protocol | p50 ms | p90 ms | p50 − gRPC p50 ms |", "|---|---|---|---|"]
        lines += [f"| {k} | {v['p50_ms']:.2f} | {v['p90_ms']:.2f} | {v['p50_ms'] - base:+.2f} |" for k, v in over.items()]
        thr = r[f"throughput_{task}"]
        lines += ["", f"{thr['grpc']['clients']} client threads, each with its own connection: gRPC "
                      f"{thr['grpc']['requests_per_s']:.0f} req/s, HTTP {thr['http_kserve']['requests_per_s']:.0f} "
                      f"req/s (HTTP / gRPC {_ratio(thr['http_kserve']['requests_per_s'], thr['grpc']['requests_per_s'])}).",
                  ""]
    streams = r.get("streams")
    if streams:
        vl = vllm_label(streams.get("sides"))
        lines += ["### POST /v1/completions, stream=true: ortserve vs vLLM's OpenAI server", "",
                  f"Same random GPT-2 124M checkpoint (bench/generation.py material), same `openai`-client load script "
                  f"({streams.get('prompt_tokens', '?')}-token prompts, {r.get('stream_tokens', '?')} new tokens, greedy, "
                  f"ignore_eos). Both servers up at once, taking turns level by level, a second apart; median of "
                  f"{streams.get('repeats', 1)} runs. Each side's threads and binding:",
                  *sides_lines(streams.get("sides"), vllm_ran=bool(streams.get("vllm"))), "",
                  f"| streams | ortserve tok/s | {vl} tok/s | ortserve / {vl} | ortserve TTFT p50 ms | {vl} TTFT p50 ms |",
                  "|---|---|---|---|---|---|"]
        vllm = {x["concurrency"]: x for x in streams.get("vllm", [])}
        for x in streams["ortserve"]:
            v = vllm.get(x["concurrency"])
            lines.append(f"| {x['concurrency']} | {x['tokens_per_s']:.1f} | "
                         + (f"{v['tokens_per_s']:.1f} | {_ratio(x['tokens_per_s'], v['tokens_per_s'])} | "
                            f"{x['ttft_p50_ms']:.0f} | {v['ttft_p50_ms']:.0f} |" if v else
                            f"– | – | {x['ttft_p50_ms']:.0f} | – |"))
        lines.append("")
    return lines


def options(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--repository", type=Path, default=ROOT / "model_repository")
    ap.add_argument("--classifier", default="genre")
    ap.add_argument("--embedder", default="minilm")
    ap.add_argument("--requests", type=int, default=300, help="sequential requests per protocol (overhead)")
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--throughput-requests", type=int, default=1600)
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)),
                    help="threads of every server (default: this process's cores)")
    ap.add_argument("--stream-levels", default="1,8,16")
    ap.add_argument("--stream-tokens", type=int, default=128)
    ap.add_argument("--stream-model", default="gpt2", choices=("gpt2", "llama"),
                    help="the random 124M-shaped checkpoint of bench/generation.py to stream from")
    ap.add_argument("--streams-only", action="store_true")
    ap.add_argument("--no-streams", action="store_true")
    ap.add_argument("--no-vllm", action="store_true")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "http.json")
    ap.add_argument("--docs", type=Path, help="write the section into this report (e.g. docs/BENCHMARKS.md)")
    ap.add_argument("--render-only", action="store_true", help="only (re)write --docs from --out")


def cli(a: argparse.Namespace) -> int | None:
    if a.render_only:
        publish(read_json(a.out), None, a.docs or DOCS, "http", render)
        return 0
    for noisy in ("httpx", "httpx2", "openai"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    report: dict[str, Any] = {"command": a.invocation,
                              "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                              "machine": describe(ROOT), "stream_tokens": a.stream_tokens}
    if not a.streams_only:
        from testing.launch import ServerProcess

        server = ServerProcess(a.repository, ["--http-port", "0", "--intra-op-threads", str(a.threads)],
                               startup_timeout=600)
        try:
            for task, model in (("classify", a.classifier), ("embed", a.embedder)):
                calls = {"grpc": _grpc_call(server.address, task, model),
                         "http_kserve": _http_call(server.http_url, task, model, "kserve")}
                if task == "embed":
                    calls["http_openai"] = _http_call(server.http_url, task, model, "openai")
                report[f"overhead_{task}"] = overhead(calls, a.requests)
                makers = {"grpc": lambda: _grpc_call(server.address, task, model),
                          "http_kserve": lambda: _http_call(server.http_url, task, model, "kserve")}
                rounds: dict[str, list[dict[str, float]]] = {k: [] for k in makers}
                for _ in range(2):   # the protocols take turns, so drift hits both alike
                    for k, make in makers.items():
                        rounds[k].append(throughput(make, a.clients, a.throughput_requests // 2))
                report[f"throughput_{task}"] = {
                    k: {"requests_per_s": statistics.median(x["requests_per_s"] for x in rs), "clients": a.clients,
                        "runs": rs} for k, rs in rounds.items()}
                log.info("%s: %s %s", task, report[f"overhead_{task}"], report[f"throughput_{task}"])
        finally:
            server.stop()
    if not a.no_streams:
        levels = tuple(int(x) for x in a.stream_levels.split(","))
        report["streams"] = streams_piece(a.threads, levels, a.stream_tokens, not a.no_vllm, a.stream_model)
        log.info("streams: %s", report["streams"])
    print("\n".join(publish(report, a.out, a.docs, "http", render)))
    return 0


BENCHMARK = Benchmark(summary=__doc__, sides=("ortserve", "vllm"), pieces=("overhead", "throughput", "streams"), options=options, run=cli)
