"""Two shards of one node, in this process: each a real ``BrokerRuntime`` on its own
event loop and thread (as ``ThreadBroker``), with its own store directory and client
ports, linked over Unix sockets in a shared run directory (mode 0700) with a random
token, as a node's supervisor would start them.

``ShardPair.process(k)`` runs shard ``k`` as a subprocess instead (for ``kill9``),
through the test-only entry point ``meshmq.network.shards_main``.

Connection handoff (transport/handoff.py) is off unless a test passes
``sharding=ShardsConfig(handoff=True)``: these shards exist to test what crosses them,
and a client on the wrong shard would otherwise be handed to the owner.

``owned_by(k, prefix)`` finds a destination name that shard ``k`` owns, so a test
says which shard holds the queue instead of depending on the hash's output.
"""

from __future__ import annotations

import dataclasses
import itertools
import secrets
from pathlib import Path
from typing import Any

from meshmq.config.model import BrokerConfig, ListenerConfig, ManagementConfig, ShardsConfig
from meshmq.core import destinations as dst
from meshmq.core.destinations import Destination
from meshmq.core.shards import ShardIdentity, owner
from meshmq.transport.runtime import BrokerRuntime
from tests.interop.stomp_helpers import RawClient
from tests.support.brokers import ProcessBroker, ThreadBroker, make_config, poll

NODE = "node"


class ShardBroker(ThreadBroker):
    """A ThreadBroker that runs as one shard of a node."""

    def __init__(self, config: BrokerConfig, identity: ShardIdentity) -> None:
        super().__init__(config)
        self.identity = identity

    def start(self) -> ShardBroker:
        self.thread.start()
        self.runtime = BrokerRuntime(self.config, shard=self.identity)
        self.call(self.runtime.start())
        return self

    def consumers(self, name: str) -> int:
        """Consumers of queue ``name`` here (relayed ones included)."""
        assert self.runtime is not None
        broker = self.runtime.broker
        return self.run(lambda: len(broker.queues[dst.queue(name)].consumers)
                        if dst.queue(name) in broker.queues else 0)

    def topic_subscribers(self, name: str) -> int:
        """Subscriptions here that topic ``name`` reaches (relayed ones included)."""
        assert self.runtime is not None
        broker = self.runtime.broker
        return self.run(lambda: len(broker.subs_for(dst.topic(name))))

    @property
    def mqtt_port(self) -> int:
        assert self.runtime is not None
        return self.runtime.addresses["mqtt"][1]

    @property
    def ws_port(self) -> int:
        assert self.runtime is not None
        return self.runtime.addresses["ws"][1]

    def links_up(self) -> int:
        assert self.runtime is not None and self.runtime.shard_peers is not None
        return self.run(self.runtime.shard_peers.links_up)

    def outstanding(self) -> int:
        """Sends this shard made that their owner has not yet stored."""
        assert self.runtime is not None and self.runtime.shard_peers is not None
        return self.run(self.runtime.shard_peers.outstanding)

    def client(self, timeout: float | None = None) -> RawClient:
        """A raw STOMP client connected to this shard's port."""
        client = RawClient(self) if timeout is None else RawClient(self, timeout=timeout)
        client.connect()
        return client

    def depth(self, name: str) -> int:
        """Messages in queue ``name`` here (pending, in flight or paged out)."""
        assert self.runtime is not None
        broker = self.runtime.broker
        return self.run(lambda: broker.queues[dst.queue(name)].depth
                        if dst.queue(name) in broker.queues else 0)


class ShardProcess(ProcessBroker):
    """One shard as a real subprocess (``python -m meshmq.network.shards_main``)."""

    module = "meshmq.network.shards_main"

    def __init__(self, base: Path, identity: ShardIdentity, *, handoff: bool = False) -> None:
        data = base / f"shard-{identity.index}"
        config = base / f"shard-{identity.index}.toml"
        config.write_text(f'[broker]\nname = "{identity.node}"\ndata_directory = "{data}"\n\n'
                          '[[listeners]]\nname = "stomp"\nurl = "stomp://127.0.0.1:0"\n\n'
                          "[management]\nenabled = false\n\n"
                          f"[shards]\nhandoff = {'true' if handoff else 'false'}\n")
        super().__init__(config, base / f"shard-{identity.index}.log", (
            "--index", str(identity.index), "--count", str(identity.count),
            "--node", identity.node, "--run-dir", identity.run_dir,
            "--token", identity.token))

    @property
    def host(self) -> str:
        return "127.0.0.1"


class ShardPair:
    """Shards 0 and 1 of node ``node``; start, stop and restart each one."""

    def __init__(self, base: Path, *, mqtt: bool = False, ws: bool = False, count: int = 2,
                 **changes: Any) -> None:
        self.base = base
        run_dir = base / "run"
        run_dir.mkdir(mode=0o700)
        self.count = count
        self.token = secrets.token_hex(16)
        self.identities = [ShardIdentity(index=k, count=count, node=NODE, run_dir=str(run_dir),
                                         token=self.token) for k in range(count)]
        changes.setdefault("sharding", ShardsConfig(handoff=False))
        listeners = [ListenerConfig(name="stomp", protocol="stomp", host="127.0.0.1", port=0)]
        if mqtt:
            listeners.append(ListenerConfig(name="mqtt", protocol="mqtt", host="127.0.0.1",
                                            port=0))
        if ws:
            listeners.append(ListenerConfig(name="ws", protocol="ws", host="127.0.0.1",
                                            port=0))
        self.configs = [dataclasses.replace(
            make_config(base / f"shard-{k}", broker_name=NODE, listeners=tuple(listeners),
                        management=ManagementConfig(enabled=False)), **changes)
            for k in range(count)]
        self.shards: list[ShardBroker | None] = [None] * count

    def start(self, k: int | None = None) -> ShardPair:
        for i in range(self.count) if k is None else (k,):
            assert self.shards[i] is None
            self.shards[i] = ShardBroker(self.configs[i], self.identities[i]).start()
        return self

    def stop(self, k: int | None = None) -> None:
        for i in range(self.count) if k is None else (k,):
            shard = self.shards[i]
            if shard is not None:
                self.shards[i] = None
                shard.stop()

    def __getitem__(self, k: int) -> ShardBroker:
        shard = self.shards[k]
        assert shard is not None, f"shard {k} is not running"
        return shard

    def wait_linked(self) -> None:
        for k in range(self.count):
            poll(lambda k=k: self[k].links_up() == self.count - 1, what=f"shard {k}'s links")

    def stop_owner(self, k: int = 0) -> None:
        """Stop shard ``k`` and wait until every other shard's link to it is down."""
        self.stop(k)
        for i in range(self.count):
            if i != k and self.shards[i] is not None:
                poll(lambda i=i: self[i].links_up() == 0, what=f"shard {i}'s link to drop")

    def process(self, k: int) -> ShardProcess:
        """Shard ``k`` as a subprocess (not tracked in ``shards``): start it, kill it."""
        return ShardProcess(self.base, self.identities[k],
                            handoff=self.configs[k].sharding.handoff)

    def owned_by(self, k: int, prefix: str, kind: str = "queue") -> str:
        """A fresh destination name, starting with ``prefix``, that shard ``k`` owns."""
        for n in itertools.count():
            name = f"{prefix}.{n}"
            if owner(Destination.parse_uri(f"{kind}://{name}"), self.count, node=NODE) == k:
                return name
        raise AssertionError("unreachable")
