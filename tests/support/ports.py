"""Free loopback ports for test brokers, reserved before they start.

Ports come from OUTSIDE the kernel's ephemeral range: a broker killed and restarted on
its port must not find it taken meanwhile as the source port of some client socket.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def free_port() -> int:
    """A free loopback port OUTSIDE the ephemeral range: a broker restarted on it
    after a kill must not find it taken as the source port of some client socket."""
    low, _ = _ephemeral_range()
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(10_000, max(10_001, low))
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # a crowded machine: fall back to the OS's choice
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_ports(n: int) -> list[int]:
    """``n`` distinct free ports."""
    out: list[int] = []
    while len(out) < n:
        port = free_port()
        if port not in out:
            out.append(port)
    return out
