"""A bounded load generator for a running ortserve server: N concurrent clients for T seconds, on loopback.

Each client owns one gRPC channel and sends one request at a time, cycling through the mix (classify,
fill-mask, streamed generation), pausing briefly after a failure, until the time or the request budget
is spent; requests already sent are allowed to finish (each has its own deadline), so the run always
stops by itself. Every answer is checked, not just its status: a classify/fill-mask answer must hold one
result per input, and a stream must end with exactly one final message whose token count equals what
was asked for. Such a failure is counted under its own code (BAD_RESPONSE / BAD_STREAM) beside the gRPC
status codes.

    config = LoadConfig(address="127.0.0.1:8001", clients=16, seconds=20).validate()
    report = asyncio.run(run_load(config, server_pid=1234))
    print(format_report(report))

Used by scripts/soak.py and by tests/reliability/test_load.py / test_faults.py.
"""
from __future__ import annotations

import asyncio
import ipaddress
import logging
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable

import grpc

from protos import ortserve_pb2 as pb
from protos import ortserve_pb2_grpc as pb_grpc
from testing.closedloop import Indices, drive_async, percentile, shared

log = logging.getLogger("ortserve.loadgen")

KINDS = ("classify", "fill-mask", "generate-stream")
TASK_OF_KIND = {"classify": "classify", "fill-mask": "fill-mask", "generate-stream": "generate"}
OK = "OK"
BAD_RESPONSE = "BAD_RESPONSE"  # status OK, but the answer does not fit the request
BAD_STREAM = "BAD_STREAM"      # a stream without exactly one final message, or with a wrong token count

# Varied, short inputs (the load is about the server, not the model): a few Shakespeare lines.
TEXTS = (
    "Now is the winter of our discontent made glorious summer by this sun of York.",
    "The quality of mercy is not strained; it droppeth as the gentle rain from heaven.",
    "Friends, Romans, countrymen, lend me your ears.",
    "All the world's a stage, and all the men and women merely players.",
    "Once more unto the breach, dear friends, once more.",
    "If music be the food of love, play on.",
    "Uneasy lies the head that wears a crown.",
    "The course of true love never did run smooth.",
    "What's in a name? That which we call a rose by any other word would smell as sweet.",
    "Cowards die many times before their deaths; the valiant never taste of death but once.",
)


class LoadConfigError(ValueError):
    """A bad load setting; the message starts with the field it is about."""


@dataclass(frozen=True)
class LoadConfig:
    address: str
    clients: int = 16
    seconds: float = 20.0
    max_requests: int = 1_000_000           # second bound: the run stops at whichever comes first
    mix: tuple[str, ...] = KINDS
    models: dict[str, str] = field(default_factory=dict)  # kind -> model name; missing = first SERVING one
    request_timeout: float = 30.0           # per-request deadline; a request past it counts as an error
    max_new_tokens: int = 16                # per streamed generation (ignore_eos: always this many)
    inputs_per_request: int = 1             # texts per classify / fill-mask request
    warmup_seconds: float = 0.0             # the RSS taken this far into the run is "rss_warm"
    error_pause: float = 0.05               # a client pauses this long after a failed request (a real client
                                            # backs off; without it a refusing server is hammered in a hot loop)
    token: str | None = None                # bearer token when the server has --auth-token
    seed: int = 0

    def validate(self) -> "LoadConfig":
        host, _, port = self.address.rpartition(":")
        host = host.strip("[]")
        if not host or not port.isdigit():
            raise LoadConfigError(f"address: expected HOST:PORT, got {self.address!r}")
        if not _is_loopback(host):
            raise LoadConfigError(f"address: load is generated on loopback only, got host {host!r}")
        for name in ("clients", "max_requests", "max_new_tokens", "inputs_per_request"):
            if getattr(self, name) < 1:
                raise LoadConfigError(f"{name}: must be >= 1, got {getattr(self, name)}")
        if not self.error_pause >= 0:
            raise LoadConfigError(f"error_pause: must be >= 0, got {self.error_pause}")
        for name in ("seconds", "request_timeout"):
            if not getattr(self, name) > 0:
                raise LoadConfigError(f"{name}: must be > 0, got {getattr(self, name)}")
        if not 0 <= self.warmup_seconds < self.seconds:
            raise LoadConfigError(f"warmup_seconds: must be in [0, seconds), got {self.warmup_seconds}")
        if not self.mix or any(k not in KINDS for k in self.mix):
            raise LoadConfigError(f"mix: kinds must be among {', '.join(KINDS)}, got {list(self.mix)}")
        unknown = sorted(set(self.models) - set(KINDS))
        if unknown:
            raise LoadConfigError(f"models: unknown kind {unknown[0]!r}")
        return self


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# ---------------------------------------------------------------------------- server memory


