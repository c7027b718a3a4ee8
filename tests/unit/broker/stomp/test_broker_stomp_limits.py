"""Limits that protect the broker. Persistent sends without receipts cannot outrun the
store: the connection stops being read once too much unconfirmed data is queued, and
resumes when the store syncs. Subscriptions per connection are capped; a long pipelined
burst keeps its order."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from tests.support.memory_stomp_client import make_broker
from tests.support.raw_stomp import MemoryRawClient, frame_bytes, uid

from meshmq.store.memory import MemoryStore
from meshmq.transport.stomp_server import UNSYNCED_LIMIT


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
    broker = make_broker(tmp_path / "data", store=store)
    try:
        with MemoryRawClient(broker) as producer, MemoryRawClient(broker) as other:
            producer.connect("1.2")
            other.connect("1.2")
            body = b"x" * 64 * 1024
            count = UNSYNCED_LIMIT // len(body) + 2
            producer.send_bytes(b"".join(
                frame_bytes("SEND", [("destination", "/queue/bp"), ("persistent", "true")], body)
                for _ in range(count)))
            broker.wait_for(lambda: store.syncs_waiting > 0, 10,
                            "the producer to wait for the store")
            # A non-persistent SEND with receipt on the same connection is not read yet...
            producer.send_bytes(frame_bytes("SEND", [("destination", "/queue/np"),
                                                       ("receipt", "held")], b"later"))
            # ...while another connection is served normally.
            other.send_bytes(frame_bytes("SEND", [("destination", "/queue/np"),
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
        broker.close()




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
