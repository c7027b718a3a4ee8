"""Bad input: the offending client gets an ERROR with a precise
reason and is closed; a client connected at the same time keeps working; the broker
stays up."""

from __future__ import annotations

import pytest

from meshmq.config.model import StompConfig
from tests.interop.stomp_helpers import Client, RawClient, uid


class Bystander:
    """A stomp.py client connected before the bad input, checked after it."""

    def __init__(self, broker) -> None:
        self.broker = broker
        self.client = Client(broker, "1.2")
        self.queue = f"/queue/{uid('bystander')}"
        self.client.subscribe(self.queue, "by")
        self.rounds = 0

    def check(self) -> None:
        self.rounds += 1
        body = f"still fine {self.rounds}"
        self.client.send(self.queue, body)
        msgs = self.client.wait_messages(self.rounds)
        assert msgs[-1].body == body
        assert not self.client.listener.errors
        assert not self.client.listener.disconnected
        # and the broker accepts new connections
        with RawClient(self.broker) as fresh:
            fresh.connect("1.2")
            fresh.receipt_roundtrip()
        assert self.broker.runtime is not None and self.broker.runtime.started


@pytest.fixture
def bystander(broker):
    b = Bystander(broker)
    yield b
    b.client.disconnect()


def _bad(raw, payload: bytes, version: str | None = "1.2", connect: bool = True):
    r = raw()
    if connect:
        r.connect(version)
    r.send_bytes(payload)
    return r.expect_error_and_close()


# ------------------------------------------------------------------ malformed frames




















# ------------------------------------------------------------------ limits


@pytest.fixture
def limited(broker_factory):
    return broker_factory(stomp=StompConfig(max_frame_size=4096, max_header_size=1024,
                                            max_headers=20, frame_timeout_ms=300,
                                            connect_timeout_ms=300))


@pytest.fixture
def limited_bystander(limited):
    b = Bystander(limited)
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


