def rss_bytes(pid: int) -> int:
    """Resident set size of a process (Linux /proc; psutil elsewhere)."""
    status = Path(f"/proc/{pid}/status")
    if status.exists():
        for line in status.read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError(f"no VmRSS line in {status}")
    import psutil  # only where /proc is missing

    return int(psutil.Process(pid).memory_info().rss)


# ---------------------------------------------------------------------------- results


@dataclass
class Sample:
    kind: str
    code: str
    latency_s: float
    first_chunk_s: float | None = None  # streams: time to the first message
    started_at: float = 0.0             # time.monotonic() when sent
    ended_at: float = 0.0               # ... and when answered

    @property
    def first_chunk_at(self) -> float | None:
        return None if self.first_chunk_s is None else self.started_at + self.first_chunk_s


@dataclass
class Percentiles:
    count: int
    p50_ms: float
    p95_ms: float
    p99_ms: float
    max_ms: float

    @classmethod
    def of(cls, seconds: list[float]) -> "Percentiles":
        if not seconds:
            return cls(0, 0.0, 0.0, 0.0, 0.0)
        ms = [x * 1000.0 for x in seconds]
        p50, p95, p99 = (percentile(ms, q) for q in (50, 95, 99))
        return cls(len(ms), round(float(p50), 2), round(float(p95), 2), round(float(p99), 2),
                   round(float(max(ms)), 2))


@dataclass
class KindReport:
    model: str
    requests: int
    ok: int
    codes: dict[str, int]
    latency: Percentiles
    first_chunk: Percentiles | None = None


@dataclass
class LoadReport:
    address: str
    clients: int
    seconds: float
    duration_s: float
    requests: int
    ok: int
    errors: dict[str, int]                 # status code (or BAD_*) -> count, OK excluded
    latency: Percentiles
    kinds: dict[str, KindReport]
    throughput_rps: float
    server_pid: int | None = None
    rss_start_bytes: int | None = None     # before the first request
    rss_warm_bytes: int | None = None      # warmup_seconds into the run
    rss_end_bytes: int | None = None       # after the last request was answered
    rss_peak_bytes: int | None = None      # highest of the once-a-second samples
    samples: list[Sample] = field(default_factory=list, repr=False)  # every request (not in to_json)

    @property
    def error_count(self) -> int:
        return sum(self.errors.values())

    def rss_growth(self, since: str = "start") -> float | None:
        """(end - start) / start, or from the warm sample with since="warm"."""
        base = self.rss_start_bytes if since == "start" else self.rss_warm_bytes
        if base is None or self.rss_end_bytes is None:
            return None
        return (self.rss_end_bytes - base) / base

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        del data["samples"]
        data["error_count"] = self.error_count
        data["rss_growth_from_start"] = self.rss_growth("start")
        data["rss_growth_from_warm"] = self.rss_growth("warm")
        return data


def summarise(config: LoadConfig, models: dict[str, str], samples: list[Sample], duration: float) -> LoadReport:
    codes: dict[str, int] = {}
    for s in samples:
        codes[s.code] = codes.get(s.code, 0) + 1
    kinds: dict[str, KindReport] = {}
    for kind in config.mix:
        mine = [s for s in samples if s.kind == kind]
        kind_codes: dict[str, int] = {}
        for s in mine:
            kind_codes[s.code] = kind_codes.get(s.code, 0) + 1
        first = [s.first_chunk_s for s in mine if s.first_chunk_s is not None]
        kinds[kind] = KindReport(model=models[kind], requests=len(mine), ok=kind_codes.get(OK, 0), codes=kind_codes,
                                 latency=Percentiles.of([s.latency_s for s in mine if s.code == OK]),
                                 first_chunk=Percentiles.of(first) if kind == "generate-stream" else None)
    ok = codes.pop(OK, 0)
    return LoadReport(address=config.address, clients=config.clients, seconds=config.seconds,
                      duration_s=round(duration, 3), requests=len(samples), ok=ok, errors=dict(sorted(codes.items())),
                      latency=Percentiles.of([s.latency_s for s in samples if s.code == OK]), kinds=kinds,
                      throughput_rps=round(ok / duration, 2) if duration > 0 else 0.0, samples=samples)


