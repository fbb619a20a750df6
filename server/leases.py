"""A request's hold on one model version (Lease), shared by the streams of one request (SharedLease: each one's
share is given back by the stream itself, server/request_stream.py).

A lease is taken by DataPlane.lease() after admission (server/dataplane.py): while held, the version counts the
request in flight and cannot close its served model; when it ends, the request is recorded in the version's
statistics (success or failure, with its duration) and the plane's in-flight count goes down.
"""
from __future__ import annotations

import time
from typing import Callable

from server.model import ServedModel
from server.protocol.errors import ServingError
from server.repository.version import ModelVersion
from server.runtime import tracing


def prompt_text(served: ServedModel, prompt: str | list[int]) -> str:
    """A prompt as text: token ids decoded by the version that generates from them (checked by then)."""
    return prompt if isinstance(prompt, str) else served.prompt_text(prompt)


def check_echo(served: ServedModel, echo: bool) -> None:
    """An encoder-decoder's prompt is its source: not the start of the text it writes, and not scored by its decoder,
    so an echo (the prompt before the answer, its tokens scored with logprobs) has nothing to mean there. Refused by
    name before compute, on every door (docs/protocol.md)."""
    if echo and served.manifest.encoder_decoder is not None:
        raise ServingError.invalid("echo", f"{served.name!r} is an encoder-decoder: its prompt is the source, not the "
                                           f"start of its output (echo is for decoder models)")


class Lease:
    """A request's hold on one model version (a plain class rather than a generator-based context manager: this
    runs on every request). `done` is called with the version when the lease ends."""

    __slots__ = ("_done", "_version", "_started", "span", "_token")

    def __init__(self, done: Callable[[ModelVersion], None], version: ModelVersion, operation: str = "") -> None:
        self._done = done
        self._version = version
        self._started = time.perf_counter()
        # dataplane.<operation>, a child of the door's span (None unless tracing)
        self.span = tracing.start(f"dataplane.{operation}", model=version.name, version=version.version) \
            if operation and tracing.enabled() else None
        self._token = None

    def __enter__(self) -> ServedModel:
        self._token = tracing.use(self.span)
        try:
            return self._version.model
        except BaseException as exc:  # no served model after all: the lease ends here, counted as a failure
            self.__exit__(type(exc), exc, None)
            raise

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        self._version.stats.record_request(kind is None, time.perf_counter() - self._started)
        self._done(self._version)
        if self.span is not None:
            tracing.reset(self._token)
            tracing.end(self.span, exc if exc is not None else
                        (RuntimeError(kind.__name__) if kind is not None else None))


class SharedLease:
    """One lease held by a request's streams: ended (and recorded) when the last one ends."""

    __slots__ = ("_lease", "_open", "_failed")

    def __init__(self, lease: Lease, streams: int) -> None:
        self._lease, self._open, self._failed = lease, streams, False
        if streams == 0:
            lease.__exit__(None, None, None)

    def end(self, ok: bool) -> None:
        self._failed = self._failed or not ok
        self._open -= 1
        if self._open == 0:
            self._lease.__exit__(Exception if self._failed else None, None, None)   # (the statistics' outcome)


__all__ = ["Lease", "SharedLease", "check_echo", "prompt_text"]
