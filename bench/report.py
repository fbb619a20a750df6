"""docs/BENCHMARKS.md from the result files (never edited by hand: rerun `python -m bench report`)."""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from .goals import Check, evaluate, matmul_rate
from .plots import make_plots
from .results import write_text

log = logging.getLogger(__name__)

FINDINGS = Path(__file__).resolve().parent / "FINDINGS.md"


def fmt(s: dict[str, Any] | None, digits: int = 1) -> str:
    """median [min–max]"""
    if not s:
        return "–"
    return f"{s['median']:.{digits}f} [{s['min']:.{digits}f}–{s['max']:.{digits}f}]"


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out + [""]


def _img(path: Path, docs: Path | None, alt: str) -> str:
    rel = os.path.relpath(path, docs.parent) if docs else str(path)
    return f"![{alt}]({rel})"


def machine_section(results: dict[str, dict[str, Any]]) -> list[str]:
    metas = [r["meta"] for r in results.values() if "meta" in r]
    m = metas[0]["machine"]
    v = m["versions"]
    lines = ["## How these figures were made", ""]
    commands = sorted({meta["command"] for meta in metas})
    lines += [f"- Command: `{c}`" for c in commands]
    quick = any(meta.get("quick") for meta in metas)
    runs = ", ".join(f"{p} {r['meta']['started_at']} ({r['meta']['duration_s']:.0f} s, load average at its end "
                     f"{r['meta'].get('loadavg_at_end', [float('nan')])[0]:.2f})" for p, r in results.items() if "meta" in r)
    lines += [f"- Run at: {runs}",
              f"- Machine: `nproc` = {m['nproc']}, CPU: {m['cpu_model']}, {m['platform']}; load average at start "
              f"{', '.join(f'{x:.2f}' for x in (m.get('loadavg_at_start') or []))}",
              "- Versions: " + ", ".join(f"{k} {val}" for k, val in v.items() if val),
              f"- Git commit: {m.get('git_commit')}",
              "- Every figure is the median over repeats with [min–max]; every ratio compares two figures "
              "measured in the same run, interleaved (ratio of medians, [worst–best] the ranges allow). "
              "Everyone gets 2 intra-op threads (torch.set_num_threads(2), onnxruntime intra_op_num_threads=2, "
              "OPENBLAS_NUM_THREADS=2), and idle threads sleep instead of spinning in the benchmark process "
              "(OMP_WAIT_POLICY=PASSIVE, onnxruntime session.intra_op.allow_spinning=0) so that interleaved backends "
              "do not steal cores from each other; the server processes keep their own defaults."]
    if quick:
        lines.append("- **`--quick` run: few repeats and smaller models (development only, noisy).**")
    failed = {p: r["error"] for p, r in results.items() if r.get("status") == "failed"}
    lines += [f"- **{p} FAILED**: {e}" for p, e in failed.items()]
    return lines + [""]


def goals_section(checks: list[Check]) -> list[str]:
    rows = []
    for c in checks:
        rng = f" [{c.low:.3g}–{c.high:.3g}]" if c.low is not None and c.high is not None else ""
        val = "–" if c.value is None else f"{c.value:.3g}{rng} {c.unit}"
        status = {True: "met", False: "**missed**", None: "not measured"}[c.met]
        rows.append([c.goal, c.subject, val, status, c.miss])
    lines = ["## Goals", ""] + table(["goal", "subject", "measured", "status", "missed by"], rows)
    missed = [c for c in checks if c.met is False and c.evidence]
    if missed:
        lines += ["### Evidence for the missed goals (from the same run's profiles and figures)", ""]
        lines += [f"- {c.goal} ({c.subject}): {c.evidence}" for c in missed]
        lines.append("")
    return lines


