"""What the STOMP bad-input tests share, over sockets (tests/interop) and in memory
(tests/unit/broker/stomp): a bystander connected before the bad input and checked after
it, and one bad conversation that must end in an ERROR and a close."""

from __future__ import annotations

from typing import Any

from tests.support.raw_stomp import uid


class Bystander:
    """A client connected before the bad input, checked after it: it still sends and
    receives, saw no error, and the broker still accepts new connections."""

    def __init__(self, broker: Any, client_cls: Any, raw_cls: Any) -> None:
        self.broker = broker
        self.raw_cls = raw_cls
        self.client = client_cls(broker, "1.2")
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
        with self.raw_cls(self.broker) as fresh:
            fresh.connect("1.2")
            fresh.receipt_roundtrip()
        if hasattr(self.broker, "check_alive"):  # a node: every shard still up
            self.broker.check_alive()
        else:
            assert self.broker.runtime is not None and self.broker.runtime.started


def bad(raw: Any, payload: bytes, version: str | None = "1.2", connect: bool = True) -> Any:
    """Send ``payload`` on a fresh raw connection; the ERROR frame that closed it."""
    r = raw()
    if connect:
        r.connect(version)
    r.send_bytes(payload)
    return r.expect_error_and_close()