def format_report(report: LoadReport) -> str:
    """A short human-readable summary (the JSON form has everything)."""
    def mib(n: int | None) -> str:
        return "-" if n is None else f"{n / 2 ** 20:.1f} MiB"

    lines = [f"{report.clients} clients x {report.seconds:g} s against {report.address}: "
             f"{report.requests} requests in {report.duration_s:.1f} s ({report.throughput_rps:.1f} OK/s)",
             f"errors: {report.error_count}" + (f" {report.errors}" if report.errors else ""),
             f"latency (OK): p50 {report.latency.p50_ms} ms, p95 {report.latency.p95_ms} ms, "
             f"p99 {report.latency.p99_ms} ms, max {report.latency.max_ms} ms"]
    for kind, k in report.kinds.items():
        extra = f", first chunk p50 {k.first_chunk.p50_ms} ms p95 {k.first_chunk.p95_ms} ms" if k.first_chunk else ""
        lines.append(f"  {kind:<16} {k.model:<20} {k.requests:>7} req {k.ok:>7} ok  p50 {k.latency.p50_ms} ms "
                     f"p95 {k.latency.p95_ms} ms p99 {k.latency.p99_ms} ms{extra}")
    if report.rss_start_bytes is not None:
        growth = report.rss_growth("start")
        warm = report.rss_growth("warm")
        lines.append(f"server RSS: start {mib(report.rss_start_bytes)}, warm {mib(report.rss_warm_bytes)}, "
                     f"end {mib(report.rss_end_bytes)}, peak {mib(report.rss_peak_bytes)}; growth "
                     f"{growth * 100:+.1f}% from start" + (f", {warm * 100:+.1f}% from warm" if warm is not None else ""))
    return "\n".join(lines)


# ---------------------------------------------------------------------------- one request of each kind


class _Checked(Exception):
    """An OK status whose answer is wrong; `code` is BAD_RESPONSE or BAD_STREAM."""

    def __init__(self, code: str, why: str) -> None:
        super().__init__(why)
        self.code = code


@dataclass
class _Target:
    stub: pb_grpc.TaskServiceStub
    models: dict[str, str]
    mask_token: str
    config: LoadConfig
    metadata: tuple[tuple[str, str], ...]


async def _classify(t: _Target, rng: random.Random) -> float | None:
    inputs = [pb.TextInput(text=rng.choice(TEXTS)) for _ in range(t.config.inputs_per_request)]
    response = await t.stub.Classify(pb.ClassifyRequest(model=t.models["classify"], inputs=inputs),
                                     timeout=t.config.request_timeout, metadata=t.metadata)
    if len(response.results) != len(inputs) or not all(r.label for r in response.results):
        raise _Checked(BAD_RESPONSE, f"classify: {len(response.results)} results for {len(inputs)} inputs")
    return None


async def _fill_mask(t: _Target, rng: random.Random) -> float | None:
    texts = []
    for _ in range(t.config.inputs_per_request):
        words = rng.choice(TEXTS).split()
        words[rng.randrange(len(words))] = t.mask_token
        texts.append(" ".join(words))
    response = await t.stub.FillMask(pb.FillMaskRequest(model=t.models["fill-mask"], texts=texts, top_k=3),
                                     timeout=t.config.request_timeout, metadata=t.metadata)
    if len(response.results) != len(texts) or not all(r.masks and r.masks[0].candidates for r in response.results):
        raise _Checked(BAD_RESPONSE, f"fill-mask: {len(response.results)} results for {len(texts)} texts")
    return None


async def _generate_stream(t: _Target, rng: random.Random) -> float | None:
    n = t.config.max_new_tokens
    # Greedy or seeded sampling, always exactly n tokens (ignore_eos), so every stream does the same work.
    params = pb.GenerationParameters(max_new_tokens=n, ignore_eos=True)
    if rng.random() < 0.5:
        params.temperature = 0.8
        params.seed = rng.randrange(2 ** 32)
    prompt = " ".join(rng.choice(TEXTS).split()[:rng.randint(2, 6)])
    started = time.monotonic()
    first: float | None = None
    tokens = finals = 0
    last_final = False
    call = t.stub.GenerateStream(pb.GenerateRequest(model=t.models["generate-stream"], prompt=prompt,
                                                    parameters=params),
                                 timeout=t.config.request_timeout, metadata=t.metadata)
    async for message in call:
        if first is None:
            first = time.monotonic() - started
        tokens += len(message.tokens)
        finals += message.final
        last_final = message.final
    if finals != 1 or not last_final:
        raise _Checked(BAD_STREAM, f"stream ended with {finals} final message(s), last final={last_final}")
    if tokens != n:
        raise _Checked(BAD_STREAM, f"stream carried {tokens} tokens, asked for {n}")
    return first


_CALLS: dict[str, Callable[[_Target, random.Random], Awaitable[float | None]]] = {
    "classify": _classify, "fill-mask": _fill_mask, "generate-stream": _generate_stream}


# ---------------------------------------------------------------------------- the run


