"""Limits that protect the broker. Persistent sends without receipts cannot outrun the
store: the connection stops being read once too much unconfirmed data is queued, and
resumes when the store syncs. A listener refuses connections beyond max_connections."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from meshmq.store.memory import MemoryStore
from meshmq.transport.stomp_server import UNSYNCED_LIMIT
from tests.interop.stomp_helpers import RawClient, frame_bytes, uid
from tests.support.brokers import ThreadBroker, make_config, poll


class GatedStore(MemoryStore):
    """A memory store whose sync() waits until the test opens the gate."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.syncs_waiting = 0

    async def sync(self) -> None:
        self.syncs_waiting += 1
        # The "disk" is busy until the test opens the gate; the event loop keeps running.
        await asyncio.get_running_loop().run_in_executor(None, self.gate.wait)
        await super().sync()


def test_unconfirmed_persistent_sends_pause_the_producer(tmp_path: Path) -> None:
    store = GatedStore()
    broker = ThreadBroker(make_config(tmp_path / "data"), store=store).start()
    try:
        with RawClient(broker) as producer, RawClient(broker) as other:
            producer.connect("1.2")
            other.connect("1.2")
            body = b"x" * 64 * 1024
            count = UNSYNCED_LIMIT // len(body) + 2
            producer.sock.sendall(b"".join(
                frame_bytes("SEND", [("destination", "/queue/bp"), ("persistent", "true")], body)
                for _ in range(count)))
            poll(lambda: store.syncs_waiting > 0, 10, "the producer to wait for the store")
            # A non-persistent SEND with receipt on the same connection is not read yet...
            producer.sock.sendall(frame_bytes("SEND", [("destination", "/queue/np"),
                                                       ("receipt", "held")], b"later"))
            # ...while another connection is served normally.
            other.sock.sendall(frame_bytes("SEND", [("destination", "/queue/np"),
                                                    ("receipt", "other")], b"ok"))
            other.read_until_receipt("other")
            depth_before = broker.destination_stats("np")["depth"]
            assert depth_before == 1
            store.gate.set()
            producer.read_until_receipt("held")
            assert broker.destination_stats("bp")["depth"] == count
            assert broker.destination_stats("np")["depth"] == 2
    finally:
        store.gate.set()  # never leave a sync blocked if the test failed early
        broker.stop()


def test_listener_refuses_connections_beyond_max_connections(tmp_path: Path) -> None:
    import dataclasses
    import socket

    from meshmq.config.model import ListenerConfig

    config = dataclasses.replace(make_config(tmp_path / "data"), listeners=(
        ListenerConfig(name="stomp", protocol="stomp", host="127.0.0.1", port=0,
                       max_connections=2),))
    broker = ThreadBroker(config).start()
    try:
        with RawClient(broker) as a, RawClient(broker) as b:
            a.connect("1.2")
            b.connect("1.2")
            with socket.create_connection(("127.0.0.1", broker.port), timeout=10) as c:
                c.settimeout(10)
                try:
                    assert c.recv(10) == b""  # closed at once by the broker
                except ConnectionResetError:
                    pass
        # Once they have gone, new connections are admitted again.
        poll(lambda: broker.stats()["connections"] == 0, 10, "connections to close")
        with RawClient(broker) as d:
            d.connect("1.2")
    finally:
        broker.stop()


def test_subscription_limit_per_connection_is_an_error_frame(broker_factory, raw):
    b = broker_factory(max_subscriptions_per_connection=2)
    r = raw(on=b)
    r.connect("1.2")
    for i in range(2):
        r.send_frame("SUBSCRIBE", [("destination", f"/topic/lim.{i}"), ("id", str(i))])
    r.send_frame("SUBSCRIBE", [("destination", "/topic/lim.2"), ("id", "2"),
                               ("receipt", "r")])
    err = r.expect_error_and_close()
    assert "at most 2 subscriptions (broker.max_subscriptions_per_connection)" \
        in err["message"]
    assert err.get("receipt-id") == "r"


def test_many_pipelined_frames_keep_their_order(broker, raw):
    """A burst larger than one event-loop turn's share is handled over several turns,
    in order, with nothing lost."""
    r = raw()
    r.connect("1.2")
    q = f"/queue/{uid('burst')}"
    count = 2000
    r.send_bytes(b"".join(frame_bytes("SEND", [("destination", q)], str(i).encode())
                          for i in range(count))
                 + frame_bytes("SUBSCRIBE", [("destination", q), ("id", "s")]))
    got = []
    while len(got) < count:
        frame = r.read_frame()
        assert frame.command == "MESSAGE", frame
        got.append(int(frame.body))
    assert got == list(range(count))
