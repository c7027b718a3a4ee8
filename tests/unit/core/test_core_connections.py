"""core/connections.py: opening and closing connections, temporary destinations."""

from __future__ import annotations

import pytest
from tests.unit.core.test_broker_core import connect, make_broker, send, sub

from meshmq.core import destinations as dst
from meshmq.core.destinations import DestKind
from meshmq.errors import DestinationError, MeshmqError


def test_a_client_id_is_held_by_one_connection_at_a_time() -> None:
    broker, _, _ = make_broker()
    first = connect(broker, client_id="app")
    with pytest.raises(MeshmqError) as refused:
        connect(broker, client_id="app")
    assert refused.value.code == "client-id-in-use"
    broker.close_connection(first)
    assert connect(broker, client_id="app").client_id == "app"
    assert broker.client_connections_opened == 3 - 1  # the refused one never opened


def test_closing_in_steps_unsubscribes_a_budget_at_a_time() -> None:
    broker, _, _ = make_broker()
    conn = connect(broker)
    for i in range(5):
        sub(broker, conn, f"s{i}", f"q{i}")
    assert not broker.close_connection_step(conn, 2)
    assert len(conn.consumers) == 3 and conn.id in broker.connections
    assert not broker.close_connection_step(conn, 2)
    assert broker.close_connection_step(conn, 2)
    assert conn.id not in broker.connections
    assert broker.close_connection_step(conn, 2)  # closing again is harmless


def test_a_temporary_queue_goes_away_with_its_connection() -> None:
    broker, _, _ = make_broker()
    owner, other = connect(broker), connect(broker)
    temp = broker.create_temp(owner, DestKind.TEMP_QUEUE)
    assert temp.name.startswith("ID:unit-") and broker.temp_exists(temp)
    broker.send(other, (temp,), _msg(broker, temp))
    broker.close_connection(owner)
    assert not broker.temp_exists(temp)
    with pytest.raises(DestinationError):
        broker.send(other, (temp,), _msg(broker, temp))


def test_an_adopted_temporary_topic_belongs_to_the_bridge_connection() -> None:
    broker, _, _ = make_broker()
    bridge = connect(broker)
    remote = dst.Destination(DestKind.TEMP_TOPIC, "ID:remote-1:1")
    broker.adopt_temp(bridge, remote)
    assert broker.temp_exists(remote)
    send(broker, bridge, "q", "x")
    broker.close_connection(bridge)
    assert not broker.temp_exists(remote)


def _msg(broker: object, dest: dst.Destination) -> object:
    from meshmq.core.message import Message

    return Message(message_id="m", destination=dest, body=b"x")
