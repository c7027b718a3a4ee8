"""The shard that owns a queue is killed with SIGKILL while another shard streams
persistent sends to it: every send the other shard confirmed with a RECEIPT is in the
owner's store after its restart, the rest are sent again over the new link, and each
message is there once."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.interop.stomp_helpers import RawClient
from tests.support.brokers import poll
from tests.support.shard_pair import ShardPair

COUNT = 300


def test_receipted_sends_survive_the_owners_kill9_and_the_rest_are_sent_again(
        tmp_path: Path) -> None:
    pair = ShardPair(tmp_path)
    owner = pair.process(0).start()
    pair.start(1)
    try:
        poll(lambda: pair[1].links_up() == 1, what="the link to the owner")
        queue = pair.owned_by(0, "killed")
        producer = RawClient(pair[1])
        producer.connect()
        receipted: list[int] = []
        for i in range(COUNT):
            producer.send_frame("SEND", [("destination", f"/queue/{queue}"),
                                         ("persistent", "true"), ("receipt", str(i))],
                                f"m{i}".encode())
            if i == COUNT // 3:
                # Some receipts are in, others wait for the owner's STORED.
                frame, _ = producer.read_until("RECEIPT")
                receipted.append(int(frame["receipt-id"]))
                owner.kill9()
        # While the owner is down nothing further is confirmed: all that is unsettled
        # stays with the sending shard (once it has read the sends the client wrote).
        poll(lambda: pair[1].outstanding() > 0, what="sends held for the dead owner")
        owner = pair.process(0).start()
        while len(receipted) < COUNT:
            frame, _ = producer.read_until("RECEIPT", timeout=30)
            receipted.append(int(frame["receipt-id"]))
        assert receipted == list(range(COUNT))  # in order, every one
        poll(lambda: pair[1].outstanding() == 0, what="every send settled")
        consumer = RawClient(owner)
        consumer.connect()
        consumer.send_frame("SUBSCRIBE", [("destination", f"/queue/{queue}"), ("id", "s")])
        bodies = []
        for _ in range(COUNT):
            frame, _ = consumer.read_until("MESSAGE", timeout=30)
            bodies.append(frame.body.decode())
        assert sorted(bodies, key=lambda b: int(b[1:])) == [f"m{i}" for i in range(COUNT)]
        with pytest.raises(TimeoutError):  # and none twice (a bounded negative check)
            consumer.read_until("MESSAGE", timeout=0.5)
        for client in (producer, consumer):
            client.close()
    finally:
        pair.stop()
        if owner.proc is not None and owner.proc.poll() is None:
            owner.terminate()
