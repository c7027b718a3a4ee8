"""A client id's claim abandoned while its take-over is under way, on two real shards
with real MQTT clients: the second connection ends (its CONNECT's answer waited past
the listener's ``connect_timeout_ms``) while the id's owner waits for the first
connection's shard to close it. The owner then frees the id once that close is done,
instead of granting it to the claim nobody holds any more (which would keep it held
until that shard's link dropped)."""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path
from typing import Any

from meshmq.config.model import MqttConfig
from meshmq.core.shards import client_owner
from meshmq.protocol.mqtt import Connect, Properties
from tests.interop.mqtt_helpers import RawMqtt
from tests.interop.stomp_helpers import RawClient
from tests.support.brokers import poll
from tests.support.shard_pair import ShardBroker, ShardPair


def _client_id(pair: ShardPair, k: int, prefix: str) -> str:
    for n in itertools.count():
        if client_owner(f"{prefix}-{n}", pair.count) == k:
            return f"{prefix}-{n}"
    raise AssertionError("unreachable")


def _claims(shard: ShardBroker) -> Any:
    assert shard.runtime is not None and shard.runtime.shard_peers is not None
    return shard.runtime.shard_peers.clients


class _HeldCloses:
    """Shard ``shard`` holds the owner's ``client-close`` requests until ``release``."""

    def __init__(self, shard: ShardBroker) -> None:
        self.shard = shard
        self.held: list[tuple[Any, dict[str, Any]]] = []
        claims = _claims(shard)
        self.original = claims.on_interest

        def on_interest(peer: Any, body: dict[str, Any]) -> None:
            if body.get("op") == "client-close":
                self.held.append((peer, body))
            else:
                self.original(peer, body)
        shard.run(lambda: setattr(claims, "on_interest", on_interest))

    def count(self) -> int:
        return self.shard.run(lambda: len(self.held))

    def release(self) -> None:
        def go() -> None:
            held, self.held = self.held, []
            for peer, body in held:
                self.original(peer, body)
        self.shard.run(go)


def test_a_connect_that_times_out_during_its_take_over_leaves_the_client_id_free(
        tmp_path: Path) -> None:
    pair = ShardPair(tmp_path, mqtt=True)
    # Shard 1 closes a connection whose CONNECT is not answered within 1 s.
    pair.configs[1] = dataclasses.replace(pair.configs[1],
                                          mqtt=MqttConfig(connect_timeout_ms=1000))
    pair.start()
    first = second = None
    try:
        pair.wait_linked()
        client_id = _client_id(pair, 1, "dev")  # shard 1 arbitrates it
        owner = _claims(pair[1])
        closes = _HeldCloses(pair[0])
        first = RawMqtt(pair[0].mqtt_port, level=5)
        first.connect(client_id)
        second = RawMqtt(pair[1].mqtt_port, level=5)
        second.send(Connect(client_id=client_id, clean_start=True, keep_alive=0,
                            properties=Properties(), protocol_level=5))
        poll(lambda: closes.count() == 1, what="the take-over's close")
        second.until_closed()  # no CONNACK in time: the connection ends
        poll(lambda: pair[1].run(lambda: client_id not in owner.held),
             what="the abandoned claim's release")
        closes.release()  # the first connection is closed now, as the take-over asked
        first.until_closed()
        poll(lambda: pair[1].run(lambda: not owner._closing), what="the take-over's end")
        assert pair[1].run(lambda: client_id not in owner.table)
        # Free: a STOMP client-id is accepted, on either shard.
        for k in (0, 1):
            stomp = RawClient(pair[k])
            stomp.connect(extra=[("client-id", client_id)])
            stomp.close()
            poll(lambda: pair[1].run(lambda: client_id not in owner.table),
                 what="the STOMP connection's release")
    finally:
        for client in (first, second):
            if client is not None:
                client.close()
        pair.stop()
