"""The llama.cpp block of docs/BENCHMARKS.md from a bench/llamacpp.py result, and the names both share: our
variants paired with llama.cpp's quantizations, and why a run used another build or no weight repacking."""
from __future__ import annotations

from typing import Any

from .results import run_header, table
from .sides import sides_lines

QUANTS = {"fp32": "f32", "w8": "q8_0", "w4": "q4_0"}   # our variant -> the llama.cpp quantization it is paired with

NO_REPACK_WHY = ("llama-server exited with SIGSEGV in ggml_backend_amx_mul_mat (its Intel AMX path, taken with weight "
                 "repacking on) while warming up; started again with --no-repack, which also turns off the AVX "
                 "repacked kernels: the raw piece measures what that costs llama-bench")

NOAMX_WHY = ("the native build's llama-server exited with SIGSEGV in ggml_backend_amx_mul_mat (its Intel AMX path) "
             "while warming up; this is the same tree built with every vector extension of the CPU but AMX "
             "(bench/setup_llamacpp_noamx.sh), weight repacking on")


LLAMA_124M = ("the Llama ~124M shape of bench/generation.py (12 layers, 768 wide, 12 heads / 4 kv heads, SwiGLU 2048, "
              "tied head, vocab 8000, trained 150 steps on Shakespeare: bench/generation.py `trained_llama`)")


def _build_note(variant: str, side: dict[str, Any]) -> str:
    build = side.get("build", "native")
    note = f"{variant}: {build} build, repacking {'on' if side.get('repack', True) else 'off'}"
    if build != "native":
        note += f" ({NOAMX_WHY})"
    if not side.get("repack", True):
        note += f" ({NO_REPACK_WHY})"
    return note


def render(r: dict[str, Any]) -> list[str]:
    """The llama.cpp block of docs/BENCHMARKS.md."""
    mat = r.get("material") or {"describe": LLAMA_124M}
    pre = mat.get("pre_tokenizer") or (r.get("convert") or {}).get("pre_tokenizer", "gpt-2")
    flag = "" if r.get("material", {}).get("name", "llama-124m") == "llama-124m" else f" --material {mat['name']}"
    lines = [*run_header(f"llama.cpp vs ortserve at the same bits (bench/llamacpp.py{flag})", r),
             f"- CPU vector extensions: {', '.join((r.get('machine') or {}).get('vector_extensions') or ['not recorded'])}",
             f"- Checkpoint: {mat['describe']}; llama.cpp (llama-cpp-python 0.3.36's vendored tree, built here) runs it "
             f"converted by its own convert_hf_to_gguf.py (pre-tokenizer `{pre}`), quantized by llama-quantize; "
             "ortserve runs its `python -m export` package, variant as paired. Pairs: "
             + ", ".join(f"{v} ↔ {QUANTS[v].upper()}" for v in r.get("variants", [])) + ".",
             *(f"- **{v} is ungated**: {why}." for v, why in (mat.get("ungated") or {}).items()),
             *(["- Each side's threads and binding:", *sides_lines(r["sides"], vllm_ran=False)] if r.get("sides") else
               []), ""]
    cv = r.get("convert")
    if cv:
        g = cv["greedy_32"]
        lines += [f"Conversion check: llama.cpp's tokenization (llama-server /tokenize) equals ours on all "
                  f"{len(cv['tokenizer_check']['texts'])} check strings; greedy continuation of a "
                  f"{r.get('prompt_tokens', 32)}-token prompt, f32 GGUF vs ortserve fp32: the first "
                  f"{g['leading_equal']} of 32 tokens equal. Files: "
                  + ", ".join(f"{v} {f['bytes'] / 1e6:.0f} MB" for v, f in cv["files"].items()) + ".", ""]
    raw = r.get("raw")
    if raw:
        lines += [f"### Batch-1 decode, no serving ({raw['threads']} threads; {raw['rounds']} interleaved rounds, medians)",
                  "", f"llama.cpp: `llama-bench -t {raw['threads']} -p 0 -n {raw['new_tokens']} -r 1`; ortserve: one "
                  f"decode step of the variant's graph in-process at past {raw['new_tokens'] // 2} (IOBinding, one "
                  "spinning pool), as tokens/s.", "",
                  "| ours ↔ llama.cpp | ortserve graph tok/s | llama.cpp tok/s | ortserve / llama.cpp | "
                  "llama.cpp --repack 0 tok/s |", "|---|---|---|---|---|"]
        lines += [f"| {v} ↔ {x['quant'].upper()} | {x['ortserve_tokens_per_s']:.1f} | {x['llamacpp_tokens_per_s']:.1f} | "
                  f"{x['ratio']:.2f} | " + (f"{x['llamacpp_no_repack_tokens_per_s']:.1f}"
                                            if 'llamacpp_no_repack_tokens_per_s' in x else "-") + " |"
                  for v, x in raw.items() if isinstance(x, dict) and "quant" in x]
        lines.append("")
    sv = r.get("served")
    if sv:
        lines += [f"### Served: aggregate tokens/s and time to first token ({r.get('prompt_tokens')}-token prompts, "
                  f"{r.get('new_tokens')} new tokens, greedy, ignore_eos; ortserve GenerateStream over gRPC, llama-server "
                  "/v1/completions streamed)", "",
                  "Each cell: median of the runs; the sides take turns run by run, a second apart. llama-server's "
                  "build and repacking per pair: " + "; ".join(_build_note(v, (r.get("sides") or {}).get(f"llamacpp_{v}", {}))
                                                               for v in sv) + ".", "",
                  *table(["ours ↔ llama.cpp", "streams", "ortserve tok/s", "llama.cpp tok/s", "ortserve / llama.cpp",
                          "ortserve TTFT p50 ms", "llama.cpp TTFT p50 ms"],
                         [[f"{v} ↔ {x['quant'].upper()}", n, f"{c['ortserve']['tokens_per_s']:.1f}",
                           f"{c['llamacpp']['tokens_per_s']:.1f}", f"{c['ratio_tokens_per_s']:.2f}",
                           f"{c['ortserve']['ttft_p50_ms']:.0f}", f"{c['llamacpp']['ttft_p50_ms']:.0f}"]
                          for v, x in sv.items() for n, c in x["streams"].items()]), ""]
    tt = r.get("ttft")
    if tt:
        lines += [f"### Time to first token, each server alone ({r.get('prompt_tokens')}-token prompts, one request at a "
                  "time, 0.2 s apart; the servers take turns round by round, the other stopped)", "",
                  *table(["ours ↔ llama.cpp", "requests per side", "ortserve TTFT p50 ms", "llama.cpp TTFT p50 ms",
                          "goal ≤"],
                         [[f"{v} ↔ {x['quant'].upper()}", x["requests"], f"{x['ortserve_ttft_p50_ms']:.1f}",
                           f"{x['llamacpp_ttft_p50_ms']:.1f}",
                           "met" if x["ortserve_ttft_p50_ms"] <= x["llamacpp_ttft_p50_ms"] else "**missed**"]
                          for v, x in tt.items()]), ""]
    if r.get("rss"):
        lines += rss_lines(r["rss"])
    return lines


