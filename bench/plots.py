"""matplotlib figures of the results (PNG, written atomically). Bars and points are medians; error bars
span min–max over the repeats."""
from __future__ import annotations

import io
import logging
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display: files only
import matplotlib.pyplot as plt  # noqa: E402

from .results import write_bytes  # noqa: E402

log = logging.getLogger(__name__)


def _err(stats: list[dict[str, float]]) -> list[list[float]]:
    return [[s["median"] - s["min"] for s in stats], [s["max"] - s["median"] for s in stats]]


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    write_bytes(path, buf.getvalue())
    return path


def _bars(ax: Any, groups: list[str], series: dict[str, list[dict[str, float]]], ylabel: str) -> None:
    n = len(series)
    width = 0.8 / max(n, 1)
    for i, (name, stats) in enumerate(series.items()):
        xs = [g + (i - (n - 1) / 2) * width for g in range(len(groups))]
        ax.bar(xs, [s["median"] for s in stats], width, yerr=_err(stats), capsize=3, label=name)
    ax.set_xticks(range(len(groups)), groups)
    ax.set_ylabel(ylabel)
    ax.grid(axis="y", alpha=0.3)


def encoder_plots(res: dict[str, Any], out: Path) -> list[Path]:
    models = res["models"]
    fig, axes = plt.subplots(len(models), 2, figsize=(12, 4 * len(models)), squeeze=False)
    for row, m in enumerate(models):
        for col, sh in enumerate(m["shapes"][:2]):
            ax = axes[row][col]
            backends = list(sh["latency_ms"])
            _bars(ax, backends, {"latency": [sh["latency_ms"][b] for b in backends]}, "ms per batch (log)")
            ax.set_yscale("log")
            ax.set_title(f"{m['checkpoint']['name']}: batch {sh['batch']} × seq {sh['seq']}")
            ax.tick_params(axis="x", labelrotation=20)
            ax.get_legend() and ax.get_legend().remove()
    paths = [_save(fig, out / "encoder_latency.png")]

    fig, axes = plt.subplots(1, len(models), figsize=(6 * len(models), 4), squeeze=False)
    for col, m in enumerate(models):
        ax = axes[0][col]
        groups = [f"b{s['batch']} s{s['seq']}" for s in m["shapes"]]
        series = {b: [s["gflops"][b] for s in m["shapes"]] for b in m["shapes"][0]["gflops"]}
        series[f"numpy sgemm {res['sgemm']['n']}²"] = [s.get("sgemm_gflops", res["sgemm"]["gflops"])
                                                      for s in m["shapes"]]
        _bars(ax, groups, series, "achieved GFLOP/s (matmuls)")
        ax.set_title(m["checkpoint"]["name"])
        ax.legend(fontsize=7)
    paths.append(_save(fig, out / "encoder_gflops.png"))
    return paths


def decoder_plots(res: dict[str, Any], out: Path) -> list[Path]:
    rows = res["step_time"]["rows"]
    past = [r["past"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for key, label in (("ort_cached", "ORT with cache (1 new token)"), ("torch_cached", "torch with cache"),
                       ("ort_uncached", "ORT full recompute (past+1 tokens)")):
        stats = [r[key] for r in rows]
        ax.errorbar(past, [s["median"] for s in stats], yerr=_err(stats), marker="o", capsize=3, label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(past, [str(p) for p in past])
    ax.set_xlabel("past length (tokens)")
    ax.set_ylabel("step time (ms)")
    ax.set_title(f"decoder step time, batch 1 ({res['checkpoint']['name']})")
    ax.grid(alpha=0.3)
    ax.legend()
    paths = [_save(fig, out / "decoder_step_time.png")]

    fig, ax = plt.subplots(figsize=(7, 4))
    tps = res["tokens_per_s"]
    _bars(ax, list(tps), {"tokens/s": list(tps.values())}, f"tokens/s ({res['new_tokens']} new, greedy, batch 1)")
    ax.set_yscale("log")
    ax.set_title("greedy generation speed")
    paths.append(_save(fig, out / "decoder_tokens_per_s.png"))
    return paths


def server_plots(res: dict[str, Any], out: Path) -> list[Path]:
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4))
    conc = sorted(res["classify"], key=int)
    _bars(a1, [f"c={c}" for c in conc], {way: [res["classify"][c][way]["throughput_per_s"] for c in conc]
                                        for way in ("in_process", "grpc")}, "texts classified / s")
    a1.set_title(f"Classify, batch {res['batch_size']} per request")
    a1.legend()
    streams = sorted(res["generation"], key=int)
    _bars(a2, [f"{n} streams" for n in streams], {way: [res["generation"][n][way]["tokens_per_s"] for n in streams]
                                                  for way in ("in_process", "grpc")}, "aggregate tokens / s")
    a2.set_title(f"GenerateStream, {res['stream_new_tokens']} new tokens each")
    a2.legend()
    return [_save(fig, out / "server.png")]


def peer_plots(res: dict[str, Any], out: Path) -> list[Path]:
    cells = res["cells"]
    groups = [f"{c['clients']} cl, b{c['batch']}" for c in cells]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4))
    _bars(a1, groups, {k: [c[k]["rows_per_s"] for c in cells] for k in ("ortserve", "mlserver")}, "rows / s")
    a1.set_title("KServe ModelInfer throughput (tritonclient load)")
    a1.legend()
    x = range(len(cells))
    for k, marker, color in (("ortserve", "o", "C0"), ("mlserver", "s", "C1")):
        a2.plot(x, [c[k]["p50_ms"] for c in cells], marker=marker, color=color, label=f"{k} p50")
        a2.plot(x, [c[k]["p95_ms"] for c in cells], marker=marker, color=color, linestyle="--", label=f"{k} p95")
    a2.set_xticks(list(x), groups)
    a2.set_ylabel("latency (ms)")
    a2.set_yscale("log")
    a2.grid(alpha=0.3)
    a2.legend(fontsize=7)
    return [_save(fig, out / "peer.png")]


PLOTTERS = {"encoder": encoder_plots, "decoder": decoder_plots, "server": server_plots, "peer": peer_plots}


def make_plots(results: dict[str, dict[str, Any]], out: Path) -> dict[str, list[Path]]:
    made: dict[str, list[Path]] = {}
    for piece, res in results.items():
        if res.get("status") == "ok" and piece in PLOTTERS:
            made[piece] = PLOTTERS[piece](res, out)
    return made
