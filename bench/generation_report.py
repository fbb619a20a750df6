"""The generation block(s) of docs/BENCHMARKS.md from a bench/generation.py result: one block per model, and one
per model and weight variant; each lists the runs whose figures it still shows (their commands, sides, machine)."""
from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from .results import table, write_block
from .sides import sides_lines, vllm_label

DURING_NEW_TOKENS = 96     # the first request's, in the prefix piece: it still decodes when the second arrives


def current_runs(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The runs whose figures are still in the report: a run is dropped once later runs re-measured every piece
    it measured (with --merge, a piece's figures are replaced, so its old command no longer describes them)."""
    kept, later = [], set()
    for run in reversed(runs):
        if set(run["pieces"]) - later:
            kept.append(run)
        later |= set(run["pieces"])
    return kept[::-1]


def _variant_of(r: dict[str, Any]) -> str | None:
    """The served variant a report was measured with, when one was asked for other than fp32 (config holds strings)."""
    v = r.get("config", {}).get("variant")
    return None if v in (None, "None", "fp32") else v


def _block(model: str, variant: str | None = None) -> str:
    """One block per model, and one per model and weight variant (w8, w4 ...) so their runs sit side by side."""
    return f"generation:{model}" + (f":{variant}" if variant else "")


def _f(x: float, d: int = 1) -> str:
    return f"{x:.{d}f}"


def render_section(r: dict[str, Any]) -> list[str]:
    """Markdown for docs/BENCHMARKS.md (between the generation markers; `python -m bench report` keeps it)."""
    m = r.get("machine", {})
    model = r.get("config", {}).get("model", "gpt2")
    runs = r.get("runs") or [{"command": r.get("command"), "started": r.get("started"), "pieces": []}]
    shape = ("GPT-2 124M shape (12 layers, 768 wide, 12 heads, vocab 8000, 1024 positions, random init, fp32)"
             if model == "gpt2" else "Llama ~124M shape with grouped-query attention (12 layers, 768 wide, 12 heads / "
             "4 kv heads, SwiGLU 2048, tied head, vocab 8000, 1024 positions; since 2026-11-26 12:40 UTC trained 150 steps on "
             "Shakespeare (`trained_llama`: the gate judges its w8 / w4), random init before; fp32)")
    variant = _variant_of(r)
    lines = [f"## Generation vs peers: {model}" + (f", ortserve serving its {variant} variant" if variant else "")
             + f" (bench/generation.py --model {model}" + (f" --variant {variant}" if variant else "") + ")", ""]
    for x in runs:     # each run, and how its sides ran (threads, binding)
        lines.append(f"- Command: `{x['command']}` at {x['started']}"
                     + (f" (pieces: {', '.join(x['pieces'])})" if x.get("pieces") else ""))
        lines += sides_lines(x.get("sides"), vllm_ran=_run_had_vllm(x, r), indent="  ")
    lines += [
             f"- Machine: nproc {m.get('nproc', '?')}, {m.get('cpu_model', '?')}; load average at start "
             f"{m.get('loadavg_at_start')}; git {m.get('git_commit', '?')}",
             f"- Checkpoint: {shape} saved in HF layout; ortserve serves its `python -m export` package (in-place cache "
             "+ mixed graph), "
             "vLLM 0.32.0 CPU loads the checkpoint directory (`--dtype float32`, OpenAI server), onnxruntime-genai "
             "0.18.0 runs the same model.onnx in-process. One side under load at a time; each run above lists its "
             "sides' threads and binding.", ""]
    st = r.get("streams")
    if st:
        vl = _vllm_label_of(runs, "streams")
        c = r.get("config", {})
        # Results measured before the concat engine was retired also have its column ("previous engine").
        old = any("ortserve_concat_engine" in v for v in st.values())
        lines += [f"### Aggregate tokens/s and time to first token ({c.get('prompt_tokens', 32)}-token prompts, "
                  f"{c.get('new_tokens', 128)} new tokens, greedy, ignore eos)", "",
                  "Each cell: median of the runs; the sides take turns run by run, a second apart." +
                  (" \"previous engine\" is the concat-cache package of the same weights in the same server." if old else ""),
                  "", f"| streams | ortserve tok/s | {vl} tok/s | ortserve / {vl} | ortserve TTFT p50 ms | {vl} TTFT p50 ms "
                  + ("| previous engine tok/s |" if old else "|"), "|---|---|---|---|---|---|" + ("---|" if old else "")]
        for n, v in st.items():
            o, p, c = v["ortserve"], v.get("vllm"), v.get("ortserve_concat_engine")
            lines.append(f"| {n} | {_f(o['tokens_per_s'])} | {_f(p['tokens_per_s']) if p else '-'} | "
                         f"{_f(v['ratio_tokens_per_s'], 2) if p else '-'} | {_f(o['ttft_p50_ms'], 0)} | "
                         f"{_f(p['ttft_p50_ms'], 0) if p else '-'} |" + (f" {_f(c['tokens_per_s']) if c else '-'} |" if old else ""))
        lines.append("")
    ar = r.get("arrival")
    if ar:
        lines += ["### A 900-token prompt arrives while 4 streams decode", "",
                  "| server | prefill chunk | largest gap ms | median ITL ms | gap / ITL | long prompt TTFT ms | lone prefill ms | TTFT / lone |",
                  "|---|---|---|---|---|---|---|---|"]
        def row(server: str, chunk: str, v: dict[str, Any]) -> str:
            return (f"| {server} | {chunk} | {_f(v['largest_gap_ms'], 0)} | {_f(v['median_itl_ms'])} | "
                    f"{_f(v['gap_over_itl'], 2)} | {_f(v['long_ttft_ms'], 0)} | "
                    f"{_f(statistics.median(v['lone_prefill_ms']), 0)} | {_f(v['ttft_over_lone'], 2)} |")

        lines += [row("ortserve", chunk, v) for chunk, v in ar.get("ortserve", {}).items()]
        if "vllm" in ar:
            lines.append(row(_vllm_label_of(runs, "arrival"), "(its own)", ar["vllm"]))
        lines.append("")
    lv = r.get("leave")
    if lv:
        lines += ["### A sequence leaving (streams of staggered lengths)", "",
                  *table(["streams", "median gap ms", "worst gap right after a leave ms", "worst / median"],
                         [[n, _f(v["median_gap_ms"]), _f(v["worst_gap_after_a_leave_ms"]),
                           _f(v["worst_over_median"], 2)] for n, v in lv.items()]), ""]
    sp = r.get("step")
    if sp:
        turns = f", {sp['rounds']} rounds with fp32 and kv8 taking turns; medians" if sp.get("rounds") else ""
        lines += [f"### Decode step growth with the cache (in-process, batch 8{turns})", "",
                  f"past 16: {_f(sp['past16_ms'])} ms, past 1000: {_f(sp['past1000_ms'])} ms, growth "
                  f"{_f(sp['growth_ms'])} ms; reading the extra {sp['extra_cache_bytes'] / 1e6:.0f} MB of cache once at "
                  f"the {_f(sp['read_bandwidth_gb_s'])} GB/s measured in the same run takes {_f(sp['read_floor_ms'])} ms: "
                  f"growth = {_f(sp['growth_over_floor'], 2)} × that floor.", ""]
        kv = sp.get("kv8")
        if kv:
            lines += [f"With the int8 cache (kv8 variant, same weights): past 16: {_f(kv['past16_ms'])} ms, past 1000: "
                      f"{_f(kv['past1000_ms'])} ms, growth {_f(kv['growth_ms'])} ms (its extra cache is "
                      f"{kv['extra_cache_bytes'] / 1e6:.0f} MB, read floor {_f(kv['read_floor_ms'])} ms); the step at "
                      f"past 1000 takes {_f(kv['past1000_ms'] / sp['past1000_ms'], 2)} × the fp32 cache's.", ""]
    ge = r.get("genai")
    if ge:
        graph = f"the {ge['variant']} graph" if "variant" in ge else "model.onnx"
        lines += [f"### ortserve over gRPC vs onnxruntime-genai in-process, same {graph}", "",
                  "| batch | ortserve gRPC tok/s | genai in-process tok/s | ratio |", "|---|---|---|---|"]
        lines += [f"| {b} | {_f(v['ortserve_grpc'])} | {_f(v['genai_in_process'])} | {_f(v['ratio'], 2)} |"
                  for b, v in ge.items() if b.isdigit()]
        lines.append("")
    pf = r.get("prefix")
    if pf:
        lines += [f"### A {pf['context_tokens']}-token context, then a second question on it (prefix caching)", "",
                  f"Time to first token of a request with a {pf['context_tokens']}-token context and a "
                  f"{pf['question_tokens']}-token question, then of a second request with the same context and "
                  "another question; last column: the second request sent while the first (on a context of its own, "
                  f"{DURING_NEW_TOKENS} new tokens) still decodes. Medians; the sides take turns, each run "
                  "with contexts of its own.", "",
                  "| server | first request TTFT ms | second request TTFT ms | second / first | second while the first "
                  "decodes TTFT ms |", "|---|---|---|---|---|"]
        names = {"ortserve_prefix_on": "ortserve, prefix caching on (default)",
                 "ortserve_prefix_off": "ortserve, --prefix-caching off",
                 "vllm": f"{_vllm_label_of(runs, 'prefix')} (automatic prefix caching)"}
        lines += [f"| {label} | {_f(pf[k]['first_ttft_ms'], 0)} | {_f(pf[k]['second_ttft_ms'], 0)} | "
                  f"{_f(pf[k]['second_over_first'], 3)} | {_f(pf[k]['during_ttft_ms'], 0) if 'during_ttft_ms' in pf[k] else '–'} |"
                  for k, label in names.items() if k in pf]
        lines.append("")
    spn = r.get("spinning")
    if spn:
        lines += ["### onnxruntime intra-op spinning in the server's decode loop", "",
                  *table(["streams", "spinning on tok/s", "off tok/s", "cost of off"],
                         [[n, _f(v["on_tokens_per_s"]), _f(v["off_tokens_per_s"]), f"{100 * v['off_cost']:.0f}%"]
                          for n, v in spn.items()]), ""]
    if r.get("findings"):
        lines += ["### Findings", "", *r["findings"], ""]
    return lines


def _vllm_ran(r: dict[str, Any]) -> bool:
    return any("vllm" in (r.get(piece) or {}) for piece in ("arrival", "prefix")) or \
        any(isinstance(v, dict) and "vllm" in v for v in (r.get("streams") or {}).values())


def _run_had_vllm(run: dict[str, Any], r: dict[str, Any]) -> bool:
    """Whether a run measured vLLM (a piece that starts it, without --no-vllm); unknown pieces: the report says."""
    if not run.get("pieces"):
        return _vllm_ran(r)
    return bool({"streams", "arrival", "prefix"} & set(run["pieces"])) and "--no-vllm" not in (run.get("command") or "")


def _vllm_label_of(runs: list[dict[str, Any]], piece: str) -> str:
    """The vLLM column's name for a piece, from the run that measured it (the last one naming it)."""
    for run in reversed(runs):
        if piece in (run.get("pieces") or []):
            return vllm_label(run.get("sides"))
    return vllm_label(None)


def write_docs(r: dict[str, Any], path: Path) -> None:
    """Replace (or append) this model's generation block of docs/BENCHMARKS.md."""
    write_block(path, _block(r.get("config", {}).get("model", "gpt2"), _variant_of(r)), render_section(r))
