"""The issue's goals, checked against the result files: measured value, target, met or missed by how much,
and the profile evidence that explains a miss."""
from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

# Op types whose time is matrix products in an onnxruntime profile (for the matmul-only rate).
MATMUL_OPS = ("MatMul", "FusedMatMul", "Gemm", "FusedGemm", "MatMulInteger", "DynamicQuantizeMatMul",
              "MatMulIntegerToFloat", "Attention", "MultiHeadAttention", "QAttention")


@dataclass(frozen=True)
class Check:
    """One goal evaluated on one subject (a model, a shape, a cell)."""

    goal: str
    subject: str
    value: float | None
    low: float | None          # the range the repeats allow (min–max of the ratio)
    high: float | None
    target: float
    higher_is_better: bool
    unit: str
    evidence: str = ""

    @property
    def met(self) -> bool | None:
        if self.value is None:
            return None
        return self.value >= self.target if self.higher_is_better else self.value <= self.target

    @property
    def miss(self) -> str:
        """How far from the target, as the fraction of the target still missing ('' when met)."""
        if self.value is None or self.met:
            return ""
        if self.higher_is_better:
            return f"{(1 - self.value / self.target) * 100:.0f}% short ({self.value:.3g} vs {self.target:g})"
        return f"{(self.value / self.target - 1) * 100:.0f}% over ({self.value:.3g} vs {self.target:g})"

    def as_json(self) -> dict[str, Any]:
        return {"goal": self.goal, "subject": self.subject, "value": self.value, "low": self.low, "high": self.high,
                "target": self.target, "higher_is_better": self.higher_is_better, "unit": self.unit,
                "met": self.met, "miss": self.miss, "evidence": self.evidence}


def _r(d: dict[str, Any] | None) -> tuple[float | None, float | None, float | None]:
    if not d:
        return None, None, None
    return d.get("median"), d.get("min"), d.get("max")


def _top(profile: dict[str, Any] | None, n: int = 3) -> str:
    if not profile or not profile.get("top_ops"):
        return ""
    ops = ", ".join(f"{o['op']} {o['share'] * 100:.0f}%" for o in profile["top_ops"][:n])
    return f"{ops} of kernel time ({profile.get('run_ms_mean') or 0:.1f} ms/run profiled)"


def matmul_rate(shape: dict[str, Any], backend: str) -> float | None:
    """Estimated GFLOP/s inside the matmul kernels alone: the model's matmul FLOPs over the timed median
    latency × the share of kernel time the profile gives matmul ops (the profiled runs themselves are few
    and not interleaved, so only their shares are used)."""
    prof = (shape.get("ort_profiles") or {}).get(backend.removeprefix("ort_"))
    lat = shape["latency_ms"].get(backend if backend.startswith("ort_") else f"ort_{backend}")
    if not prof or not lat:
        return None
    share = sum(o["share"] for o in prof["top_ops"] if o["op"] in MATMUL_OPS) * (prof.get("kernel_share_of_run") or 1.0)
    return shape["matmul_gflop"] / (share * lat["median"] / 1e3) if share else None


def _shape(model: dict[str, Any], batch: int, seq: int) -> dict[str, Any] | None:
    return next((s for s in model["shapes"] if s["batch"] == batch and s["seq"] == seq), None)


def encoder_checks(res: dict[str, Any], results: dict[str, dict[str, Any]] | None = None) -> Iterator[Check]:
    for m in res["models"]:
        name = m["checkpoint"]["name"]
        for (b, s), target in (((8, 128), 1.3), ((1, 32), 3.0)):
            sh = _shape(m, b, s)
            if sh is None:
                continue
            v, lo, hi = _r(sh["ratios"].get("ort_fp32_speedup_vs_torch"))
            lat = sh["latency_ms"]
            sg = sh.get("sgemm_gflops", res["sgemm"]["gflops"])["median"]
            floor_ms = sh["matmul_gflop"] / sg * 1e3  # every matmul at the sgemm rate, nothing else costing time
            ev = (f"torch {lat['torch']['median']:.2f} ms vs ORT fp32 {lat['ort_fp32']['median']:.2f} ms; if every "
                  f"matmul ran at the sgemm rate and nothing else took time a call would take {floor_ms:.2f} ms, "
                  f"so no fp32 backend can beat torch by more than {lat['torch']['median'] / floor_ms:.2f}× here; "
                  f"ORT fp32 profile: {_top(sh['ort_profiles'].get('fp32'))}")
            yield Check(f"ORT fp32 ≥ {target:g}× torch eager at b{b} s{s}", name, v, lo, hi, target, True, "×", ev)
        sh = _shape(m, 8, 128)
        if sh is not None:
            sgemm = sh.get("sgemm_gflops", res["sgemm"]["gflops"])["median"]
            frac = sh["fraction_of_sgemm"].get("ort_fp32")
            g = sh["gflops"]["ort_fp32"]
            mm = matmul_rate(sh, "fp32")
            ev = (f"ORT fp32 {g['median']:.1f} GFLOP/s vs sgemm {sgemm:.1f}; inside its matmul kernels alone "
                  f"about {mm:.1f} GFLOP/s (profile share × timed latency)" if mm else "") + f"; profile: {_top(sh['ort_profiles'].get('fp32'))}"
            yield Check("ORT fp32 ≥ 85% of the numpy sgemm rate (b8 s128)", name, frac,
                        g["min"] / sgemm, g["max"] / sgemm, 0.85, True, "of sgemm", ev)
        for (b, s) in ((8, 128), (1, 32)):
            sh = _shape(m, b, s)
            if sh is None or "ort_int8_speedup_vs_fp32" not in sh["ratios"]:
                continue
            v, lo, hi = _r(sh["ratios"]["ort_int8_speedup_vs_fp32"])
            ev = f"int8 profile: {_top(sh['ort_profiles'].get('int8'), 4)}"
            yield Check(f"ORT int8 ≥ 2× ORT fp32 at b{b} s{s}", name, v, lo, hi, 2.0, True, "×", ev)
        acc = m.get("int8_accuracy")
        if acc:
            ev = (f"fp32 {acc['accuracy_fp32'] * 100:.1f}%, int8 {acc['accuracy_int8'] * 100:.1f}% on "
                  f"{acc['examples']} examples; top-1 agreement {acc['top1_agreement'] * 100:.1f}%")
            yield Check("int8 accuracy drop ≤ 1 point (genre test split)", name, acc["drop_points"], None, None,
                        1.0, False, "points", ev)


