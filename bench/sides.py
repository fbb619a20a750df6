"""How each side of a comparison ran (threads, binding, spinning, preloads): one line per side in the reports.

Results written before the sides were recorded (before 2026-11-26) had vLLM on ONE core: its CPU build's default
`VLLM_CPU_OMP_THREADS_BIND=auto` reserves a core, and on this 2-core machine it computed on core 0 alone (its log:
`core ids=[0]`), without the preloads its docs ask for. Their vLLM figures are labelled so.
"""
from __future__ import annotations

from typing import Any

LEGACY_VLLM = ("vLLM: ONE core (these vLLM figures predate 2026-11-26: vLLM ran with its default "
               "VLLM_CPU_OMP_THREADS_BIND=auto, which reserves one of the 2 cores for its front end, so its compute "
               "ran on core 0 alone, its log saying `core ids=[0]`; no tcmalloc/libiomp5 preloads)")

_NAMES = {"ortserve": "ortserve", "vllm": "vLLM", "genai": "onnxruntime-genai", "llamacpp": "llama.cpp"}


def side_line(name: str, side: dict[str, Any]) -> str:
    """'vLLM: 2 threads, cores 0-1 (its log: core ids=[0, 1]); OMP_NUM_THREADS=2, ...'."""
    parts = [f"{side['threads']} threads", str(side.get("binding", "binding not recorded"))]
    logged = side.get("logged_core_ids")
    if "logged_core_ids" in side:
        parts[-1] += f" (its log: core ids={logged})" if logged is not None else " (its log names no core ids)"
    for key in ("intra_op_spinning", "max_sequences", "parallel", "variant", "quant", "stream_interval",
                "decode_steps", "decode_run_ms"):
        if key in side:
            parts.append(f"{key.replace('_', ' ')} {side[key]}")
    env = side.get("env")
    if env:
        parts.append(", ".join(f"{k}={v}" for k, v in env.items()))
    if side.get("unset"):
        parts.append("unset " + ", ".join(side["unset"]))
    if side.get("args"):
        parts.append("`" + " ".join(side["args"]) + "`")
    base, _, which = name.partition("_")     # e.g. "llamacpp_w4": llama.cpp's side of the w4 pair
    label = _NAMES.get(base, base) + (f" ({which.replace('_', ' ')})" if which else "")
    return f"{label}: " + "; ".join(parts)


def sides_lines(sides: dict[str, Any] | None, vllm_ran: bool, indent: str = "") -> list[str]:
    """Markdown bullets, one per side; a vLLM that ran without a recorded configuration is the one-core legacy."""
    sides = sides or {}
    lines = [f"{indent}- {side_line(name, s)}" for name, s in sides.items()]
    if vllm_ran and "vllm" not in sides:
        lines.append(f"{indent}- {LEGACY_VLLM}")
    return lines


def vllm_label(sides: dict[str, Any] | None) -> str:
    """The vLLM column's name: 'vLLM (1 core)' for results from before its configuration was recorded."""
    return "vLLM" if sides and "vllm" in sides else "vLLM (1 core)"
