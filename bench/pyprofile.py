"""cProfile statistics of a server process, summarised as the functions with the most own time per request.

cProfile sees the main thread only: for the server that is the asyncio loop (gRPC handling, protobuf,
tokenization, batching); onnxruntime's compute runs in executor threads and shows up only as waiting.
Start-up and shutdown (imports, model loading) are removed by subtracting a baseline run of the same
server that served no request.
"""
from __future__ import annotations

import pstats
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
Key = tuple[str, int, str]


def _where(file: str, line: int, name: str) -> str:
    try:
        file = str(Path(file).resolve().relative_to(ROOT))
    except ValueError:
        parts = Path(file).parts
        file = "/".join(parts[-2:]) if len(parts) > 1 else file
    return f"{name} ({file}:{line})"


def _load(stats_file: Path) -> dict[Key, tuple[int, float, float]]:
    st = pstats.Stats(str(stats_file))
    return {k: (v[1], v[2], v[3]) for k, v in st.stats.items()}  # type: ignore[attr-defined]


def _idle(key: Key) -> bool:
    return "epoll" in key[2] or "select.select" in key[2]  # the event loop waiting for work


def top_functions(stats_file: Path, requests: int, baseline: Path | None = None, top: int = 12) -> dict[str, Any]:
    """Own-time leaders in ms per request (minus the baseline run), and busy main-thread time per request."""
    loaded = _load(stats_file)
    base = _load(baseline) if baseline else {}
    rows = []
    busy = 0.0
    for key, (calls, tottime, cumtime) in loaded.items():
        b_calls, b_tot, b_cum = base.get(key, (0, 0.0, 0.0))
        d_tot, d_cum, d_calls = tottime - b_tot, cumtime - b_cum, calls - b_calls
        if _idle(key) or d_calls <= 0:
            continue
        busy += max(d_tot, 0.0)
        rows.append((d_tot, d_cum, d_calls, _where(*key)))
    rows.sort(key=lambda r: -r[0])
    return {"requests": requests, "busy_ms_per_request": busy / requests * 1e3,
            "note": "main thread only; start-up removed by subtracting a no-request run" if baseline else
                    "main thread only; includes start-up",
            "top_own_time": [{"function": w, "own_ms_per_request": t / requests * 1e3,
                              "cum_ms_per_request": c / requests * 1e3, "calls": n} for t, c, n, w in rows[:top]]}


def profile_server(start: Callable[[Path], Any], load: Callable[[Any], None], requests: int, work: Path
                   ) -> dict[str, Any]:
    """start(profile_file) -> a server with .stop(); load(server) sends `requests` requests.
    Runs the server twice (no requests, then the load) and returns the difference."""
    files = []
    for name, fn in (("baseline", None), ("loaded", load)):
        prof = work / f"server-{name}.prof"
        server = start(prof)
        try:
            if fn is not None:
                fn(server)
        finally:
            server.stop()
        files.append(prof)
    return top_functions(files[1], requests, baseline=files[0])