def encoder_section(res: dict[str, Any]) -> list[str]:
    lines = ["## Encoder", "",
             f"numpy float32 sgemm {res['sgemm']['n']}² before the models: {fmt(res['sgemm']['gflops'])} GFLOP/s; each "
             "shape below also times the sgemm inside its own interleaved rounds, and its '% of sgemm' uses that. "
             "GFLOP/s counts the matmul FLOPs of the model (2·M·N·K for every Linear and both attention matmuls). "
             "`hf_pipeline` is transformers' text-classification pipeline on the same weights (tokenization and "
             "softmax included, as a user would call it); the other backends get token ids. int8 GFLOP/s is the same "
             "FLOP count over the int8 time (an effective rate, not float operations).", ""]
    for m in res["models"]:
        sh = m["shape"]
        lines += [f"### {m['checkpoint']['name']}: {m['checkpoint']['origin']}", "",
                  f"{sh['layers']} layers, hidden {sh['hidden']}, {sh['heads']} heads, FFN {sh['intermediate']}, "
                  f"vocab {sh['vocab']}. Package variants: {', '.join(m['package']['variants'])}; "
                  f"optimized fusions: {m['package']['fused_operators'].get('optimized')}; "
                  f"HF attention implementation: {m.get('hf_attention')}.", ""]
        lines += [f"- export note: {n}" for n in m["package"]["notes"]]
        for s in m["shapes"]:
            rows = []
            for b, lat in s["latency_ms"].items():
                r = s["ratios"].get(f"{b}_speedup_vs_torch")
                mm = matmul_rate(s, b) if b.startswith("ort_") else None
                rows.append([b, fmt(lat, 2), fmt(s["gflops"][b]), f"{s['fraction_of_sgemm'][b] * 100:.0f}%",
                             "1" if b == "torch" else (f"{r['median']:.2f}" if r else "–"),
                             f"{mm:.0f}" if mm else "–",
                             f"{s['max_abs_diff_vs_torch'][b]:.1e}" if b in s["max_abs_diff_vs_torch"] else "–"])
            lines += [f"**batch {s['batch']} × seq {s['seq']}** ({s['matmul_gflop']:.2f} GFLOP per call; numpy sgemm "
                      f"timed in the same rounds: {fmt(s.get('sgemm_gflops'))} GFLOP/s)", ""]
            lines += table(["backend", "latency ms", "GFLOP/s", "of sgemm", "× torch", "GFLOP/s in matmul kernels (est.)",
                            "max abs Δlogits vs torch"], rows)
            extra = s["ratios"]
            notes = []
            for key in ("ort_int8_speedup_vs_fp32", "ort_optimized_speedup_vs_fp32"):
                if key in extra:
                    notes.append(f"{key.replace('_', ' ')}: {fmt(extra[key], 2)}")
            notes.append(f"HF pipeline top-1 agreement with torch: {s['hf_pipeline_top1_agreement_vs_torch'] * 100:.0f}%"
                         f" (its tokenizer gives the same ids: {s['hf_tokenizer_ids_equal']})")
            lines += [f"- {n}" for n in notes]
            for v, p in s["ort_profiles"].items():
                ops = ", ".join(f"{o['op']} {o['share'] * 100:.0f}%" for o in p["top_ops"][:5])
                lines.append(f"- ORT {v} profile ({p['runs']} runs, {p['run_ms_mean']:.2f} ms/run): {ops}")
            lines.append("")
        acc = m.get("int8_accuracy")
        if acc:
            lines += [f"int8 on the {acc['split']}, {acc['examples']} examples: fp32 {acc['accuracy_fp32'] * 100:.2f}%, "
                      f"int8 {acc['accuracy_int8'] * 100:.2f}%, drop {acc['drop_points']:.2f} points, "
                      f"top-1 agreement {acc['top1_agreement'] * 100:.1f}%.", ""]
        elif not m["checkpoint"]["trained"]:
            lines += ["int8 accuracy drop: not measured (random-init model: no trained genre classifier present).", ""]
    return lines


def decoder_section(res: dict[str, Any]) -> list[str]:
    sh = res["shape"]
    lines = ["## Decoder", "",
             f"{res['checkpoint']['name']}: {res['checkpoint']['origin']}; {sh['n_layer']} layers, n_embd {sh['n_embd']}, "
             f"{sh['n_head']} heads, n_positions {sh['n_positions']}, vocab {sh['vocab_size']}. Greedy, batch 1, "
             f"{res['prompt_tokens']}-token prompt, {res['new_tokens']} new tokens (prompt included in the time). "
             f"HF attention implementation: {res.get('hf_attention')}.", ""]
    lines += [f"- note: {n}" for n in res["notes"]]
    rows = [[k, fmt(v)] for k, v in res["tokens_per_s"].items()]
    lines += [""] + table(["backend", "tokens/s"], rows)
    lines += [f"- {k.replace('_', ' ')}: {fmt(v, 2)}" for k, v in res["ratios"].items()]
    agree = res["greedy_agreement_vs_ort_cached"]
    lines += ["- greedy output vs ORT cached: " + ", ".join(
        f"{k} {'identical' if a['identical'] else 'first differs at token ' + str(a['first_difference'])}"
        for k, a in agree.items()), ""]
    rows = [[str(r["past"]), fmt(r["ort_cached"], 2), fmt(r["torch_cached"], 2), fmt(r["ort_uncached"], 2)]
            for r in res["step_time"]["rows"]]
    lines += ["Step time (ms) against past length (one new token; the recompute column runs past+1 tokens without "
              "a cache):", ""]
    lines += table(["past", "ORT cached", "torch cached", "ORT full recompute"], rows)
    bs = res.get("batched_step")
    if bs:
        lines += [f"- one cached step for B sequences at past {bs['past']} (what continuous batching runs): "
                  + ", ".join(f"B={b} {fmt(s, 2)} ms" for b, s in bs["step_ms"].items())
                  + f"; at most {bs['max_stream_scaling']['median']:.2f}× aggregate tokens/s from B="
                  f"{min(bs['step_ms'], key=int)} to B={max(bs['step_ms'], key=int)}"]
    for k, p in res.get("ort_profiles", {}).items():
        ops = ", ".join(f"{o['op']} {o['ms_per_run']:.2f} ms" for o in p["top_ops"][:5])
        lines.append(f"- ORT {k.replace('_', ' ')} profile ({p['run_ms_mean']:.2f} ms/run): {ops}")
    return lines + [""]


