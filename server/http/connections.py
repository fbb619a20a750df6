"""Connections of the HTTP door and the metrics port: idle ones closed after a timeout, their number bounded.

uvicorn closes a keep-alive connection idle after a response, but nothing else: a connection that never finishes
its request head (a slowloris) or stops sending its body stayed open forever, and 1,100 of them took every file
descriptor of the process. `GuardedProtocol` (uvicorn's h11 protocol with timers) closes

    - a connection whose request head is not complete `header_timeout` seconds after it connected, or after its
      previous response (the keep-alive case: a few bytes of a next request do not keep it open);
    - a connection that sends no byte of a started request body for `read_timeout` seconds.

`ConnectionGate` bounds the connections the two ports hold together: when a new one would exceed the cap, the
connection that has waited longest for a request head is closed to make room (a flood of idle connections cannot
lock real clients out); with none idle, the one that has been sending its request body longest (a body trickled a
byte at a time restarts the read timer forever, so the timer alone cannot free the door: nothing of such a request
has started); when every connection is busy with a request the application holds, the new one is closed instead.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger(__name__)

_WARN_EVERY_S = 10.0


@dataclass(frozen=True)
class ConnectionLimits:
    header_timeout: float = 10.0
    read_timeout: float = 30.0
    keep_alive_timeout: float = 5.0
    max_connections: int = 1024


class ConnectionGate:
    """The open connections of one door (its ports together): busy ones, and idle ones oldest first."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self._idle: OrderedDict[Any, None] = OrderedDict()   # waiting for a request head, longest first
        self._busy: set[Any] = set()
        self._reading: OrderedDict[Any, None] = OrderedDict()   # busy, their body still arriving, longest first
        self.evicted = 0
        self.refused = 0
        self._warned = 0.0

    @property
    def open(self) -> int:
        return len(self._idle) + len(self._busy)

    def admit(self, conn: Any) -> bool:
        """Counts a new connection in (idle); False when it must be closed (the door is full of busy ones)."""
        if self.open >= self.cap:
            if self._idle:
                victim, _ = self._idle.popitem(last=False)
                self._warn("closed the one idle longest")
            elif self._reading:
                victim, _ = self._reading.popitem(last=False)
                self._busy.discard(victim)
                self._warn("closed the one sending its request body longest")
            else:
                self.refused += 1
                self._warn("every one is busy: refused a new one")
                return False
            self.evicted += 1
            victim.close_idle()
        self._idle[conn] = None
        return True

    def busy(self, conn: Any) -> None:
        if self._idle.pop(conn, False) is None:
            self._busy.add(conn)

    def reading(self, conn: Any, more_body: bool) -> None:
        """A busy connection's request body is still arriving (more_body), or now complete."""
        if not more_body:
            self._reading.pop(conn, None)
        elif conn in self._busy and conn not in self._reading:
            self._reading[conn] = None

    def idle(self, conn: Any) -> None:
        self._reading.pop(conn, None)
        if conn in self._busy:
            self._busy.discard(conn)
            self._idle[conn] = None

    def remove(self, conn: Any) -> None:
        self._idle.pop(conn, None)
        self._reading.pop(conn, None)
        self._busy.discard(conn)

    def _warn(self, what: str) -> None:
        now = time.monotonic()
        if now - self._warned >= _WARN_EVERY_S:
            self._warned = now
            log.warning("http: %d connections open, max_connections %d: %s (%d closed idle, %d refused so far)",
                        self.open, self.cap, what, self.evicted, self.refused)


class GuardedProtocol(H11Protocol):
    """uvicorn's h11 protocol with the header and body timers and the gate. Subclassed per server with the
    class attributes set (`guarded_protocol`)."""

    gate: ConnectionGate
    limits: ConnectionLimits

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._timer: asyncio.TimerHandle | None = None
        self._counted = False

    # ------------------------------------------------------------------ asyncio.Protocol

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if not self.gate.admit(self):
            transport.close()
            return
        self._counted = True
        self._arm(self.limits.header_timeout)

    def data_received(self, data: bytes) -> None:
        before = self.cycle
        super().data_received(data)
        cycle = self.cycle
        if cycle is None or cycle.response_complete:
            return                                  # still waiting for a head: the header timer runs on
        if cycle is not before and self._counted:
            self.gate.busy(self)                    # a head arrived
        if self._counted:
            self.gate.reading(self, cycle.more_body)
        if cycle.more_body:
            self._arm(self.limits.read_timeout)     # a body is arriving: each byte restarts the clock
        else:
            self._disarm()                          # the request is in; the application has it

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.transport.is_closing():
            return
        if self._counted:
            self.gate.idle(self)
        self._arm(self.limits.header_timeout)      # the next head, if any, within the same time

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self._counted:
            self.gate.remove(self)
            self._counted = False
        super().connection_lost(exc)

    # ------------------------------------------------------------------ timers

    def close_idle(self) -> None:
        """Closed by the gate, or by a timer: nothing of a response is pending on it (a request whose body is
        still arriving has not reached the application: its handler sees a disconnect)."""
        self._disarm()
        if self._counted:
            self.gate.remove(self)
            self._counted = False
        if not self.transport.is_closing():
            self.transport.close()

    def _arm(self, seconds: float) -> None:
        self._disarm()
        self._timer = self.loop.call_later(seconds, self._expired)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expired(self) -> None:
        self._timer = None
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            if not cycle.more_body:
                return      # the request is in and the application answers it: its own deadlines apply
            if self.flow.read_paused:
                self._arm(self.limits.read_timeout)   # the application has not taken the body yet: not the client's wait
                return
        self.close_idle()


def guarded_protocol(gate: ConnectionGate, limits: ConnectionLimits) -> type[GuardedProtocol]:
    """The protocol class one uvicorn server runs: GuardedProtocol bound to this gate and these limits."""
    return type("GuardedProtocol", (GuardedProtocol,), {"gate": gate, "limits": limits})
