"""The engine's host cache buffers get transparent huge pages, as they do in a server process that allocates them
at start (server/generation/device_cache.py asks for them with madvise; onnxruntime's allocator does not).

Checked in a fresh interpreter: in a long-lived process (this test session, after other tests freed large
buffers) glibc's dynamic mmap threshold may serve the allocation from heap pages already touched at 4 KiB, and
those are not turned into huge pages when they fault in — the answer would depend on which tests ran before.
"""
from __future__ import annotations

import subprocess
import sys

import pytest

from tests.server_process import ROOT

PROBE = """
import numpy as np
from server.generation.device_cache import CacheBuffers, Device

cache = CacheBuffers(["k"], slots=8, kv_heads=4, max_length=1024, head_dim=64, dtype=np.float32,
                     device=Device("cpu", 0))
middle = cache.values["k"].data_ptr() + cache.nbytes // 2      # the advice splits off the buffer's first page
inside = False
for line in open("/proc/self/smaps"):
    head = line.split()[0]
    if "-" in head and ":" not in head:
        lo, hi = (int(x, 16) for x in head.split("-"))
        inside = lo <= middle < hi
    elif inside and head == "AnonHugePages:":
        print(int(line.split()[1]))
        break
else:
    print(0)
"""


def _thp_mode() -> str:
    try:
        text = open("/sys/kernel/mm/transparent_hugepage/enabled").read()
    except OSError:
        return "absent"
    return text.split("[", 1)[1].split("]", 1)[0]


@pytest.mark.skipif(_thp_mode() not in ("madvise", "always"),
                    reason="the kernel offers no transparent huge pages here (THP disabled or not Linux)")
def test_host_buffers_get_huge_pages() -> None:
    run = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    # How many depends on the free 2 MiB blocks; without the advice, none (THP "madvise").
    assert int(run.stdout.split()[-1]) > 0, run.stdout
