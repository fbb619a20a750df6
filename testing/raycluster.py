"""A two-node Ray cluster on this machine, each node in its own network namespace (root only).

    root namespace:  bridge ortsbr0 10.231.0.1/24  (the test's clients)
    ortserve-head:   10.231.0.2   `ray start --head`, the Serve controller and a proxy
    ortserve-worker: 10.231.0.3   `ray start --address 10.231.0.2:6390`

Each node has its own addresses and ports, so two nodes cannot share a socket by accident, and a process of
one node is told from the other's by its network namespace (`ip netns pids`). Stopping kills exactly the
processes in the two namespaces (never `ray stop`, which would stop every Ray on the machine), then removes the
namespaces and the bridge.
"""
from __future__ import annotations

import logging
import os
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

log = logging.getLogger(__name__)

BRIDGE = "ortsbr0"
BRIDGE_ADDRESS = "10.231.0.1"
GCS_PORT = 6390
RAY = str(Path(sys.executable).with_name("ray"))


class ClusterError(RuntimeError):
    pass


@dataclass(frozen=True)
class Node:
    namespace: str
    address: str
    veth: str


HEAD = Node("ortserve-head", "10.231.0.2", "ortsv-head")
WORKER = Node("ortserve-worker", "10.231.0.3", "ortsv-worker")


def _run(*cmd: str, check: bool = True, timeout: float = 120, env: dict[str, str] | None = None
         ) -> subprocess.CompletedProcess:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if check and done.returncode != 0:
        raise ClusterError(f"{' '.join(cmd)}: exit {done.returncode}: {(done.stderr or done.stdout)[-2000:]}")
    return done


def namespaces_available() -> str | None:
    """None when network namespaces can be made here, else why not."""
    if os.geteuid() != 0:
        return "needs root (ip netns)"
    probe = "ortserve-probe"
    if _run("ip", "netns", "add", probe, check=False).returncode != 0:
        return "ip netns add failed"
    _run("ip", "netns", "del", probe, check=False)
    return None


class RayCluster:
    def __init__(self, num_cpus: int = 1, env: dict[str, str] | None = None,
                 temp_dir: Path = Path("/tmp/ortserve-ray")) -> None:
        """temp_dir: the head's Ray session files (its logs), apart from any other Ray on this machine; short,
        for Ray's unix socket paths."""
        self.num_cpus = num_cpus
        self.temp_dir = temp_dir
        # Ray's token authentication, with a token of this cluster's own (not ~/.ray/auth_token).
        self.env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "token",
                    "RAY_AUTH_TOKEN": secrets.token_hex(32), **(env or {})}

    @property
    def gcs(self) -> str:
        return f"{HEAD.address}:{GCS_PORT}"

    def start(self) -> "RayCluster":
        self.stop()  # what an interrupted run left
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        _run("ip", "link", "add", BRIDGE, "type", "bridge")
        _run("ip", "addr", "add", f"{BRIDGE_ADDRESS}/24", "dev", BRIDGE)
        _run("ip", "link", "set", BRIDGE, "up")
        for node in (HEAD, WORKER):
            _run("ip", "netns", "add", node.namespace)
            _run("ip", "link", "add", node.veth, "type", "veth", "peer", "name", "eth0", "netns", node.namespace)
            _run("ip", "link", "set", node.veth, "master", BRIDGE)
            _run("ip", "link", "set", node.veth, "up")
            self.exec(node, "ip", "addr", "add", f"{node.address}/24", "dev", "eth0")
            self.exec(node, "ip", "link", "set", "eth0", "up")
            self.exec(node, "ip", "link", "set", "lo", "up")
        common = ["--num-cpus", str(self.num_cpus), "--disable-usage-stats"]
        self.exec(HEAD, RAY, "start", "--head", "--node-ip-address", HEAD.address, "--port", str(GCS_PORT), *common,
                  "--include-dashboard=false", "--temp-dir", str(self.temp_dir), timeout=180)
        self.exec(WORKER, RAY, "start", "--address", self.gcs, "--node-ip-address", WORKER.address, *common,
                  timeout=180)

    def exec(self, node: Node, *cmd: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
        return _run("ip", "netns", "exec", node.namespace, *cmd, timeout=timeout, check=check, env=self.env)

    def popen(self, node: Node, cmd: Sequence[str]) -> list[str]:
        """The argv that runs cmd inside the node's namespace (for a launcher that keeps the process)."""
        return ["ip", "netns", "exec", node.namespace, *cmd]

    def serve_log(self, component: str = "controller") -> str:
        """The text of the head's Ray Serve logs of one component (controller, proxy, replica)."""
        logs = sorted((self.temp_dir / "session_latest" / "logs" / "serve").glob(f"{component}_*.log"))
        return "".join(p.read_text(errors="replace") for p in logs)

    @staticmethod
    def pids(node: Node) -> list[int]:
        done = _run("ip", "netns", "pids", node.namespace, check=False)
        return [int(p) for p in done.stdout.split()]

    @classmethod
    def processes(cls, node: Node, title: str) -> list[int]:
        """Processes of the node whose command line (Ray sets actors' to `ray::<class>...`) contains title."""
        found = []
        for pid in cls.pids(node):
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if title in cmdline:
                found.append(pid)
        return found

    def stop(self) -> None:
        for node in (WORKER, HEAD):
            if Path(f"/run/netns/{node.namespace}").exists():
                for _ in range(3):
                    pids = self.pids(node)
                    if not pids:
                        break
                    for pid in pids:
                        try:
                            os.kill(pid, signal.SIGKILL)
                        except ProcessLookupError:
                            pass
                    time.sleep(0.5)
                _run("ip", "netns", "del", node.namespace, check=False)
            _run("ip", "link", "del", node.veth, check=False)
        _run("ip", "link", "del", BRIDGE, check=False)
        # `ray start --head` wrote its address here; a later ray.init(address=None) would try the dead cluster
        current = Path("/tmp/ray/ray_current_cluster")
        if current.exists() and current.read_text().strip() == self.gcs:
            current.unlink()

    def __enter__(self) -> "RayCluster":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
