"""The gRPC port's connection cap without lock-out: at the cap, the idlest connections are closed for newcomers.

grpc's `max_allowed_incoming_connections` refuses every new connection while the cap is full, and a connection
that made one call and went quiet holds its place until `--grpc-idle-timeout` (minutes) sends it GOAWAY: a cap full
of idle peers kept every new client UNAVAILABLE for that long (issue 40, kind 2). grpc's Python server exposes no
connection object, so this module finds them where the kernel lists them:

- every call's peer (`context.peer()`, the connection's remote address) is counted while the call runs and stamped
  when it ends (`CallTracker`, wrapped around each handler by the registrar in server.py);
- a sweep (`IdleEvictor`, every `SWEEP_S`, its reads in a worker thread) lists the port's established connections
  from /proc/net/tcp{,6}; when they fill the cap, those without a running call and quiet for `MIN_IDLE_S` are shut
  down, idlest first (a few at a time, so a burst of newcomers finds room). A shutdown socket is seen by grpc as
  a closed connection; the peer's channel reconnects on its next call.

A connection with a call in flight (a stream, a Health.Watch) is never chosen. Calls of the reflection service are
not counted (grpc registers it on the server itself): a reflection stream open longer than MIN_IDLE_S on a
connection with nothing else running can be closed at the cap. Where /proc/net/tcp does not exist (not Linux), the
sweep logs that once and stops: the idle timeout is then the only bound.
"""
from __future__ import annotations

import asyncio
import functools
import inspect
import ipaddress
import logging
import os
import socket
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable

import grpc

log = logging.getLogger(__name__)

SWEEP_S = 0.5        # how soon a full cap is noticed (grpc refuses newcomers meanwhile; clients retry with backoff)
MIN_IDLE_S = 1.0     # a connection between two quick calls is not idle
FORGET_S = 60.0      # a call's end older than this is forgotten (idlest-first then falls back to first sight)
_ESTABLISHED = "01"  # the state column of /proc/net/tcp
_TABLES = ("/proc/net/tcp", "/proc/net/tcp6")

Address = tuple[str, int]


def _normal_ip(text: str) -> str:
    ip = ipaddress.ip_address(text)
    mapped = getattr(ip, "ipv4_mapped", None)
    return str(mapped or ip)


@functools.lru_cache(maxsize=4096)      # a connection's calls share its peer string: parsed once per connection
def peer_address(peer: str) -> Address | None:
    """`ipv4:127.0.0.1:5000` / `ipv6:[::1]:5000` (grpc's peer strings) as (ip, port); None for other kinds."""
    kind, _, rest = peer.partition(":")
    if kind not in ("ipv4", "ipv6"):
        return None
    host, _, port = rest.rpartition(":")
    try:
        return _normal_ip(host.strip("[]")), int(port)
    except ValueError:
        return None


def _proc_address(hex_address: str) -> Address:
    """/proc/net/tcp's `0100007F:1F90`: the address in 32-bit words of host byte order, the port in hex."""
    ip_hex, port_hex = hex_address.split(":")
    raw = bytes.fromhex(ip_hex)
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    family = socket.AF_INET if len(raw) == 4 else socket.AF_INET6
    return _normal_ip(socket.inet_ntop(family, words)), int(port_hex, 16)


@dataclass(frozen=True)
class Connection:
    remote: Address
    inode: int


def established_connections(port: int) -> list[Connection]:
    """The established TCP connections whose local port is `port` (this network namespace's tables)."""
    found = []
    for table in _TABLES:
        try:
            with open(table) as f:
                lines = f.read().splitlines()[1:]
        except FileNotFoundError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] != _ESTABLISHED or int(fields[1].rsplit(":", 1)[1], 16) != port:
                continue
            found.append(Connection(_proc_address(fields[2]), int(fields[9])))
    return found


def shut_down(inodes: set[int]) -> int:
    """Shuts down this process's sockets with these inodes (grpc sees them closed); how many."""
    done = 0
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if not target.startswith("socket:[") or int(target[8:-1]) not in inodes:
            continue
        try:
            copy = os.dup(int(name))
        except OSError:
            continue
        # The copy keeps the socket alive, so the inode check below cannot match a recycled descriptor.
        with socket.socket(fileno=copy) as sock:
            if os.fstat(copy).st_ino in inodes:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                    done += 1
                except OSError:
                    pass
    return done


