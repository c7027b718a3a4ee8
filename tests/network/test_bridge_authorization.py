"""A bridge acts on the broker that accepted it as the user it logged in as: it is
offered only the demand that user may write there, and a message it may not write is
refused and stays where it was (docs/security.md#authorization)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from meshmq.config.model import (
    AuthConfig,
    AuthorizationConfig,
    AuthorizationEntry,
    AuthorizationRights,
    User,
)
from meshmq.core import destinations as dst
from tests.interop.stomp_helpers import Client
from tests.network.helpers import bridges, connector, consumers_on, net_config, tcp_uri
from tests.support.brokers import ThreadBroker, poll

# On broker B: the link's user may write orders.> only; the application reads everything.
B_AUTH = AuthConfig(
    anonymous_access=False,
    users=(User("link", "link-secret", ("network",)), User("app", "app-pw", ("apps",))),
    authorization=AuthorizationConfig(
        entries=(AuthorizationEntry(queue="orders.>", read=("apps",),
                                    write=("network", "apps"), admin=("network", "apps")),),
        default=AuthorizationRights(read=("apps",), write=("apps",), admin=("apps",))))


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[ThreadBroker, ThreadBroker]]:
    b = ThreadBroker(net_config(tmp_path / "b", "B", auth=B_AUTH)).start()
    a = ThreadBroker(net_config(tmp_path / "a", "A", connector(
        tcp_uri(b), username="link", password="link-secret"))).start()
    try:
        poll(lambda: any(x["state"] == "forwarding" for x in bridges(a)),
             what="the bridge A -> B")
        yield a, b
    finally:
        a.stop()
        b.stop()


def depth(broker: ThreadBroker, name: str) -> int:
    assert broker.runtime is not None
    queues = broker.runtime.broker.queues
    queue = broker.run(lambda: queues.get(dst.queue(name)))
    return 0 if queue is None else int(queue.depth)


def outbound(a: ThreadBroker) -> dict[str, Any]:
    return next(x for x in bridges(a) if x["direction"] == "outbound")


def test_only_demand_the_link_user_may_write_is_offered(
        pair: tuple[ThreadBroker, ThreadBroker]) -> None:
    a, b = pair
    app = Client(b, login="app", passcode="app-pw")
    app.subscribe("/queue/orders.x")
    app.subscribe("/queue/secret")
    poll(lambda: consumers_on(a, "queue://orders.x") == 1, what="demand for orders.x")
    producer = Client(a)
    producer.send("/queue/secret", "s1")
    producer.send("/queue/orders.x", "o1")
    assert [m.body for m in app.wait_messages(1)] == ["o1"]
    # No demand for secret was offered: it waits on A for a consumer there.
    assert consumers_on(a, "queue://secret") == 0
    assert depth(a, "secret") == 1
    assert app.bodies() == ["o1"]
    app.close()
    producer.close()


def test_a_wildcard_demand_forwards_what_it_may_and_keeps_the_rest(
        pair: tuple[ThreadBroker, ThreadBroker]) -> None:
    a, b = pair
    app = Client(b, login="app", passcode="app-pw")
    app.subscribe("/queue/>")
    poll(lambda: outbound(a)["demand"] >= 1, what="the wildcard demand on A")
    producer = Client(a)
    producer.send("/queue/secret", "s2")  # creates it on A: the wildcard demand covers it
    producer.send("/queue/orders.y", "o2")
    app.listener.wait(lambda: "o2" in app.bodies(), what="o2 on B")
    poll(lambda: outbound(a)["refused"] >= 1, what="B refusing secret")
    assert "s2" not in app.bodies()
    poll(lambda: depth(a, "secret") == 1, what="s2 kept on A")
    stats = b.run(b.runtime.broker.statistics)  # type: ignore[union-attr]
    assert stats["denied"]["by_user"].get("link", 0) >= 1
    # Still forwarding what it may: a later order crosses.
    producer.send("/queue/orders.z", "o3")
    app.listener.wait(lambda: "o3" in app.bodies(), what="o3 on B")
    assert depth(a, "secret") == 1
    app.close()
    producer.close()
