"""The data plane as a Ray Serve deployment: each replica runs one DataPlane over the same model repository and
answers HTTP through Ray Serve's proxy with the server's own Starlette app (KServe v2 REST, OpenAI API, /health,
/metrics: server/http/routes.py).

Replicas, autoscaling on ongoing requests and the drain on downscale or redeploy are Ray Serve's: it stops routing
to a replica it is removing, waits for the replica's ongoing requests (graceful_shutdown_timeout_s), and only then
calls __del__, which closes the data plane. gRPC: server/ray/grpc_bridge.py. check_health tells Ray Serve's
controller to replace a replica whose repository is not loaded.

`app_builder` is the application builder for `serve run server.ray.deployment:app_builder repository=DIR`;
`python -m server.ray` (server/ray/__main__.py) is the one-command form.
"""
from __future__ import annotations

import logging
import shlex
from dataclasses import dataclass, field
from typing import Any

from ray import serve
from ray.serve.config import AutoscalingConfig

from server.runtime import tracing
from server.dataplane import DataPlane
from server.http.routes import build_app
from server.runtime.metrics import Metrics
from server.ray.grpc_bridge import add_grpc_methods, servicers
from server.runtime.settings import ServerSettings, settings_from_args

log = logging.getLogger(__name__)
DEPLOYMENT_NAME = "ortserve"


@dataclass
class ReplicaOptions:
    """How the deployment runs. `replicas` fixed, or autoscaling between min and max on ongoing requests."""
    repository: str
    server_args: list[str] = field(default_factory=list)  # any `python -m server` flags (batching, threads, ...)
    replicas: int = 1
    min_replicas: int | None = None
    max_replicas: int | None = None
    target_ongoing_requests: float = 8.0
    max_ongoing_requests: int = 64
    num_cpus: float = 1.0
    graceful_shutdown_timeout_s: float = 20.0
    health_check_period_s: float = 2.0
    health_check_timeout_s: float = 10.0

    def deployment_options(self) -> dict[str, Any]:
        options: dict[str, Any] = {
            "name": DEPLOYMENT_NAME,
            "max_ongoing_requests": self.max_ongoing_requests,
            "ray_actor_options": {"num_cpus": self.num_cpus},
            "graceful_shutdown_timeout_s": self.graceful_shutdown_timeout_s,
            "graceful_shutdown_wait_loop_s": 0.5,
            "health_check_period_s": self.health_check_period_s,
            "health_check_timeout_s": self.health_check_timeout_s,
        }
        if self.min_replicas is not None or self.max_replicas is not None:
            low = self.min_replicas if self.min_replicas is not None else 1
            high = self.max_replicas if self.max_replicas is not None else max(low, self.replicas)
            options["autoscaling_config"] = AutoscalingConfig(
                min_replicas=low, max_replicas=high, initial_replicas=max(low, min(self.replicas, high)),
                target_ongoing_requests=self.target_ongoing_requests)
        else:
            options["num_replicas"] = self.replicas
        return options


def replica_settings(repository: str, server_args: list[str]) -> ServerSettings:
    """The settings one replica's data plane runs with: the server's own flags and validation. Ports do not
    apply (Ray Serve's proxy is the door), nor does TLS (the proxy's)."""
    return settings_from_args(["--repository", repository, *server_args])


class _Replica:
    """One replica: a DataPlane loaded before the replica takes traffic (Ray Serve waits for __init__); the
    HTTP app as its ingress, and one method per gRPC RPC for Ray's gRPC proxy (server/ray/grpc_bridge.py)."""

    async def __init__(self, repository: str, server_args: list[str]) -> None:
        self.settings = replica_settings(repository, server_args)
        tracing.configure(self.settings.otlp_endpoint)  # one replica per process: the process's exporter
        self.plane = DataPlane(self.settings, Metrics())
        self.grpc_servicers = servicers(self.plane)
        await self.plane.open(poll=True)
        serving = sum(1 for m in self.plane.list_models() if m.state.value == "SERVING")
        log.info("ortserve replica ready: %d model version(s) SERVING from %s (flags: %s)", serving, repository,
                 shlex.join(server_args))

    def __serve_build_asgi_app__(self) -> Any:
        return build_app(self.plane, self.settings.max_message_bytes, self.settings.auth_token)

    async def check_health(self) -> None:
        if not self.plane.loaded:
            raise RuntimeError("the model repository is not loaded")

    async def __del__(self) -> None:
        # Ray Serve has already let this replica's ongoing requests finish (graceful_shutdown_timeout_s).
        self.plane.begin_drain()
        await self.plane.wait_idle(self.settings.grace_period)
        await self.plane.close()


GRPC_METHODS = add_grpc_methods(_Replica)
OrtserveReplica = serve.ingress()(_Replica)


def build(options: ReplicaOptions) -> Any:
    """The bound application (for serve.run)."""
    return serve.deployment(OrtserveReplica).options(**options.deployment_options()).bind(
        options.repository, list(options.server_args))


def app_builder(args: dict[str, str]) -> Any:
    """`serve run server.ray.deployment:app_builder repository=DIR [replicas=N] [server_args="--flag v ..."]`."""
    known = {"repository", "replicas", "min_replicas", "max_replicas", "server_args"}
    unknown = sorted(set(args) - known)
    if unknown:
        raise ValueError(f"{unknown[0]}: unknown argument (known: {', '.join(sorted(known))})")
    if "repository" not in args:
        raise ValueError("repository: required (a model repository folder)")
    return build(ReplicaOptions(
        repository=args["repository"], server_args=shlex.split(args.get("server_args", "")),
        replicas=int(args.get("replicas", 1)),
        min_replicas=int(args["min_replicas"]) if "min_replicas" in args else None,
        max_replicas=int(args["max_replicas"]) if "max_replicas" in args else None))
