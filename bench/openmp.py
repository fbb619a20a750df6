"""The OpenMP settings the benchmark makes for its own process (bench/__main__.py: two threads, idle threads
sleeping), which a peer must not inherit: a peer runs with its own defaults and sets its threads through its own
API or flags (llama.cpp's -t, CTranslate2's intra_threads, torch.set_num_threads). OMP_WAIT_POLICY=PASSIVE puts
every barrier of an OpenMP engine behind a sleep and a wake-up (what it cost llama.cpp: bench/FINDINGS.md)."""
from __future__ import annotations

import os
from collections.abc import Mapping

OWN = ("OMP_WAIT_POLICY", "OMP_NUM_THREADS")


def peer_environ(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """`env` (default this process's) without the benchmark's own OpenMP settings."""
    return {k: v for k, v in (os.environ if env is None else env).items() if k not in OWN}


def unset_command(cmd: list[str], names: tuple[str, ...] = OWN) -> list[str]:
    """`cmd` under `env -u NAME ...`, for a child spawned with this process's environment merged in
    (testing.launch), whose inherited variables only the command itself can drop."""
    return ["env", *(x for name in names for x in ("-u", name)), *cmd]
