"""gRPC channel construction: target string, load balancing, TLS (shared by sync and asyncio)."""
from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass

import grpc
import grpc.experimental

from .config import ClientConfig, TLSConfig

_MAX_MESSAGE = 64 * 1024 * 1024
_USER_AGENT = "ortserve-client/0.1"


@dataclass(frozen=True)
class ChannelSpec:
    target: str
    options: tuple[tuple[str, object], ...]
    credentials: grpc.ChannelCredentials | None  # None: plaintext


def split_host_port(address: str) -> tuple[str, int]:
    """'host:port' or '[v6]:port' -> (host, port); ValueError naming the address otherwise."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"address: expected HOST:PORT, got {address!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


def _resolve(host: str, port: int, family: socket.AddressFamily) -> list[str]:
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        ip = None
    if ip is not None:
        want = 4 if family == socket.AF_INET else 6
        return [str(ip)] if ip.version == want else []
    try:
        infos = socket.getaddrinfo(host, port, family, socket.SOCK_STREAM)
    except socket.gaierror:
        return []
    seen: list[str] = []
    for info in infos:
        addr = str(info[4][0])
        if addr not in seen:
            seen.append(addr)
    return seen


def balanced_target(addresses: tuple[str, ...]) -> str:
    """One grpc target over several replicas: 'ipv4:a:p,b:q' (or ipv6), resolved once here.

    grpc's ipv4:/ipv6: schemes take a static address list, which round_robin then spreads calls
    over; host names are resolved now because those schemes accept only literal addresses.
    """
    parsed = [split_host_port(a) for a in addresses]
    for family, scheme, fmt in ((socket.AF_INET, "ipv4", "{}:{}"), (socket.AF_INET6, "ipv6", "[{}]:{}")):
        resolved = [[fmt.format(ip, port) for ip in _resolve(host, port, family)] for host, port in parsed]
        if all(resolved):
            return f"{scheme}:" + ",".join(a for group in resolved for a in group)
    raise ValueError(f"address: cannot resolve all of {', '.join(addresses)} to one address family")


def _credentials(tls: TLSConfig) -> grpc.ChannelCredentials:
    def read(path) -> bytes | None:
        if path is None:
            return None
        try:
            with open(path, "rb") as f:
                return f.read()
        except OSError as e:
            raise ValueError(f"tls: cannot read {path}: {e.strerror}") from None

    return grpc.ssl_channel_credentials(root_certificates=read(tls.root_cert),
                                        private_key=read(tls.client_key),
                                        certificate_chain=read(tls.client_cert))


def channel_spec(config: ClientConfig) -> ChannelSpec:
    options: list[tuple[str, object]] = [
        ("grpc.max_receive_message_length", _MAX_MESSAGE),
        ("grpc.max_send_message_length", _MAX_MESSAGE),
        ("grpc.primary_user_agent", _USER_AGENT),
        # Reconnect quickly to a replica that comes back: the client's own retries wait at most a
        # few seconds, so grpc's default reconnect backoff (up to 120 s) would make them all fail.
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.min_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", 1000),
    ]
    if len(config.addresses) == 1:
        target = config.addresses[0]
    else:
        target = balanced_target(config.addresses)
        options.append(("grpc.lb_policy_name", "round_robin"))
    credentials = None
    if config.tls is not None:
        credentials = _credentials(config.tls)
        name = config.tls.server_name
        if name is None and len(config.addresses) > 1:
            # The ipv4:/ipv6: target carries no host name; check the certificate against the first one.
            name = split_host_port(config.addresses[0])[0]
        if name:
            options.append(("grpc.ssl_target_name_override", name))
    return ChannelSpec(target=target, options=tuple(options), credentials=credentials)


# A streamed call's messages are read by the thread that iterates it (grpc's single-threaded unary-stream mode)
# instead of being handed over from the channel's polling thread: no thread switch per message, which is a large
# part of what a stream costs a client with many streams open (bench/FINDINGS.md, "The client's streams").
_SYNC_OPTIONS = ((grpc.experimental.ChannelOptions.SingleThreadedUnaryStream, 1),)


def sync_channel(spec: ChannelSpec) -> grpc.Channel:
    options = [*spec.options, *_SYNC_OPTIONS]
    if spec.credentials is None:
        return grpc.insecure_channel(spec.target, options=options)
    return grpc.secure_channel(spec.target, spec.credentials, options=options)


def aio_channel(spec: ChannelSpec) -> grpc.aio.Channel:
    if spec.credentials is None:
        return grpc.aio.insecure_channel(spec.target, options=list(spec.options))
    return grpc.aio.secure_channel(spec.target, spec.credentials, options=list(spec.options))


def call_metadata(config: ClientConfig) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {config.token}"),) if config.token else ()
