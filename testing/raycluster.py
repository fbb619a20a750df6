"""A two-node Ray cluster on this machine, each node in its own network namespace (root only).

    root namespace:        bridge ortsb<id> 10.<a>.<b>.1/24   (the test's clients)
    ortserve-head-<id>:    10.<a>.<b>.2   `ray start --head`, the Serve controller and a proxy
    ortserve-worker-<id>:  10.<a>.<b>.3   `ray start --address 10.<a>.<b>.2:6390`

<id> is the owning process's pid (and <a>.<b> derived from it), so two runs on one machine cannot collide; a
run's start removes what a dead run left. Each node has its own addresses and ports, so two nodes cannot share
a socket by accident, and a process of one node is told from the other's by its network namespace
(`ip netns pids`). Stopping kills exactly the processes in the two namespaces (never `ray stop`, which would
stop every Ray on the machine), then removes the namespaces, the bridge and the session files.
"""
from __future__ import annotations

import logging
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

log = logging.getLogger(__name__)

GCS_PORT = 6390
RAY = str(Path(sys.executable).with_name("ray"))
_OWNED = re.compile(r"^ortserve-(head|worker)-(\d+)\b")


class ClusterError(RuntimeError):
    pass


@dataclass(frozen=True)
class Node:
    namespace: str
    address: str
    veth: str


def _nodes(owner: int) -> tuple[str, str, "Node", "Node"]:
    """(bridge, bridge address, head, worker) of the cluster owned by process `owner`."""
    net = f"10.{100 + (owner >> 8) % 150}.{owner % 256}"
    return (f"ortsb{owner}", f"{net}.1", Node(f"ortserve-head-{owner}", f"{net}.2", f"ortsh{owner}"),
            Node(f"ortserve-worker-{owner}", f"{net}.3", f"ortsw{owner}"))


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
    def __init__(self, num_cpus: int = 1, env: dict[str, str] | None = None, owner: int | None = None) -> None:
        self.owner = os.getpid() if owner is None else owner
        self.bridge, self.bridge_address, self.head, self.worker = _nodes(self.owner)
        self.num_cpus = num_cpus
        # the head's Ray session files (its logs), apart from any other Ray here; short, for Ray's socket paths
        self.temp_dir = Path(f"/tmp/ortserve-ray-{self.owner}")
        # Ray's token authentication, with a token of this cluster's own (not ~/.ray/auth_token).
        self.env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "token",
                    "RAY_AUTH_TOKEN": secrets.token_hex(32), **(env or {})}

    @property
    def gcs(self) -> str:
        return f"{self.head.address}:{GCS_PORT}"

    def start(self) -> "RayCluster":
        _remove_dead_owners()  # what an interrupted run left
        self.stop()
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        _run("ip", "link", "add", self.bridge, "type", "bridge")
        _run("ip", "addr", "add", f"{self.bridge_address}/24", "dev", self.bridge)
        _run("ip", "link", "set", self.bridge, "up")
        for node in (self.head, self.worker):
            _run("ip", "netns", "add", node.namespace)
            _run("ip", "link", "add", node.veth, "type", "veth", "peer", "name", "eth0", "netns", node.namespace)
            _run("ip", "link", "set", node.veth, "master", self.bridge)
            _run("ip", "link", "set", node.veth, "up")
            self.exec(node, "ip", "addr", "add", f"{node.address}/24", "dev", "eth0")
            self.exec(node, "ip", "link", "set", "eth0", "up")
            self.exec(node, "ip", "link", "set", "lo", "up")
        common = ["--num-cpus", str(self.num_cpus), "--disable-usage-stats"]
        self.exec(self.head, RAY, "start", "--head", "--node-ip-address", self.head.address, "--port", str(GCS_PORT), *common,
                  "--include-dashboard=false", "--temp-dir", str(self.temp_dir), timeout=180)
        self.exec(self.worker, RAY, "start", "--address", self.gcs, "--node-ip-address", self.worker.address, *common,
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
        for node in (self.worker, self.head):
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
        _run("ip", "link", "del", self.bridge, check=False)
        shutil.rmtree(self.temp_dir, ignore_errors=True)
        # `ray start --head` wrote its address here; a later ray.init(address=None) would try the dead cluster
        current = Path("/tmp/ray/ray_current_cluster")
        if current.exists() and current.read_text().strip() == self.gcs:
            current.unlink()

    def __enter__(self) -> "RayCluster":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _remove_dead_owners() -> None:
    """Clusters whose owning process is gone (a run killed before its cleanup)."""
    listed = _run("ip", "netns", "list", check=False).stdout.splitlines()
    owners = {int(m.group(2)) for m in map(_OWNED.match, listed) if m}
    for owner in owners:
        if not Path(f"/proc/{owner}").exists():
            RayCluster(owner=owner).stop()
