"""Replicated master/slave clusters of ``meshmq broker`` subprocesses for failure tests:
data nodes and an optional witness, each link optionally through a ``TcpProxy`` the
test can cut (one proxy per direction and pair, so any node can be isolated)."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.ha.support import HaProcess
from tests.support.brokers import ProcessBroker, poll
from tests.support.network import Node
from tests.support.ports import free_port
from tests.support.tcp_proxy import TcpProxy

LEASE_MS = 1000
KEEPALIVE_MS = 200


class WitnessProcess(HaProcess):
    """``meshmq witness --config ...`` (the config does not say role = "witness")."""

    def start(self) -> WitnessProcess:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - lives as long as the process
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "meshmq.cli.main", "witness", "--config",
             str(self.config_path)], stdout=self._log, stderr=subprocess.STDOUT, env=env)
        self._pb.proc = self.proc
        self._pb._log = self._log
        ProcessBroker.running.add(self._pb)
        return self


@dataclass
class Member:
    node: Node
    repl: int  # replication listen port
    witness: bool = False
    proc: HaProcess | None = None

    @property
    def name(self) -> str:
        return self.node.name

    def start(self) -> Member:
        cls = WitnessProcess if self.witness else HaProcess
        self.proc = cls(self.node.write_config(), self.node.root / "broker.log").start()
        return self

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.signal(sig)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.alive()

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.kill9()

    def terminate(self) -> None:
        if self.proc is not None and self.proc.alive():
            self.proc.terminate()

    def ha(self) -> dict[str, Any] | None:
        """The node's HA status, or None when it does not answer (dead, starting)."""
        if self.witness or not self.alive():
            return None
        try:  # a short timeout: a paused (SIGSTOP) node never answers
            url = f"http://127.0.0.1:{self.node.mgmt}/api/stat"
            with urllib.request.urlopen(url, timeout=0.5) as resp:
                stat: dict[str, Any] = json.loads(resp.read())["ha"]
            return stat
        except OSError:
            return None

    def log(self) -> str:
        return (self.node.root / "broker.log").read_text(errors="replace")


@dataclass
class Cluster:
    members: list[Member]
    proxies: dict[tuple[str, str], TcpProxy] = field(default_factory=dict)

    def by_name(self, name: str) -> Member:
        return next(m for m in self.members if m.name == name)

    @property
    def data(self) -> list[Member]:
        return [m for m in self.members if not m.witness]

    def start(self) -> Cluster:
        for m in self.members:
            m.start()
        return self

    def masters(self) -> list[Member]:
        out = []
        for m in self.data:
            ha = m.ha()
            if ha is not None and ha["role"] == "master":
                out.append(m)
        return out

    def writable(self) -> list[str]:
        """Names of the nodes that accept writes right now."""
        out = []
        for m in self.data:
            ha = m.ha()
            if ha is not None and ha.get("writable"):
                out.append(m.name)
        return out

    def wait_master(self, timeout: float = 30, exclude: tuple[str, ...] = ()) -> Member:
        found: list[Member] = []

        def ready() -> bool:
            found[:] = [m for m in self.masters() if m.name not in exclude
                        and "listening for stomp" in m.log()]
            return len(found) == 1

        poll(ready, timeout, "one master serving")
        return found[0]

    def isolate(self, name: str) -> None:
        """Cut every link to and from ``name``."""
        for (a, b), proxy in self.proxies.items():
            if name in (a, b):
                proxy.cut()

    def heal(self) -> None:
        for proxy in self.proxies.values():
            proxy.heal()

    def close(self) -> None:
        for m in self.members:
            m.terminate()
        for proxy in self.proxies.values():
            proxy.close()

    def failover_uri(self) -> str:
        ends = ",".join(f"stomp://127.0.0.1:{m.node.stomp}" for m in self.data)
        return (f"failover:({ends})?randomize=false&timeout=60000"
                "&initialReconnectDelay=20&maxReconnectDelay=200")


def make_cluster(root: Path, names: tuple[str, ...] = ("A", "B"), *, witness: bool = True,
                 proxied: bool = False, **ha: Any) -> Cluster:
    """Data nodes ``names`` (+ witness ``W``). With ``proxied`` every node reaches every
    other through its own proxy."""
    all_names = [*names, *(["W"] if witness else [])]
    repl = {n: free_port() for n in all_names}
    proxies: dict[tuple[str, str], TcpProxy] = {}
    if proxied:
        for a, b in itertools.permutations(all_names, 2):
            proxies[(a, b)] = TcpProxy(repl[b]).start()
    members = []
    for n in all_names:
        others = [f"127.0.0.1:{proxies[(n, o)].port if proxied else repl[o]}"
                  for o in all_names if o != n]
        table = {"mode": "replicated", "listen": f"127.0.0.1:{repl[n]}", "members": others,
                 "node_id": n, "lease_ms": LEASE_MS, "keepalive_ms": KEEPALIVE_MS, **ha}
        node = Node(n, root / n, ha=table)
        members.append(Member(node, repl[n], witness=n == "W"))
    return Cluster(members, proxies)


def wait_caught_up(master: Member, slave: Member, timeout: float = 30) -> None:
    def same() -> bool:
        mh, sh = master.ha(), slave.ha()
        return mh is not None and sh is not None and sh["durable"] == mh["last"]

    poll(same, timeout, f"{slave.name} to catch up with {master.name}")
