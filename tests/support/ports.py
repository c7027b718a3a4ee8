"""Free loopback ports for test brokers, reserved before they start.

Ports come from OUTSIDE the kernel's ephemeral range: a broker killed and restarted on
its port must not find it taken meanwhile as the source port of some client socket.
"""

from __future__ import annotations

import os
import random
import socket
from pathlib import Path


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


# Every port handed out in this process: a port is only probed, not held, until its
# broker binds it, so without this two picks for one topology (say nine listeners of a
# three-broker mesh) could draw the same number.
_handed_out: set[int] = set()


def _worker_slice(low: int, high: int) -> tuple[int, int]:
    """This process's share of [low, high): under pytest-xdist each worker draws from
    its own slice, so two workers never pick the same port between probe and bind."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")  # "gw0", "gw1", ...
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    if not worker.startswith("gw") or count <= 1:
        return low, high
    index = int(worker[2:]) % count
    size = (high - low) // count
    return low + index * size, low + (index + 1) * size


def free_port() -> int:
    """A free loopback port OUTSIDE the ephemeral range: a broker restarted on it
    after a kill must not find it taken as the source port of some client socket.
    Never the same port twice in one test process, nor in two xdist workers."""
    low, _ = _ephemeral_range()
    first, last = _worker_slice(10_000, max(10_001, low))
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(first, max(first + 1, last))
        if port in _handed_out:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    with socket.socket() as s:  # a crowded machine: fall back to the OS's choice
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_ports(n: int) -> list[int]:
    """``n`` distinct free ports."""
    return [free_port() for _ in range(n)]