def py_profile_lines(title: str, prof: dict[str, Any] | None) -> list[str]:
    if not prof:
        return []
    rows = [[f"`{f['function']}`", f"{f['own_ms_per_request']:.3f}", f"{f['cum_ms_per_request']:.3f}", str(f["calls"])]
            for f in prof["top_own_time"]]
    return ([f"{title}: {prof['requests']} requests, main thread busy {prof['busy_ms_per_request']:.2f} ms per "
             f"request ({prof['note']}).", ""]
            + table(["function", "own ms/request", "cumulative ms/request", "calls"], rows))


def server_section(res: dict[str, Any]) -> list[str]:
    lines = ["## Server", "", f"Load: {res['load']}. Classify sends {res['batch_size']} text(s) per request.", ""]
    for k, m in res["models"].items():
        lines.append(f"- {k}: {m['origin']}" + (f"; default variant {m['default_variant']}" if m.get("default_variant") else ""))
        lines += [f"  - note: {n}" for n in m.get("notes", [])]
    rows = []
    for c, cell in sorted(res["classify"].items(), key=lambda kv: int(kv[0])):
        for way in ("in_process", "grpc"):
            lat = cell[way]["latency_ms"]
            rows.append([c, way, fmt(cell[way]["throughput_per_s"]), f"{lat['p50']:.2f}", f"{lat['p95']:.2f}",
                         fmt(cell["grpc_vs_in_process_throughput"], 2) if way == "grpc" else ""])
    lines += [""] + table(["concurrency", "path", "texts/s", "p50 ms", "p95 ms", "gRPC / in-process"], rows)
    lat = res["batch1_latency"]
    lines += [f"Batch-1 latency, {lat['requests']} sequential requests each, alternating: p50 in-process "
              f"{lat['p50_ms']['in_process']:.2f} ms, gRPC {lat['p50_ms']['grpc']:.2f} ms → overhead "
              f"{lat['grpc_overhead_p50_ms']:.2f} ms (p95 {lat['p95_ms']['in_process']:.2f} / {lat['p95_ms']['grpc']:.2f} ms).", ""]
    rows = []
    for n, e in sorted(res["generation"].items(), key=lambda kv: int(kv[0])):
        for way in ("in_process", "grpc"):
            rows.append([n, way, fmt(e[way]["tokens_per_s"]), fmt(e[way]["ttft_ms"])])
    lines += [f"GenerateStream, {res['stream_new_tokens']} new tokens per stream (greedy, ignore_eos):", ""]
    lines += table(["streams", "path", "aggregate tokens/s", "time to first token ms"], rows)
    lines += [f"- scaling {max(res['generation'], key=int)} streams vs {min(res['generation'], key=int)}: "
              + ", ".join(f"{k} {fmt(v, 2)}" for k, v in res["generation_scaling_last_vs_first"].items()), ""]
    lines += py_profile_lines("Server process under cProfile, sequential batch-1 Classify over gRPC (untimed run)",
                              res.get("grpc_classify_profile"))
    return lines