def gb(n: float) -> str:
    return f"{n / 1e9:.2f}"


def started_rule(x: dict[str, Any]) -> str:
    """When a context's server was started (the rule changed: reports before headroom_bytes used half of the memory)."""
    if "headroom_bytes" not in x:
        return ("A context is served only when its cache and weights fit in half of the memory available at that "
                "moment; otherwise the computed bytes are the figure.")
    return ("Contexts are served smallest first; a larger one starts only when its cache, plus the most memory a "
            "measured server used beside its cache, plus " f"{x['headroom_bytes'] / 2**30:.0f} GiB of headroom, fits "
            "in the memory available at that moment (`MemAvailable`); otherwise the computed bytes are the figure.")


def logged_slots(x: dict[str, Any]) -> str:
    """Why the server's logged cache is larger than the computed one: the mixed graph's scratch slot."""
    logged = [row for row in x["rows"] if row.get("logged_per_slot")]
    if not logged:
        return ""
    slots = round(logged[0]["logged_total"] / logged[0]["logged_per_slot"])
    if slots == logged[0]["slots"]:
        return ""
    return (f" The server's log counts {slots} slots' worth: the {logged[0]['slots']} plus the scratch slot the "
            "mixed graph's filler rows are written into (server/generation/slot_runner.py), as long as any other.")


def rss_lines(x: dict[str, Any]) -> list[str]:
    """The rss piece: cache bytes computed per context, the resident memory where a server was started."""
    return [f"### Memory of the served {x['variant']} package, {x['rows'][0]['slots']} slots (bench/llamacpp_rss.py)",
            "", f"Cache: {x['bytes_per_token']:,} bytes a token a slot (every layer's keys and values), allocated and "
            f"zero-filled at load for the whole context. The variant's graphs on disk: {gb(x['weights_bytes'])} GB. "
            f"Package cap {x['cap']:,} tokens; the model's positions {x['positions']:,}. " + started_rule(x)
            + logged_slots(x), "",
            *table(["context", "tokens a slot", "cache GB (computed)", "cache GB (server log)", "RSS GB", "RSS - cache GB",
                    "served"],
                   [[row["context"], f"{row['tokens']:,}", gb(row["cache_bytes"]),
                     gb(row["logged_total"]) if "logged_total" in row else "-",
                     gb(row["rss_bytes"]) if "rss_bytes" in row else "-",
                     gb(row["rss_bytes"] - row["cache_bytes"]) if "rss_bytes" in row else "-", row["served"]]
                    for row in x["rows"]]), ""]
