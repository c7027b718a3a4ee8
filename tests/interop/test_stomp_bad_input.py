"""Bad input from stomp.py itself: the offending client gets an ERROR with a precise
reason; a client connected at the same time keeps working; the broker stays up. The raw
bad-input cases run without sockets in tests/unit/broker/stomp/test_broker_stomp_bad_input.py."""

from __future__ import annotations

import pytest

from tests.interop.stomp_helpers import Client, RawClient
from tests.support.stomp_bad_input import Bystander


@pytest.fixture
def bystander(broker):
    b = Bystander(broker, Client, RawClient)
    yield b
    b.client.disconnect()


# ------------------------------------------------------------------ semantic errors


def test_send_to_invalid_destination_stomppy(broker, client, bystander):
    c = client("1.2")
    c.conn.send("no-prefix", "x", headers={"receipt": "r"})
    err = c.listener.wait_error()
    assert "Illegal destination name: [no-prefix]" in err.headers["message"]
    c.listener.wait_disconnected()
    bystander.check()


def test_invalid_selector_stomppy(broker, client, bystander):
    c = client("1.2")
    c.conn.subscribe("/queue/sel", "s", headers={"selector": "color = "})
    err = c.listener.wait_error()
    assert "selector" in err.headers["message"].lower()
    bystander.check()


