"""The destinations and messages routes of the admin API over real HTTP: listing,
creating, deleting and purging destinations, browsing with paging and selectors,
viewing, deleting, moving and retrying messages, and who may change anything."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from meshmq.client.simple_stomp import SimpleStompClient
from meshmq.config.model import AuthConfig, DestinationPolicy, ManagementConfig, User
from tests.management.http import all_ids, call, ok, q
from tests.support.brokers import ThreadBroker, poll

# A small page size: most of a test queue lives only in the store (paged out).
SMALL_PAGES = (DestinationPolicy(match="queue://>", page_size=10),)


@pytest.fixture
def broker(broker_factory: Callable[..., ThreadBroker]) -> ThreadBroker:
    return broker_factory(policies=SMALL_PAGES)


def send(port: int, queue: str, count: int, persistent: bool = True,
         headers: Callable[[int], dict[str, Any]] | None = None) -> list[str]:
    return [ok(port, "POST", f"/api/destinations/queue/{q(queue)}/send",
               {"body": f"m{i}", "headers": headers(i) if headers else {},
                "persistent": persistent}, 201)["message_id"] for i in range(count)]


def depth(port: int, queue: str) -> int:
    return int(ok(port, "GET", f"/api/destinations/queue/{q(queue)}")["depth"])


def test_browse_pages_through_memory_and_store_with_a_selector(broker: ThreadBroker) -> None:
    port = broker.management_port
    ids = send(port, "work", 30, headers=lambda i: {"n": i,
                                                    "color": "red" if i % 2 else "blue"})
    first = ok(port, "GET", "/api/queues/work/messages?limit=10")
    assert (first["total"], first["offset"], first["limit"]) == (30, 0, 10)
    assert [m["message_id"] for m in first["messages"]] == ids[:10]
    last = ok(port, "GET", "/api/queues/work/messages?offset=25&limit=10")
    assert [m["message_id"] for m in last["messages"]] == ids[25:]
    assert all_ids(port, "work") == ids  # paged-out messages come from the store
    m = first["messages"][3]
    assert m["headers"] == {"n": 3, "color": "red"} and m["persistent"] is True
    assert (m["body_preview"], m["size"], m["redelivered"]) == ("m3", 2, False)
    red = ok(port, "GET", "/api/queues/work/messages?limit=5&offset=2&selector="
             + q("color = 'red' AND n > 4"))
    assert red["total"] == 13  # n = 5, 7, ..., 29
    assert [m["headers"]["n"] for m in red["messages"]] == [9, 11, 13, 15, 17]
    status, body = call(port, "GET", "/api/queues/work/messages?selector=" + q("color = = 1"))
    assert status == 400 and body["error"].startswith("invalid selector:")
    status, body = call(port, "GET", "/api/queues/work/messages?limit=5000")
    assert status == 400 and "limit=5000" in body["error"]
    status, body = call(port, "GET", "/api/queues/absent/messages")
    assert status == 404 and "absent" in body["error"]


def test_view_shows_utf8_and_binary_bodies(broker: ThreadBroker) -> None:
    port = broker.management_port
    with SimpleStompClient("127.0.0.1", broker.port) as c:
        c.send("/queue/bodies", "héllo ✓".encode(), {"persistent": "true"})
        c.send("/queue/bodies", b"\x00\xff\xfebin", {"persistent": "true"})
    text_id, bin_id = all_ids(port, "bodies")
    text = ok(port, "GET", f"/api/queues/bodies/messages/{q(text_id)}")
    assert (text["body"], text["body_encoding"], text["truncated"]) == \
        ("héllo ✓", "utf-8", False)
    binary = ok(port, "GET", f"/api/queues/bodies/messages/{q(bin_id)}")
    assert (binary["body"], binary["body_encoding"]) == ("AP/+Ymlu", "base64")
    assert binary["size"] == 6
    status, body = call(port, "GET", "/api/queues/bodies/messages/ID:nope")
    assert status == 404 and "ID:nope" in body["error"]
    status, body = call(port, "GET", f"/api/queues/nothere/messages/{q(text_id)}")
    assert status == 404


def test_delete_and_purge_leave_messages_in_flight_to_their_consumer(
        broker: ThreadBroker) -> None:
    port = broker.management_port
    ids = send(port, "busy", 25)
    with SimpleStompClient("127.0.0.1", broker.port) as consumer:
        consumer.subscribe("/queue/busy", ack="client-individual",
                           headers={"activemq.prefetchSize": "1"})
        frame = consumer.receive(10)
        assert frame is not None and frame.get("message-id") == ids[0]
        poll(lambda: ok(port, "GET", "/api/destinations/queue/busy")["in_flight"] == 1)
        status, body = call(port, "DELETE", f"/api/queues/busy/messages/{q(ids[0])}")
        assert status == 409 and "acknowledged" in body["error"]
        # One in memory, one paged out to the store.
        for victim in (ids[1], ids[20]):
            assert ok(port, "DELETE", f"/api/queues/busy/messages/{q(victim)}") == \
                {"deleted": victim}
        assert depth(port, "busy") == 23
        assert ok(port, "POST", "/api/destinations/queue/busy/purge") == {"purged": 22}
        assert all_ids(port, "busy") == [ids[0]]
        consumer.ack(frame)
        poll(lambda: depth(port, "busy") == 0, what="the in-flight message acked")
    status, _ = call(port, "DELETE", f"/api/queues/busy/messages/{q(ids[2])}")
    assert status == 404


def test_move_and_copy_by_selector_and_ids_to_queues_and_topics(broker: ThreadBroker) -> None:
    port = broker.management_port
    ids = send(port, "src", 30, headers=lambda i: {"n": i})
    copied = ok(port, "POST", "/api/queues/src/move", {"to": "queue://backup", "copy": True})
    assert copied == {"copied": 30}
    assert all_ids(port, "backup") == ids and all_ids(port, "src") == ids
    moved = ok(port, "POST", "/api/queues/src/move",
               {"to": "queue://low", "selector": "n < 12"})
    assert moved == {"moved": 12}
    assert all_ids(port, "low") == ids[:12] and all_ids(port, "src") == ids[12:]
    picked = [ids[13], ids[29]]  # one in memory, one paged out
    assert ok(port, "POST", "/api/queues/src/move",
              {"to": "queue://low", "message_ids": picked}) == {"moved": 2}
    assert all_ids(port, "low") == ids[:12] + picked
    with SimpleStompClient("127.0.0.1", broker.port) as listener:
        listener.subscribe("/topic/fanout")
        assert ok(port, "POST", "/api/queues/src/move",
                  {"to": "topic://fanout", "selector": "n >= 20"}) == {"moved": 9}
        got = [listener.receive(10) for _ in range(9)]
        assert [f.get("message-id") for f in got if f is not None] == \
            [i for i in ids[20:] if i != ids[29]]
    assert depth(port, "src") == 30 - 12 - 2 - 9
    for bad, why in (({"to": "queue://src"}, "another"), ({"to": "nowhere"}, "queue://NAME"),
                     ({"to": "queue://a.*"}, "wildcard"), ({}, "'to'"),
                     ({"to": "queue://x", "message_ids": "ID:1"}, "message_ids"),
                     ({"to": "queue://x", "selector": "n <"}, "invalid selector")):
        status, body = call(port, "POST", "/api/queues/src/move", bad)
        assert status == 400 and why in body["error"], (bad, body)
    status, _ = call(port, "POST", "/api/queues/ghost/move", {"to": "queue://x"})
    assert status == 404


def test_retry_sends_dead_lettered_messages_back_where_they_came_from(
        broker: ThreadBroker) -> None:
    port = broker.management_port
    expires = str(int(time.time() * 1000) + 50)
    with SimpleStompClient("127.0.0.1", broker.port) as c:
        for i in range(3):
            c.send(f"/queue/jobs{i % 2}", f"job{i}".encode(),
                   {"persistent": "true", "expires": expires, "n": str(i)})
    poll(lambda: call(port, "GET", "/api/destinations/queue/ActiveMQ.DLQ")[1].get("depth") == 3,
         what="expired messages in the DLQ")
    dlq = ok(port, "GET", "/api/queues/ActiveMQ.DLQ/messages")["messages"]
    assert {m["headers"]["originalDestination"] for m in dlq} == \
        {"queue://jobs0", "queue://jobs1"}
    stray = ok(port, "POST", "/api/destinations/queue/ActiveMQ.DLQ/send", {"body": "x"},
               201)["message_id"]  # never dead-lettered: no original destination
    assert ok(port, "GET", "/api/destinations/queue/ActiveMQ.DLQ")["dead_lettered"] == 0
    assert ok(port, "GET", "/api/destinations/queue/jobs0")["dead_lettered"] == 2
    assert ok(port, "POST", "/api/queues/ActiveMQ.DLQ/retry", {"selector": "n = '2'"}) == \
        {"retried": 1, "skipped": 0}
    assert ok(port, "POST", "/api/queues/ActiveMQ.DLQ/retry") == {"retried": 2, "skipped": 1}
    assert all_ids(port, "ActiveMQ.DLQ") == [stray]
    assert depth(port, "jobs0") == 2 and depth(port, "jobs1") == 1
    back = ok(port, "GET", "/api/queues/jobs0/messages")["messages"]
    assert all("dlqDeliveryFailureCause" not in m["headers"]
               and "originalDestination" not in m["headers"] for m in back)


def test_create_inspect_list_and_delete_destinations(broker: ThreadBroker) -> None:
    port = broker.management_port
    made = ok(port, "POST", "/api/destinations", {"type": "queue", "name": "orders/eu"}, 201)
    fields = {"type", "name", "depth", "enqueued", "dequeued", "dispatched", "expired",
              "dead_lettered", "in_flight", "consumers", "producers", "memory_bytes",
              "store_bytes", "enqueue_rate", "dequeue_rate"}
    assert set(made) == fields and (made["name"], made["depth"]) == ("orders/eu", 0)
    status, body = call(port, "POST", "/api/destinations", {"type": "queue",
                                                            "name": "orders/eu"})
    assert status == 409 and "already exists" in body["error"]
    ok(port, "POST", "/api/destinations", {"type": "topic", "name": "news"}, 201)
    send(port, "orders/eu", 15)
    got = ok(port, "GET", f"/api/destinations/queue/{q('orders/eu')}")
    assert got["depth"] == 15 and got["store_bytes"] > 0 and got["enqueued"] == 15
    queues = ok(port, "GET", "/api/destinations?type=queue")["destinations"]
    assert [d["name"] for d in queues] == ["orders/eu"]
    assert [d["name"] for d in ok(port, "GET", "/api/destinations?filter=ew")
            ["destinations"]] == ["news"]
    assert ok(port, "DELETE", f"/api/destinations/queue/{q('orders/eu')}") == \
        {"deleted": "orders/eu", "messages": 15}
    assert ok(port, "DELETE", "/api/destinations/topic/news") == {"deleted": "news",
                                                                   "messages": 0}
    for path in (f"/api/destinations/queue/{q('orders/eu')}", "/api/destinations/topic/news"):
        status, body = call(port, "GET", path)
        assert status == 404 and body["error"]
    for bad, why in (({"type": "stack", "name": "x"}, "queue or topic"),
                     ({"type": "queue"}, "'name'"), ({"type": "queue", "name": "a..b"},
                                                    "empty segment")):
        status, body = call(port, "POST", "/api/destinations", bad)
        assert status == 400 and why in body["error"], body
    status, body = call(port, "GET", "/api/destinations?type=stack")
    assert status == 400


def test_a_queue_with_consumers_is_not_deleted(broker: ThreadBroker) -> None:
    port = broker.management_port
    with SimpleStompClient("127.0.0.1", broker.port) as c:
        c.subscribe("/queue/held")
        status, body = call(port, "DELETE", "/api/destinations/queue/held")
        assert status == 409 and "consumer" in body["error"]


def test_rates_follow_the_traffic(broker: ThreadBroker) -> None:
    port = broker.management_port
    sent = 0

    def rate() -> float:  # sends on while the broker samples its counters
        nonlocal sent
        sent += len(send(port, "busy", 5, persistent=False))
        return float(ok(port, "GET", "/api/destinations/queue/busy")["enqueue_rate"])
    assert 0 < poll(rate, what="a sampled enqueue rate") <= sent
    assert ok(port, "GET", "/api/destinations/queue/busy")["dequeue_rate"] == 0


def test_only_admins_change_destinations(broker_factory: Callable[..., ThreadBroker]) -> None:
    users = AuthConfig(users=(User("admin", "s3cret", ("admins",)),
                              User("bob", "bobpw", ("users",))))
    broker = broker_factory(auth=users, management=ManagementConfig(host="127.0.0.1", port=0))
    port = broker.management_port
    bob: dict[str, Any] = {"user": "bob", "password": "bobpw"}
    admin: dict[str, Any] = {"user": "admin", "password": "s3cret"}
    ok(port, "POST", "/api/destinations", {"type": "queue", "name": "q1"}, 201, **admin)
    for method, path, body in (
            ("POST", "/api/destinations", {"type": "queue", "name": "q2"}),
            ("POST", "/api/destinations/queue/q1/send", {"body": "x"}),
            ("POST", "/api/destinations/queue/q1/purge", None),
            ("DELETE", "/api/destinations/queue/q1", None),
            ("POST", "/api/queues/q1/move", {"to": "queue://q3"}),
            ("POST", "/api/queues/q1/retry", None),
            ("DELETE", "/api/queues/q1/messages/ID:x", None)):
        status, answer = call(port, method, path, body, **bob)
        assert status == 403 and "admins" in answer["error"], (method, path)
    assert ok(port, "GET", "/api/destinations", **bob)["destinations"][0]["name"] == "q1"
    assert ok(port, "GET", "/api/queues/q1/messages", **bob)["total"] == 0


def test_a_returned_message_is_listed_once_and_flagged_redelivered(
        broker: ThreadBroker) -> None:
    port = broker.management_port
    ids = send(port, "back", 3)
    with SimpleStompClient("127.0.0.1", broker.port) as consumer:
        consumer.subscribe("/queue/back", ack="client-individual",
                           headers={"activemq.prefetchSize": "1"})
        assert consumer.receive(10) is not None
        poll(lambda: ok(port, "GET", "/api/queues/back/messages")["messages"][-1]["in_flight"])
    # The consumer closed without acknowledging: its message is back in the queue.
    def waiting() -> list[dict[str, Any]] | None:
        listed = ok(port, "GET", "/api/queues/back/messages")["messages"]
        return listed if not any(m["in_flight"] for m in listed) else None
    listed = poll(waiting, what="the unacknowledged message back in the queue")
    assert listed is not None
    assert [m["message_id"] for m in listed] == ids
    assert [m["redelivered"] for m in listed] == [True, False, False]
