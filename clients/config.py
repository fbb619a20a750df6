"""Configuration of a client connection: addresses, deadlines, retries, TLS and auth."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff between retries: initial * multiplier**n, capped, with random jitter."""

    initial: float = 0.1      # seconds before the first retry
    multiplier: float = 2.0
    maximum: float = 2.0      # cap of one wait, seconds
    jitter: float = 0.5       # each wait is scaled by a random factor in [1 - jitter, 1]

    def __post_init__(self) -> None:
        if self.initial < 0 or self.maximum < 0:
            raise ValueError("backoff: initial and maximum must be >= 0")
        if self.multiplier < 1:
            raise ValueError("backoff: multiplier must be >= 1")
        if not 0 <= self.jitter <= 1:
            raise ValueError("backoff: jitter must be in [0, 1]")


@dataclass(frozen=True)
class TLSConfig:
    """Server authentication by a root certificate (PEM); client cert + key for mutual TLS."""

    root_cert: Path | None = None       # None: the system roots bundled with grpc
    client_cert: Path | None = None
    client_key: Path | None = None
    server_name: str | None = None      # overrides the name checked against the certificate

    def __post_init__(self) -> None:
        if (self.client_cert is None) != (self.client_key is None):
            raise ValueError("tls: client_cert and client_key go together")


@dataclass(frozen=True)
class ClientConfig:
    addresses: tuple[str, ...]
    timeout: float | None = None        # default deadline of a call (seconds, retries included)
    retries: int = 3                    # extra attempts after an UNAVAILABLE answer
    backoff: Backoff = field(default_factory=Backoff)
    tls: TLSConfig | None = None
    token: str | None = None            # sent as "authorization: Bearer <token>"

    def __post_init__(self) -> None:
        if not self.addresses or any(not a or not isinstance(a, str) for a in self.addresses):
            raise ValueError("address: at least one non-empty address is required")
        if self.timeout is not None and self.timeout <= 0:
            raise ValueError("timeout: must be > 0 seconds")
        if self.retries < 0:
            raise ValueError("retries: must be >= 0")

    @classmethod
    def build(cls, address: str | list[str] | tuple[str, ...], *, timeout: float | None = None, retries: int = 3,
              backoff: Backoff | float | None = None, tls: TLSConfig | None = None,
              token: str | None = None) -> "ClientConfig":
        addresses = (address,) if isinstance(address, str) else tuple(address)
        if isinstance(backoff, (int, float)):
            backoff = Backoff(initial=float(backoff))
        return cls(addresses=addresses, timeout=timeout, retries=retries, backoff=backoff or Backoff(),
                   tls=tls, token=token)
