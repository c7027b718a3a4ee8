"""The management API's own messages on a shard of several: a send, move or retry to a
destination another shard owns is a decision for that owner (never a queue here), and a
move is staged (copies first, originals removed once the owners stored them)."""

from __future__ import annotations

from tests.unit.core.test_shard_relay import owned_by, shard

from meshmq.core import admin
from meshmq.core import destinations as dst


def test_an_operator_s_send_goes_to_the_destination_s_owner() -> None:
    broker, _ = shard(1)
    away, home = dst.queue(owned_by(0, "send")), dst.queue(owned_by(1, "send"))
    admin.send(broker, away, b"a", {}, persistent=True)
    admin.send(broker, home, b"h", {}, persistent=True)
    [forwarded] = broker.take_shard_sends()
    assert (forwarded.owner, forwarded.message.body) == (0, b"a")
    assert away not in broker.queues
    assert broker.queues[home].depth == 1


def test_a_staged_move_copies_to_the_owner_then_removes_the_originals() -> None:
    broker, _ = shard(1)
    source, target = dst.queue(owned_by(1, "src")), dst.queue(owned_by(0, "dst"))
    for n in range(3):
        admin.send(broker, source, f"m{n}".encode(), {"n": n}, persistent=True)
    result = admin.transfer(broker, source, to=target, selector="n >= 1", copy=True)
    assert result.done == 2 and len(result.ids) == 2
    sent = broker.take_shard_sends()
    assert [(s.owner, s.message.body, s.message.destination) for s in sent] == [
        (0, b"m1", target), (0, b"m2", target)]
    assert target not in broker.queues and broker.queues[source].depth == 3
    assert admin.remove_messages(broker, source, [*result.ids, "ID:gone"]) == 2
    assert [i.message.body for i in admin.queued(broker, source)] == [b"m0"]


def test_a_retry_to_an_original_destination_another_shard_owns_goes_there() -> None:
    broker, _ = shard(1)
    dlq, original = dst.queue(owned_by(1, "DLQ.x")), dst.queue(owned_by(0, "orig"))
    admin.send(broker, dlq, b"dead", {}, persistent=True)
    [item] = admin.queued(broker, dlq)
    # As the DLQ keeps it: its original destination recorded.
    item.message.original_destination = original
    result = admin.transfer(broker, dlq, to=None, copy=True)
    [sent] = broker.take_shard_sends()
    assert (result.done, sent.owner, sent.message.destination) == (1, 0, original)
