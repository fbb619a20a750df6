"""The `rss` piece of bench/llamacpp.py: what a decoder package costs in memory when served with 16 slots, at the
package's cap and at the model's own positions (no cap).

Every slot is allocated and zero-filled at load for the whole context (server/generation/device_cache.py), so the
cache bytes are known before anything starts: layers x 2 (key, value) x kv heads x context x head dim x the cache's
element size, per slot. The contexts are served smallest first; each measured one gives the server's memory beside
its cache (weights, runtime, arenas), and a larger context is started only when its cache plus the most of that seen
so far, plus HEADROOM, fits in MemAvailable: a server that cannot fit would swap a shared machine or be killed, and
its computed bytes are then the figure. Each server that does start is measured as its process tree's resident memory (VmRSS) once it is SERVING,
beside the bytes its load log reports. A package without the cap would be a second export of the model; its cache
is computed from the positions in config.json, never allocated.
"""
from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

from testing.launch import ServerProcess, ServerStartError

log = logging.getLogger(__name__)
SLOTS = 16
HEADROOM = 2 << 30     # bytes left to the rest of the machine while a server is measured
_KV_LOG = re.compile(r"KV cache (\d+) bytes per slot \(context (\d+) tokens\), (\d+) bytes in all")


def meminfo(key: str) -> int:
    """/proc/meminfo `key` (MemAvailable, MemTotal) in bytes."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/meminfo has no {key}")


def tree_rss(pid: int) -> int:
    """VmRSS of `pid` and every descendant, in bytes."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d.name))
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        todo += children.get(p, [])
        try:
            status = Path(f"/proc/{p}/status").read_text()
        except OSError:
            continue
        found = re.search(r"^VmRSS:\s+(\d+) kB", status, re.M)
        total += int(found.group(1)) * 1024 if found else 0
    return total


def cache_bytes_per_token(manifest: dict[str, Any], variant: str) -> int:
    """Key and value bytes of one position of one slot, every layer (the int8-cache variants: 1 byte an element)."""
    c = manifest["cache"]
    item = 1 if variant.endswith("kv8") else 4
    return int(c["num_layers"]) * 2 * int(c.get("num_kv_heads") or c["num_heads"]) * int(c["head_dim"]) * item


def variant_bytes(pkg: Path, manifest: dict[str, Any], variant: str) -> int:
    """The variant's graph and mixed twin on disk (external data included), what onnxruntime loads."""
    names = {manifest["variants"][variant], manifest["cache"].get("mixed_graphs", {}).get(variant)}
    total = 0
    for name in filter(None, names):
        for f in pkg.iterdir():
            if f.name == name or f.name.startswith(name + ".") or f.name.startswith(Path(name).stem + ".onnx.data"):
                total += f.stat().st_size
    return total


def serve_rss(repo: Path, variant: str, threads: int, context: int) -> dict[str, Any]:
    """Start the server with SLOTS slots and `context` tokens a slot; its resident memory once SERVING."""
    srv = ServerProcess(repo, ["--intra-op-threads", str(threads), "--max-sequences", str(SLOTS), "--variant", variant,
                               "--max-model-len", str(context)], startup_timeout=600)
    try:
        rss = tree_rss(srv.pid)
        logged = [m for m in (_KV_LOG.search(line) for line in srv.lines) if m]
    finally:
        srv.stop()
    out: dict[str, Any] = {"rss_bytes": rss}
    if logged:
        out.update(logged_per_slot=int(logged[-1].group(1)), logged_total=int(logged[-1].group(3)))
    return out


def rss_piece(mat: Any, threads: int, variant: str) -> dict[str, Any]:
    """Rows for the model's own positions, the package's cap and fractions of it (to show what is fixed and what
    grows with the context); served smallest first, each start judged by what the smaller ones measured."""
    manifest = mat.manifest()
    positions = int(json.loads((mat.ckpt / "config.json").read_text())["max_position_embeddings"])
    cap, per_token = int(manifest["max_length"]), cache_bytes_per_token(manifest, variant)
    weights = variant_bytes(mat.package, manifest, variant)
    contexts = (("no cap (the model's positions)", positions), ("the package's cap", cap), ("cap / 2", cap // 2),
                ("cap / 4", cap // 4), ("cap / 8", cap // 8))
    rows: dict[str, dict[str, Any]] = {}
    beside = weights        # the most memory a measured server used beside its cache (the weights before any)
    for label, context in sorted(contexts, key=lambda c: c[1]):
        need, free = per_token * context * SLOTS, meminfo("MemAvailable")
        row: dict[str, Any] = {"context": label, "tokens": context, "slots": SLOTS, "cache_bytes": need,
                               "cache_bytes_per_slot": per_token * context, "mem_available": free,
                               "predicted_bytes": need + beside}
        if context > cap:
            row["served"] = (f"not exported: a package at {context} positions would need {need / 1e9:.1f} GB of "
                             f"cache for {SLOTS} slots")
        elif need + beside + HEADROOM > free:
            row["served"] = (f"not started: cache {need / 1e9:.1f} GB + {beside / 1e9:.1f} GB beside it + "
                             f"{HEADROOM / 2**30:.0f} GiB headroom is over the {free / 1e9:.1f} GB available")
        else:
            try:
                row.update(serve_rss(mat.repo, variant, threads, context), served="measured")
                beside = max(beside, row["rss_bytes"] - need)
            except ServerStartError as exc:
                row["served"] = f"refused at start: {str(exc).splitlines()[0]}"
        log.info("rss %s (%d tokens): %s", label, context, {k: v for k, v in row.items() if k != "context"})
        rows[label] = row
    return {"variant": variant, "weights_bytes": weights, "cap": cap, "positions": positions,
            "bytes_per_token": per_token, "rows": [rows[label] for label, _ in contexts],
            "mem_total": meminfo("MemTotal"), "headroom_bytes": HEADROOM}
