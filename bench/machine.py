"""What machine and software a run measured on (goes into every result file and the report)."""
from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

_PACKAGES = ("numpy", "torch", "onnx", "onnxruntime", "onnxscript", "transformers", "tokenizers", "grpcio",
             "protobuf", "tritonclient", "matplotlib")


def cpu_model() -> str:
    """The first `model name` of /proc/cpuinfo (platform.processor() is often empty on Linux)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


# The vector units the matmul kernels of onnxruntime and llama.cpp pick between (in /proc/cpuinfo's spelling).
_VECTOR_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx_vnni", "avx512f", "avx512bw", "avx512_vnni",
                 "avx512_bf16", "amx_tile", "amx_int8", "amx_bf16")


def vector_extensions() -> list[str]:
    """The CPU's vector extensions among _VECTOR_FLAGS, from the first `flags` line of /proc/cpuinfo."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                have = set(line.split(":", 1)[1].split())
                return [f for f in _VECTOR_FLAGS if f in have]
    except OSError:
        pass
    return []


def versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in _PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def git_commit(root: Path) -> str | None:
    try:
        proc = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True,
                              timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.strip() or None


def describe(root: Path) -> dict[str, Any]:
    try:
        load = list(os.getloadavg())
    except OSError:
        load = None
    return {"nproc": len(os.sched_getaffinity(0)), "cpu_model": cpu_model(), "vector_extensions": vector_extensions(), "platform": platform.platform(),
            "python_executable": sys.executable, "versions": versions(), "git_commit": git_commit(root),
            "loadavg_at_start": load}