def decoder_checks(res: dict[str, Any], results: dict[str, dict[str, Any]] | None = None) -> Iterator[Check]:
    name = res["checkpoint"]["name"]
    r = res["ratios"]
    v, lo, hi = _r(r.get("ort_cached_vs_uncached"))
    yield Check(f"ORT cached ≥ 5× uncached ({res['new_tokens']} new tokens)", name, v, lo, hi, 5.0, True, "×")
    rows = res["step_time"]["rows"]
    first, last = rows[0], rows[-1]
    v, lo, hi = _r(r.get("ort_step_past_last_vs_first"))
    ev = _step_growth(res, first["past"], last["past"])
    yield Check(f"ORT step time at past {last['past']} ≤ 1.5× past {first['past']}", name, v, lo, hi, 1.5, False,
                "×", ev)
    v, lo, hi = _r(r.get("ort_cached_vs_hf_generate"))
    tps = res["tokens_per_s"]
    ev = (f"HF generate {tps['hf_generate']['median']:.1f} tok/s (attention {res.get('hf_attention')}), "
          f"our torch {tps['torch_cached']['median']:.1f} tok/s, ORT {tps['ort_cached']['median']:.1f} tok/s")
    yield Check("ORT generation ≥ 2× HF generate", name, v, lo, hi, 2.0, True, "×", ev)


def _step_growth(res: dict[str, Any], p0: int, p1: int) -> str:
    a = (res.get("ort_profiles") or {}).get(f"step_past_{p0}")
    b = (res.get("ort_profiles") or {}).get(f"step_past_{p1}")
    if not a or not b:
        return ""
    ms_a = {o["op"]: o["ms_per_run"] for o in a["top_ops"]}
    grew = sorted(((o["op"], o["ms_per_run"] - ms_a.get(o["op"], 0.0)) for o in b["top_ops"]), key=lambda x: -x[1])
    parts = ", ".join(f"{op} +{d:.2f} ms" for op, d in grew[:3] if d > 0)
    return (f"profiled step {a['run_ms_mean']:.2f} → {b['run_ms_mean']:.2f} ms; growth by op: {parts}" if parts
            else "")


def _py_top(profile: dict[str, Any] | None, n: int = 3) -> str:
    if not profile:
        return ""
    fns = ", ".join(f"{f['function']} {f['own_ms_per_request']:.3f} ms" for f in profile["top_own_time"][:n])
    return (f"; server main thread busy {profile['busy_ms_per_request']:.2f} ms per request (cProfile), "
            f"most own time: {fns}")


def server_checks(res: dict[str, Any], results: dict[str, dict[str, Any]] | None = None) -> Iterator[Check]:
    conc = str(max(int(c) for c in res["classify"]))
    cell = res["classify"][conc]
    v, lo, hi = _r(cell["grpc_vs_in_process_throughput"])
    ev = (f"in-process {cell['in_process']['throughput_per_s']['median']:.1f}/s, gRPC "
          f"{cell['grpc']['throughput_per_s']['median']:.1f}/s (batch {res['batch_size']})"
          + _py_top(res.get("grpc_classify_profile")))
    yield Check(f"gRPC Classify throughput ≥ 85% of in-process at concurrency {conc}", "classifier", v, lo, hi,
                0.85, True, "of in-process", ev)
    lat = res["batch1_latency"]
    ev = (f"p50 in-process {lat['p50_ms']['in_process']:.2f} ms, gRPC {lat['p50_ms']['grpc']:.2f} ms"
          + _py_top(res.get("grpc_classify_profile")))
    yield Check("batch-1 p50 gRPC overhead over in-process ≤ 1 ms", "classifier", lat["grpc_overhead_p50_ms"],
                None, None, 1.0, False, "ms", ev)
    gen = res["generation"]
    first, last = min(gen, key=int), max(gen, key=int)
    for way in ("grpc", "in_process"):
        v, lo, hi = _r(res["generation_scaling_last_vs_first"][way])
        ev = (f"{gen[first][way]['tokens_per_s']['median']:.1f} → {gen[last][way]['tokens_per_s']['median']:.1f} "
              f"tok/s; TTFT {gen[first][way]['ttft_ms']['median']:.1f} → {gen[last][way]['ttft_ms']['median']:.1f} ms"
              + _batch_bound(results, int(first), int(last)))
        yield Check(f"{last} streams ≥ 4× the aggregate tokens/s of {first} ({way.replace('_', '-')})", "lm", v, lo,
                    hi, 4.0, True, "×", ev)


