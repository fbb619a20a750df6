"""A bounded mixed HTTP load (the Ray Serve tests): classification (KServe v2 REST), embeddings (OpenAI) and
streamed completions (OpenAI SSE), N client threads, each one request at a time over its own keep-alive
connection, until a stop event or a request budget.

Every answer is checked, not only its status: a classification has one label, an embedding a vector, a stream
ends with `finish_reason` "length" and `data: [DONE]` (a stream cut by a dying replica is a failure).
With `retry_idempotent`, a classification or embedding that fails (connection error or HTTP 5xx) is sent again,
up to `attempts` times; a stream is never retried (its first chunks may already have been shown).
"""
from __future__ import annotations

import http.client
import json
import threading
import time
from dataclasses import dataclass, field

KINDS = ("classify", "embed", "stream")


@dataclass
class Outcome:
    kind: str
    started: float
    ended: float
    ok: bool
    attempts: int
    errors: list[str]  # one per failed attempt


@dataclass
class MixConfig:
    host: str
    port: int
    classifier: str
    embedder: str
    generator: str
    clients: int = 6
    max_requests: int = 100_000
    retry_idempotent: bool = False
    attempts: int = 4
    timeout: float = 30.0
    stream_tokens: int = 16


class _Failed(Exception):
    pass


@dataclass
class HttpMix:
    config: MixConfig
    outcomes: list[Outcome] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._sent = 0
        self._inflight = 0
        self._threads: list[threading.Thread] = []

    @property
    def inflight(self) -> int:
        with self._lock:
            return self._inflight

    def start(self) -> "HttpMix":
        for i in range(self.config.clients):
            t = threading.Thread(target=self._client, args=(i,), name=f"httpmix-{i}", daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def stop(self) -> list[Outcome]:
        self._stop.set()
        for t in self._threads:
            t.join(self.config.timeout * self.config.attempts + 5)
        return self.outcomes

    def _take(self) -> bool:
        with self._lock:
            if self._stop.is_set() or self._sent >= self.config.max_requests:
                return False
            self._sent += 1
            self._inflight += 1
            return True

    def _client(self, index: int) -> None:
        conn: http.client.HTTPConnection | None = None
        n = index
        while self._take():
            kind = KINDS[n % len(KINDS)]
            n += 1
            started, errors = time.monotonic(), []
            retry = self.config.retry_idempotent and kind != "stream"
            ok = False
            for _ in range(self.config.attempts if retry else 1):
                if conn is None:
                    conn = http.client.HTTPConnection(self.config.host, self.config.port, timeout=self.config.timeout)
                try:
                    getattr(self, f"_{kind}")(conn, n)
                    ok = True
                    break
                except (OSError, http.client.HTTPException, _Failed, ValueError) as exc:
                    errors.append(f"{type(exc).__name__}: {exc}"[:300])
                    conn.close()
                    conn = None  # a fresh connection for the next try (the proxy may have closed this one)
                    time.sleep(0.2)
            with self._lock:
                self._inflight -= 1
                self.outcomes.append(Outcome(kind, started, time.monotonic(), ok, len(errors) + ok, errors))
        if conn is not None:
            conn.close()

    def _post(self, conn: http.client.HTTPConnection, path: str, body: dict) -> http.client.HTTPResponse:
        conn.request("POST", path, json.dumps(body), {"content-type": "application/json"})
        response = conn.getresponse()
        if response.status != 200:
            text = response.read()[:200]
            raise _Failed(f"HTTP {response.status}: {text!r}")
        return response

    def _classify(self, conn: http.client.HTTPConnection, n: int) -> None:
        body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": [f"a fine day number {n}"]}]}
        answer = json.loads(self._post(conn, f"/v2/models/{self.config.classifier}/infer", body).read())
        labels = [o for o in answer["outputs"] if o["name"] == "label"]
        if len(labels) != 1 or len(labels[0]["data"]) != 1:
            raise _Failed(f"classify: {answer}")

    def _embed(self, conn: http.client.HTTPConnection, n: int) -> None:
        body = {"model": self.config.embedder, "input": [f"some words {n}", "and more"]}
        answer = json.loads(self._post(conn, "/v1/embeddings", body).read())
        if len(answer["data"]) != 2 or not all(len(d["embedding"]) > 0 for d in answer["data"]):
            raise _Failed(f"embed: {str(answer)[:200]}")

    def _stream(self, conn: http.client.HTTPConnection, n: int) -> None:
        body = {"model": self.config.generator, "prompt": f"once upon a time {n}", "stream": True,
                "max_tokens": self.config.stream_tokens, "ignore_eos": True, "temperature": 0}
        response = self._post(conn, "/v1/completions", body)
        finish, done = None, False
        for raw in response:
            line = raw.decode().strip()
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                continue
            finish = json.loads(line[6:])["choices"][0].get("finish_reason") or finish
        if not (done and finish == "length"):
            raise _Failed(f"stream ended without its end (finish_reason {finish!r}, [DONE] {done})")


def summary(outcomes: list[Outcome]) -> dict[str, int]:
    """sent / ok / failed, first-try failures, retried requests, by kind and in all."""
    out: dict[str, int] = {"sent": len(outcomes), "ok": sum(o.ok for o in outcomes),
                           "failed": sum(not o.ok for o in outcomes),
                           "failed_first_try": sum(bool(o.errors) for o in outcomes),
                           "retried": sum(o.attempts > 1 for o in outcomes)}
    for kind in KINDS:
        of = [o for o in outcomes if o.kind == kind]
        out[f"{kind}_sent"] = len(of)
        out[f"{kind}_failed"] = sum(not o.ok for o in of)
    return out