@dataclass
class CallTracker:
    """Calls running per peer address, and when each address last finished one (loop thread only)."""

    running: dict[Address, int] = field(default_factory=dict)
    last_end: dict[Address, float] = field(default_factory=dict)

    def begin(self, context: grpc.aio.ServicerContext) -> Address | None:
        address = peer_address(context.peer())
        if address is not None:
            self.running[address] = self.running.get(address, 0) + 1
        return address

    def end(self, address: Address | None) -> None:
        if address is None:
            return
        left = self.running.get(address, 1) - 1
        if left > 0:
            self.running[address] = left
        else:
            self.running.pop(address, None)
        self.last_end[address] = time.monotonic()


def tracked(handler: grpc.RpcMethodHandler, tracker: CallTracker) -> grpc.RpcMethodHandler:
    """The same handler, its calls counted per peer while they run (async behaviors; others unchanged)."""
    kinds = (("unary_unary", grpc.unary_unary_rpc_method_handler), ("unary_stream", grpc.unary_stream_rpc_method_handler),
             ("stream_unary", grpc.stream_unary_rpc_method_handler),
             ("stream_stream", grpc.stream_stream_rpc_method_handler))
    for attribute, make in kinds:
        behavior = getattr(handler, attribute)
        if behavior is None:
            continue
        wrapped = _counting(behavior, tracker)
        if wrapped is None:
            return handler
        return make(wrapped, request_deserializer=handler.request_deserializer,
                    response_serializer=handler.response_serializer)
    return handler


def _counting(behavior: Callable[..., Any], tracker: CallTracker) -> Callable[..., Any] | None:
    if inspect.isasyncgenfunction(behavior):
        async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            address = tracker.begin(context)
            try:
                async for item in behavior(request, context):
                    yield item
            finally:
                tracker.end(address)
        return stream
    if inspect.iscoroutinefunction(behavior):
        async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
            address = tracker.begin(context)
            try:
                return await behavior(request, context)
            finally:
                tracker.end(address)
        return unary
    return None


class IdleEvictor:
    """Keeps room on a capped gRPC port: at the cap, the idlest connections without a running call are closed."""

    def __init__(self, tracker: CallTracker, cap: int) -> None:
        self.tracker = tracker
        self.cap = cap
        self.port = 0
        self.closed = 0
        self._first_seen: dict[int, float] = {}   # inode -> when a sweep first saw it
        self._task: asyncio.Task[None] | None = None

    def start(self, port: int) -> None:
        self.port = port
        if not os.path.exists(_TABLES[0]):
            log.info("grpc: no %s here: idle connections at the cap wait for --grpc-idle-timeout", _TABLES[0])
            return
        self._task = asyncio.get_running_loop().create_task(self._run(), name="grpc-idle-evictor")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_S)
            try:
                await self.sweep()
            except OSError as exc:   # /proc unreadable for a moment: the next sweep tries again
                log.debug("grpc: connection sweep failed: %s", exc)

    async def sweep(self) -> int:
        """One pass; how many connections it closed."""
        now = time.monotonic()
        ends = self.tracker.last_end
        for address in [a for a, t in ends.items() if now - t > FORGET_S]:
            del ends[address]
        connections = await asyncio.to_thread(self._connections_if_full)
        if connections is None:
            return 0
        seen = {c.inode: self._first_seen.get(c.inode, now) for c in connections}
        self._first_seen = seen
        if len(connections) < self.cap:
            return 0
        quiet = []
        for c in connections:
            if self.tracker.running.get(c.remote):
                continue
            last = ends.get(c.remote, seen[c.inode])
            if now - last >= MIN_IDLE_S:
                quiet.append((last, c))
        quiet.sort(key=lambda pair: pair[0])
        room = len(connections) - self.cap + max(1, self.cap // 16)
        victims = {c.inode for _, c in quiet[:room]}
        if not victims:
            return 0
        closed = await asyncio.to_thread(shut_down, victims)
        self.closed += closed
        log.warning("grpc: %d connections at max_connections %d: closed the %d idle longest (%d so far)",
                    len(connections), self.cap, closed, self.closed)
        return closed

    def _connections_if_full(self) -> list[Connection] | None:
        """The port's connections, or None when the process holds fewer descriptors than the cap (then the port
        cannot be full, and the kernel's table, large on a busy host, is not read)."""
        if len(os.listdir("/proc/self/fd")) < self.cap:
            return None
        return established_connections(self.port)


__all__ = ["CallTracker", "IdleEvictor", "established_connections", "peer_address", "tracked"]