def _batch_bound(results: dict[str, dict[str, Any]] | None, first: int, last: int) -> str:
    """From the decoder piece: how much longer one batched step of `last` sequences takes than of `first`."""
    dec = (results or {}).get("decoder") or {}
    bs = dec.get("batched_step")
    if dec.get("status") != "ok" or not bs or str(first) not in bs["step_ms"] or str(last) not in bs["step_ms"]:
        return ""
    a, b = bs["step_ms"][str(first)]["median"], bs["step_ms"][str(last)]["median"]
    return (f"; the decoder graph's step for {last} sequences takes {b / a:.2f}× the step for {first} (past "
            f"{bs['past']}, decoder piece), so even perfect batching scales tokens/s by at most {last * a / (first * b):.2f}×")


def _ceiling(res: dict[str, Any], cell: dict[str, Any], target: float) -> str:
    """The CPU budget of a request at the target rate, against the graph's own cost and the measured rest."""
    ceiling = res.get("graph_ceiling")
    if not ceiling:
        return ""
    best, peer = ceiling["best_rows_per_s"], cell["mlserver"]["rows_per_s"]["median"]
    cores, batch = res["threads"], cell["batch"]
    budget = cores * 1e3 / (target * peer / batch)         # ms of CPU per request at the target rate
    graph = cores * 1e3 * batch / best                       # ms per request if every row ran at the ceiling
    cpu = cell["ortserve"].get("cpu_ms_per_request") or {}
    out = (f"; the graph alone on all {cores} cores, in-process, peaks at {best:.0f} rows/s (median of "
           f"{len(ceiling['runs'])} measurements, best configuration and batch), so a server that spent nothing "
           f"beyond the graph would reach at most {best / peer:.2f}× MLServer's {peer:.0f} rows/s here")
    if "client" in cpu:
        left = budget - graph - cpu["client"]
        out += (f"; {target:g}× is {budget:.2f} ms of CPU per request on {cores} cores, of which the graph takes at "
                f"least {graph:.2f} and the load generator {cpu['client']:.2f}, leaving {left:.2f} ms for all the "
                f"server's own work")
        if "server_main_thread" in cpu:
            out += f" (its event loop alone took {cpu['server_main_thread']:.2f} ms per request in this cell)"
    return out


def peer_checks(res: dict[str, Any], results: dict[str, dict[str, Any]] | None = None) -> Iterator[Check]:
    most = max(c["clients"] for c in res["cells"])
    for c in res["cells"]:
        if c["clients"] == most:
            v, lo, hi = _r(c["throughput_ratio_ortserve_vs_mlserver"])
            ev = (f"ortserve {c['ortserve']['requests_per_s']['median']:.1f} req/s, MLServer "
                  f"{c['mlserver']['requests_per_s']['median']:.1f} req/s" + _ceiling(res, c, 1.5)
                  + _py_top(res.get("ortserve_kserve_batch1_profile")))
            yield Check(f"ortserve ≥ 1.5× MLServer throughput, {most} clients, batch {c['batch']}", "classifier",
                        v, lo, hi, 1.5, True, "×", ev)
        if c["clients"] == 1:
            ev = (f"p50 ortserve {c['ortserve']['p50_ms']:.2f} ms, MLServer {c['mlserver']['p50_ms']:.2f} ms"
                  + _py_top(res.get("ortserve_kserve_batch1_profile")))
            yield Check(f"ortserve p50 no worse than MLServer, 1 client, batch {c['batch']}", "classifier",
                        c["p50_ratio_ortserve_vs_mlserver"], None, None, 1.0, False, "× MLServer p50", ev)


# Each checker gets its piece's result and all results (evidence may come from another piece).
CHECKERS: dict[str, Callable[[dict[str, Any], dict[str, dict[str, Any]]], Iterator[Check]]] = {
    "encoder": encoder_checks, "decoder": decoder_checks, "server": server_checks, "peer": peer_checks}


def evaluate(results: dict[str, dict[str, Any]]) -> list[Check]:
    out: list[Check] = []
    for piece, res in results.items():
        if res.get("status") == "ok" and piece in CHECKERS:
            out.extend(CHECKERS[piece](res, results))
    return out
