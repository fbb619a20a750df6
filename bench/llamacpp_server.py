"""llama-server and the llama.cpp tools as bench/llamacpp.py starts them (bench/setup_llamacpp.sh builds them)."""
from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Any

from testing.launch import ChildProcess as Process, ServerStartError, http_ok, free_port

from .llamacpp_report import NO_REPACK_WHY, NOAMX_WHY
from .openmp import OWN, unset_command

log = logging.getLogger(__name__)
HERE = Path(__file__).resolve().parent
LLAMACPP_VENV = Path(os.environ.get("LLAMACPP_VENV", HERE / ".venv-llamacpp"))


class LlamaCppError(RuntimeError):
    """A tool is missing, a conversion failed, or llama.cpp disagrees with our tokenizer."""


def tool(name: str) -> Path:
    path = LLAMACPP_VENV / "bin" / name
    if not (LLAMACPP_VENV / ".complete").is_file() or not path.is_file():
        raise LlamaCppError(f"llama.cpp peer not installed ({path} missing): run bash bench/setup_llamacpp.sh")
    return path


class LlamaServer:
    """llama-server on one GGUF, every core, `parallel` slots of `ctx_per_slot` tokens, OpenAI API on a free port."""

    def __init__(self, gguf: Path, threads: int, parallel: int, ctx_per_slot: int = 512,
                 startup_timeout: float = 300, repack: bool = True, build: str = "native") -> None:
        self.port = free_port()
        self.args = ["-m", str(gguf), "-t", str(threads), "-tb", str(threads), "--parallel", str(parallel),
                     "-c", str(parallel * ctx_per_slot), "--host", "127.0.0.1", "--port", str(self.port),
                     *([] if repack else ["--no-repack"])]
        self.threads, self.parallel, self.gguf, self.repack, self.build = threads, parallel, gguf, repack, build
        binary = tool("llama-server") if build == "native" else NOAMX_BIN / "llama-server"
        self.proc = Process(unset_command([str(binary), *self.args]))
        self.proc.wait_for_line(re.compile(r"listening on http|server is listening"), startup_timeout)
        self.proc.wait_ready(http_ok(f"http://127.0.0.1:{self.port}/health"), startup_timeout, "llama-server /health",
                             LlamaCppError)

    def tokenize(self, text: str) -> list[int]:
        import requests

        r = requests.post(f"http://127.0.0.1:{self.port}/tokenize", json={"content": text, "add_special": False},
                          timeout=30)
        r.raise_for_status()
        return [int(t) for t in r.json()["tokens"]]

    def greedy(self, ids: list[int], n: int) -> list[int]:
        """n greedy token ids after the prompt ids (its native /completion, which can return ids)."""
        import requests

        r = requests.post(f"http://127.0.0.1:{self.port}/completion",
                          json={"prompt": ids, "n_predict": n, "temperature": 0.0, "top_k": 1, "ignore_eos": True,
                                "return_tokens": True, "cache_prompt": False}, timeout=120)
        r.raise_for_status()
        return [int(t) for t in r.json()["tokens"]]

    def describe(self) -> dict[str, Any]:
        return {"threads": self.threads,
                "binding": "not pinned (its defaults: no --cpu-mask / --cpu-strict, --poll 50)", "unset": list(OWN),
                "parallel": self.parallel, "quant": self.gguf.stem.rsplit("-", 1)[-1], "repack": self.repack,
                "build": self.build, **({} if self.build == "native" else {"why_build": NOAMX_WHY}),
                **({} if self.repack else {"why_no_repack": NO_REPACK_WHY}),
                "args": ["llama-server", *[a if a != str(self.gguf) else self.gguf.name for a in self.args]]}

    def stop(self) -> None:
        self.proc.stop()


NOAMX_BIN = LLAMACPP_VENV / "noamx" / "bin"


def start_llama_server(gguf: Path, threads: int, parallel: int) -> LlamaServer:
    """llama-server as built natively, with its defaults. When it dies at start (2026-11-26, Intel Xeon with AMX: the
    AMX matmul of the llama-cpp-python 0.3.36 tree crashes on Q8_0 / Q4_0 in llama-server; gdb backtrace in
    docs/BENCHMARKS.md): the build without AMX (bench/setup_llamacpp_noamx.sh) with the same defaults, else the
    native one with --no-repack."""
    try:
        return LlamaServer(gguf, threads, parallel)
    except ServerStartError as exc:
        first = str(exc).splitlines()[0]
    if (NOAMX_BIN / "llama-server").is_file():
        log.warning("llama-server on %s did not start (%s); the build without AMX instead", gguf.name, first)
        return LlamaServer(gguf, threads, parallel, build="no AMX")
    log.warning("llama-server on %s did not start (%s) and bench/setup_llamacpp_noamx.sh has not run; "
                "again with --no-repack", gguf.name, first)
    return LlamaServer(gguf, threads, parallel, repack=False)


