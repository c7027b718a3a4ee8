"""The network's read-only view of the core: local interest, durables, and whether a
local client would take a queue message (socket-free)."""

from __future__ import annotations

from tests.unit.core.test_broker_core import connect, make_broker, sub

from meshmq.core import destinations as dst
from meshmq.core import network_view as view
from meshmq.core.message import Message


def msg(broker_conn_id: str, name: str, **fields: object) -> Message:
    return Message(message_id=f"{broker_conn_id}:1", destination=dst.queue(name),
                   body=b"x", producer_id=broker_conn_id, **fields)  # type: ignore[arg-type]


def test_consumer_interest_lists_open_consumers_with_their_path_and_skips_browsers() -> None:
    broker, _, _ = make_broker()
    conn = connect(broker, client_id="C1")
    local = sub(broker, conn, "a", "q1,q2", selector="x = 1")
    bridged = sub(broker, conn, "b", "q3", network_path=("B", "C"),
                  network_origins=("C/c7",))
    sub(broker, conn, "c", "q4", browser=True)
    durable = sub(broker, conn, "d", "topic:t.>", subscription_name="dur")
    got = {c.consumer_id: c for c in view.consumer_interest(broker)}
    assert set(got) == {local.id, bridged.id, durable.id}
    assert got[local.id].destinations == (dst.queue("q1"), dst.queue("q2"))
    assert got[local.id].selector == "x = 1" and got[local.id].network_path is None
    assert got[bridged.id].network_path == ("B", "C")
    assert got[bridged.id].network_origins == ("C/c7",)
    assert got[durable.id].durable_key == ("C1", "dur")
    assert got[local.id].durable_key is None
    broker.unsubscribe(conn, local)
    assert local.id not in {c.consumer_id for c in view.consumer_interest(broker)}


def test_durable_interest_is_the_offline_durables_only() -> None:
    broker, _, _ = make_broker()
    conn = connect(broker, client_id="C1")
    durable = sub(broker, conn, "d", "topic:t.>", subscription_name="dur",
                  selector="p > 2")
    assert [d.subscription_name for d in view.durable_interest(broker)] == ["dur"]
    # The caller skips those it saw with an open consumer.
    assert list(view.durable_interest(broker, skip={("C1", "dur")})) == []
    broker.unsubscribe(conn, durable)
    (offline,) = view.durable_interest(broker)
    assert (offline.client_id, offline.patterns, offline.selector) == (
        "C1", (dst.topic("t.>"),), "p > 2")
    assert view.has_durable(broker, ("C1", "dur"))
    assert not view.has_durable(broker, ("C1", "other"))


def test_local_consumer_takes_ignores_bridges_and_honours_selectors_when_asked() -> None:
    broker, _, _ = make_broker()
    conn = connect(broker)
    m = msg(conn.id, "q", properties={"x": 2})
    assert not view.local_consumer_takes(broker, m, selector_aware=False)  # no queue
    sub(broker, conn, "n", "q", network_path=("B",))
    assert not view.local_consumer_takes(broker, m, selector_aware=False)
    picky = sub(broker, conn, "p", "q", selector="x = 1")
    assert view.local_consumer_takes(broker, m, selector_aware=False)
    assert not view.local_consumer_takes(broker, m, selector_aware=True)
    sub(broker, conn, "ok", "q", selector="x = 2")
    assert view.local_consumer_takes(broker, m, selector_aware=True)
    assert picky.selector is not None
