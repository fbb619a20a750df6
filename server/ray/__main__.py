"""`python -m server.ray --repository DIR [--replicas N]`: ortserve's data plane on Ray Serve, HTTP through its proxy.

Joins a running Ray cluster (`--address auto`, or ADDRESS) or starts a local one, deploys the application
`ortserve` at route prefix "/", and keeps it until SIGTERM / SIGINT, which deletes the application (Ray Serve
drains every replica) and exits 0. With --detach it deploys (or updates the running application: another
replica count or other flags roll its replicas) and exits at once. Flags after `--` go to every replica's data
plane as `python -m server` flags.
"""
from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from pathlib import Path
from typing import NoReturn, Sequence

from server.runtime.settings import SettingsError

log = logging.getLogger("server.ray")
APP_NAME = "ortserve"


class _OneLineErrors(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        print(f"python -m server.ray: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def parser() -> argparse.ArgumentParser:
    p = _OneLineErrors(prog="python -m server.ray", description=__doc__.split("\n")[0])
    p.add_argument("--repository", required=True, type=Path, help="model repository: <repo>/<name>/<version>/")
    p.add_argument("--replicas", type=int, default=1, help="replicas (the initial count with autoscaling; default 1)")
    p.add_argument("--min-replicas", type=int, help="autoscaling on ongoing requests: the fewest replicas")
    p.add_argument("--max-replicas", type=int, help="autoscaling on ongoing requests: the most replicas")
    p.add_argument("--target-ongoing-requests", type=float, default=8.0,
                   help="autoscaling: ongoing requests per replica to aim for (default 8)")
    p.add_argument("--max-ongoing-requests", type=int, default=64,
                   help="requests one replica takes at once; the proxy queues the rest (default 64)")
    p.add_argument("--num-cpus", type=float, default=1.0, help="Ray CPUs each replica reserves (default 1)")
    p.add_argument("--graceful-shutdown-timeout", type=float, default=20.0,
                   help="seconds a replica being removed has to finish its requests (default 20)")
    p.add_argument("--address", help="Ray cluster to join (`auto`: the one `ray start` runs here); default: a new "
                                     "local one")
    p.add_argument("--http-host", default="127.0.0.1", help="the proxy's address (default 127.0.0.1)")
    p.add_argument("--http-port", type=int, default=8000, help="the proxy's port (default 8000)")
    p.add_argument("--grpc-port", type=int, default=9000,
                   help="Ray Serve's gRPC proxy port: the task API and KServe v2 gRPC (default 9000; -1: none)")
    p.add_argument("--proxy-location", choices=["HeadOnly", "EveryNode"], default="EveryNode",
                   help="where Ray Serve runs its HTTP proxy (default EveryNode)")
    p.add_argument("--detach", action="store_true",
                   help="deploy (or update the running application: replicas, flags) and exit; needs --address")
    p.add_argument("server_args", nargs="*", help="after --: `python -m server` flags for every replica")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    repository = args.repository.resolve()
    if not repository.is_dir():
        parser().error(f"--repository: {args.repository} is not a directory")
    from server.ray.deployment import ReplicaOptions, build, replica_settings
    try:  # the replicas' flags are checked here, once, rather than in every replica
        replica_settings(str(repository), list(args.server_args))
    except (SettingsError, SystemExit) as exc:
        parser().error(f"replica flags after --: {exc}")
    options = ReplicaOptions(repository=str(repository), server_args=list(args.server_args), replicas=args.replicas,
                             min_replicas=args.min_replicas, max_replicas=args.max_replicas,
                             target_ongoing_requests=args.target_ongoing_requests,
                             max_ongoing_requests=args.max_ongoing_requests, num_cpus=args.num_cpus,
                             graceful_shutdown_timeout_s=args.graceful_shutdown_timeout)

    if args.detach and args.address is None:
        parser().error("--detach: needs --address (a cluster that outlives this command)")

    import ray
    from ray import serve

    # "local": a new cluster, never one a stale /tmp/ray/ray_current_cluster names
    ray.init(address=args.address or "local", log_to_driver=False)
    from server.ray.grpc_bridge import SERVICER_FUNCTIONS
    grpc_options = None
    if args.grpc_port >= 0:
        grpc_options = {"port": args.grpc_port, "grpc_servicer_functions": SERVICER_FUNCTIONS}
    serve.start(proxy_location=args.proxy_location, grpc_options=grpc_options,
                http_options={"host": args.http_host, "port": args.http_port})
    serve.run(build(options), name=APP_NAME, route_prefix="/", blocking=False)
    log.info("ortserve on Ray Serve: http://%s:%d (application %r, %s)", args.http_host, args.http_port, APP_NAME,
             f"{options.min_replicas}-{options.max_replicas} replicas" if options.max_replicas else
             f"{options.replicas} replica(s)")

    if args.detach:  # the application stays; a later run with other options updates it (Ray Serve rolls it)
        return 0

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    log.info("signal received: deleting the application (Ray Serve drains its replicas)")
    # Bounded: a local cluster started by ray.init shares this process group, so a terminal's Ctrl-C or a
    # group-wide SIGTERM stops Ray too, and then nothing answers (the drain needs a cluster: --address).
    deleting = threading.Thread(target=serve.delete, args=(APP_NAME,), daemon=True)
    deleting.start()
    deleting.join(options.graceful_shutdown_timeout_s + 30)
    if deleting.is_alive():
        log.error("Ray did not finish deleting the application (did its cluster stop with us?)")
        os._exit(1)
    if args.address is None:
        serve.shutdown()
        ray.shutdown()
    log.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