async def discover_models(stub: pb_grpc.TaskServiceStub, config: LoadConfig,
                          metadata: tuple[tuple[str, str], ...] = ()) -> tuple[dict[str, str], str]:
    """kind -> model for every kind of the mix (given ones kept, others = first SERVING of the task),
    and the fill-mask model's mask token."""
    listed = (await stub.ListModels(pb.ListModelsRequest(), timeout=10, metadata=metadata)).models
    models = dict(config.models)
    for kind in config.mix:
        if kind in models:
            continue
        serving = sorted(m.name for m in listed if m.state == "SERVING" and m.task == TASK_OF_KIND[kind])
        if not serving:
            raise LoadConfigError(f"mix: no SERVING {TASK_OF_KIND[kind]} model for {kind!r} at {config.address}")
        models[kind] = serving[0]
    mask = ""
    if "fill-mask" in config.mix:
        info = await stub.ModelInfo(pb.ModelInfoRequest(model=models["fill-mask"]), timeout=10, metadata=metadata)
        mask = info.mask_token
        if not mask:
            raise LoadConfigError(f"models: {models['fill-mask']!r} has no mask token (not a fill-mask model?)")
    return models, mask


def _plan(total: int) -> Indices:
    """Client c's n-th request is number c + n (clients start at different kinds, so the mix is even from the first
    second), `total` requests in all over the clients."""
    take = shared(total)
    return lambda c: (c + k for k, _ in enumerate(take(c)))


def _request(targets: list[_Target], samples: list[Sample]) -> Callable[[int, int, Callable[[], None]],
                                                                      Awaitable[None]]:
    """One request of client c (over targets[c]), its n-th kind of the mix; its Sample (status code, times) goes
    into `samples`."""
    config = targets[0].config
    rngs = [random.Random(config.seed * 100_003 + c) for c in range(len(targets))]

    async def send(c: int, n: int, first_mark: Callable[[], None]) -> None:
        kind = config.mix[n % len(config.mix)]
        started = time.monotonic()
        first: float | None = None
        try:
            first = await _CALLS[kind](targets[c], rngs[c])
            code = OK
        except grpc.aio.AioRpcError as exc:
            code = exc.code().name
            log.debug("%s: %s %s", kind, code, exc.details())
        except _Checked as exc:
            code = exc.code
            log.warning("%s: %s", kind, exc)
        ended = time.monotonic()
        samples.append(Sample(kind, code, ended - started, first, started, ended))
        if code != OK and config.error_pause:
            await asyncio.sleep(config.error_pause)
    return send


async def _sample_rss(pid: int, every: float, peaks: list[int]) -> None:
    while True:
        try:
            peaks.append(rss_bytes(pid))
        except (OSError, RuntimeError):
            return  # the process is gone
        await asyncio.sleep(every)


async def run_load(config: LoadConfig, server_pid: int | None = None) -> LoadReport:
    """Runs the load once; returns the report (it never raises for failed requests: they are counted)."""
    config.validate()
    metadata = (("authorization", f"Bearer {config.token}"),) if config.token else ()
    options = [("grpc.max_receive_message_length", 64 * 2 ** 20)]
    channels = [grpc.aio.insecure_channel(config.address, options=options) for _ in range(config.clients)]
    try:
        first_stub = pb_grpc.TaskServiceStub(channels[0])
        models, mask = await discover_models(first_stub, config, metadata)
        targets = [_Target(pb_grpc.TaskServiceStub(ch), models, mask, config, metadata) for ch in channels]
        rss: dict[str, int | None] = {"start": None, "warm": None}
        peaks: list[int] = []
        sampler = None
        if server_pid is not None:
            rss["start"] = rss_bytes(server_pid)
            sampler = asyncio.create_task(_sample_rss(server_pid, 1.0, peaks))
        samples: list[Sample] = []
        started = time.monotonic()
        clients = asyncio.ensure_future(drive_async(_request(targets, samples), config.clients,
                                                    _plan(config.max_requests), seconds=config.seconds))
        if server_pid is not None and config.warmup_seconds > 0:
            done, _ = await asyncio.wait([clients], timeout=config.warmup_seconds)
            if not done:
                rss["warm"] = rss_bytes(server_pid)
        # Hard stop: the last requests get their own deadline, plus a margin; then they are abandoned.
        try:
            await asyncio.wait_for(clients, config.seconds + config.request_timeout + 10)
        except TimeoutError:
            log.error("clients still running past the hard stop; abandoning them")
        duration = time.monotonic() - started
        report = summarise(config, models, samples, duration)
        if server_pid is not None:
            if sampler is not None:
                sampler.cancel()
            report.server_pid = server_pid
            report.rss_start_bytes = rss["start"]
            report.rss_warm_bytes = rss["warm"]
            report.rss_end_bytes = rss_bytes(server_pid)
            report.rss_peak_bytes = max(peaks + [report.rss_end_bytes])
        return report
    finally:
        await asyncio.gather(*(ch.close() for ch in channels), return_exceptions=True)
