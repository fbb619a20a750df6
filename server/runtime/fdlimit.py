"""The process's open-file budget: every connection, model file and repository scan takes a descriptor.

At start the soft RLIMIT_NOFILE is raised to the hard limit (a default soft limit of 1024 was exhausted by 1,100
idle connections, after which every port and the repository poller failed). Connections are then bounded per door
so that they never take the whole budget: the HTTP and metrics ports together, and the gRPC port, each hold at most
`max_connections` (0 = a quarter of the limit, at most 16384), which leaves half of it to files and to the other
door.
"""
from __future__ import annotations

import logging
import resource

log = logging.getLogger(__name__)

AUTO_CAP = 16384      # connections per door when max_connections is 0: each idle one holds buffers on the HTTP door


def raise_open_file_limit() -> int:
    """Raises the soft limit to the hard one (where allowed); the soft limit in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            log.info("open-file limit raised from %d to %d", soft, target)
            soft = target
        except (ValueError, OSError) as exc:
            log.warning("open-file limit stays %d (raising it to %d failed: %s)", soft, target, exc)
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


def connection_cap(max_connections: int, open_files: int) -> int:
    """Connections one door may hold: the setting, or a quarter of the open-file limit (at least 16)."""
    if max_connections > 0:
        return max_connections
    return max(16, min(AUTO_CAP, open_files // 4))