def peer_section(res: dict[str, Any]) -> list[str]:
    ml = res["mlserver"]
    ours = res.get("ortserve") or {"encoder_instances": 1, "intra_op_threads": res["threads"]}
    lines = ["## Peer server: Seldon MLServer", "",
             f"Same ONNX file ({res['model_file']}, variant {res['variant']}) and the same {res['threads']} compute "
             f"threads: ortserve's KServe ModelInfer as {ours['encoder_instances']} encoder instance(s) × "
             f"{ours['intra_op_threads']} intra-op thread(s) (spinning {ours.get('intra_op_spinning', 'off')}), MLServer "
             f"as one session of {res['threads']} threads (its runtime runs the graph on its event loop, so one run at "
             f"a time, with onnxruntime's default spinning threads). MLServer {ml['versions'].get('mlserver')} (onnxruntime "
             f"{ml['versions'].get('onnxruntime')}, protobuf {ml['versions'].get('protobuf')}, settings {ml['settings']}) "
             f"through {ml['runtime']}. Load: {res['load']}, seq {res['seq']}. Outputs of the two servers differ by at "
             f"most {res['max_abs_diff_between_servers']:.1e}.", ""]
    rows = []
    for c in res["cells"]:
        for k in ("ortserve", "mlserver"):
            cpu = c[k].get("cpu_ms_per_request")
            rows.append([str(c["clients"]), str(c["batch"]), k, fmt(c[k]["requests_per_s"]), fmt(c[k]["rows_per_s"]),
                         f"{c[k]['p50_ms']:.2f}", f"{c[k]['p95_ms']:.2f}",
                         (f"{cpu['server']:.2f} ({cpu['server_main_thread']:.2f}) / {cpu['client']:.2f}"
                          if cpu and "server_main_thread" in cpu else
                          f"{cpu['server']:.2f} / {cpu['client']:.2f}" if cpu else "-"),
                         fmt(c["throughput_ratio_ortserve_vs_mlserver"], 2) if k == "ortserve" else ""])
    lines += table(["clients", "batch", "server", "requests/s", "rows/s", "p50 ms", "p95 ms",
                    "CPU ms per request: server (main thread) / client", "ortserve / MLServer"], rows)
    lines += ["", "CPU per request: user + system time of the server process (with any children), of its main thread, "
              "and of the load generator (this process, its tritonclient threads) over the timed runs, divided by the "
              "requests; on 2 cores a rate of R requests/s leaves 2000 / R ms of CPU per request for them together. "
              "ortserve's main thread is its event loop (gRPC, codecs, batcher; the graph runs in worker threads); "
              "MLServer's runs the graph too.", ""]
    ceiling = res.get("graph_ceiling")
    if ceiling:
        lines += [f"The graph's ceiling: onnxruntime alone on {res['model_file']} in the benchmark process, all "
                  f"{res['threads']} cores computing, rows/s per batch size, measured before the servers start and "
                  f"after they stop (no server can serve more rows/s than this; best {ceiling['best_rows_per_s']:.0f}):", ""]
        batches = sorted({b for run in ceiling["runs"] for t in run["rows_per_s"].values() for b in t}, key=int)
        rows = [[f"{name} ({when})"] + [f"{run['rows_per_s'][name].get(b, float('nan')):.0f}" for b in batches]
                for when, run in zip(("before", "after"), ceiling["runs"]) for name in run["rows_per_s"]]
        lines += table(["configuration"] + [f"batch {b}" for b in batches], rows)
    lines += py_profile_lines("ortserve under cProfile, 1 client, batch-1 ModelInfer (untimed run)",
                              res.get("ortserve_kserve_batch1_profile"))
    return lines


SECTIONS = {"encoder": encoder_section, "decoder": decoder_section, "server": server_section, "peer": peer_section}
PLOT_TITLES = {"encoder_latency": "encoder latency", "encoder_gflops": "encoder GFLOP/s",
               "decoder_step_time": "decoder step time vs past length", "decoder_tokens_per_s": "decoder tokens/s",
               "server": "server throughput", "peer": "ortserve vs MLServer"}


def render(results: dict[str, dict[str, Any]], docs: Path | None, plots: Path | None) -> list[Check]:
    """Write the Markdown report (and plots); return the goal checks."""
    checks = evaluate(results)
    made = make_plots(results, plots) if plots else {}
    lines = ["# Benchmarks", "",
             "Generated by `python -m bench suite` from the result files (bench/results/*.json); do not edit by hand, "
             "rerun `python -m bench report` instead.", "",
             "Run everything with `python -m bench suite --out bench/results` (10–20 minutes on 2 cores: a trained classifier's "
             "parity gate alone takes minutes), a short "
             "development run with `--quick`, a subset with `--only encoder,decoder,server,peer`. The peer piece "
             "builds its own environment, bench/.venv-mlserver, on first use (bench/setup_mlserver.sh, needs PyPI). "
             "The trained checkpoints artifacts/checkpoints/classifier and artifacts/checkpoints/lm are used when "
             "present (`python -m training ...`); otherwise random models of the same shapes stand in, and the int8 "
             "accuracy drop cannot be measured.", ""]
    lines += machine_section(results)
    lines += goals_section(checks)
    if FINDINGS.is_file():
        lines += ["## Findings (written by hand, bench/FINDINGS.md)", "", FINDINGS.read_text(encoding="utf-8").strip(), ""]
    for piece, section in SECTIONS.items():
        res = results.get(piece)
        if not res or res.get("status") != "ok":
            continue
        lines += section(res)
        for p in made.get(piece, []):
            lines += [_img(p, docs, PLOT_TITLES.get(p.stem, p.stem)), ""]
    # Sections written by their own runs (bench.generation, bench.http: marked blocks) are kept.
    from .results import existing_blocks

    kept = existing_blocks(docs) if docs is not None else ""
    text = "\n".join(lines).rstrip() + "\n" + (f"\n{kept}\n" if kept else "")
    if docs is not None:
        write_text(docs, text)
        log.info("wrote %s", docs)
    return checks
