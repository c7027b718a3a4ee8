"""The destinations and messages routes of the admin API, called through the real
application without a socket: listing, creating, deleting and purging destinations,
browsing with paging and selectors, viewing, deleting, moving and retrying messages,
and who may change anything."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from tests.management.http import q
from tests.support.memory_broker import StompClient, memory_config
from tests.support.memory_management import MemoryManagement, memory_management

from meshmq.config.model import AuthConfig, DestinationPolicy, User
from meshmq.protocol.stomp.frames import Frame

# A small page size: most of a test queue lives only in the store (paged out).
SMALL_PAGES = (DestinationPolicy(match="queue://>", page_size=10),)


@pytest.fixture
def api() -> Iterator[MemoryManagement]:
    with memory_management(memory_config(persistent=True, policies=SMALL_PAGES)) as api:
        yield api


def send(api: MemoryManagement, queue: str, count: int, persistent: bool = True,
         headers: Callable[[int], dict[str, Any]] | None = None) -> list[str]:
    return [api.ok("POST", f"/api/destinations/queue/{q(queue)}/send",
                   {"body": f"m{i}", "headers": headers(i) if headers else {},
                    "persistent": persistent}, 201)["message_id"] for i in range(count)]


def depth(api: MemoryManagement, queue: str) -> int:
    return int(api.ok("GET", f"/api/destinations/queue/{q(queue)}")["depth"])


def stomp(api: MemoryManagement) -> StompClient:
    """A STOMP 1.0 client (its frames read back without header escaping)."""
    client = api.broker.stomp()
    assert client.connect("1.0").command == "CONNECTED"
    return client


def subscribe(client: StompClient, destination: str, **headers: str) -> None:
    client.send("SUBSCRIBE", {"destination": destination, "id": destination, **headers})


def ack(client: StompClient, frame: Frame) -> None:
    client.send("ACK", {"message-id": frame.get("message-id") or ""})


def test_browse_pages_through_memory_and_store_with_a_selector(api: MemoryManagement) -> None:
    ids = send(api, "work", 30, headers=lambda i: {"n": i,
                                                   "color": "red" if i % 2 else "blue"})
    first = api.ok("GET", "/api/queues/work/messages?limit=10")
    assert (first["total"], first["offset"], first["limit"]) == (30, 0, 10)
    assert [m["message_id"] for m in first["messages"]] == ids[:10]
    last = api.ok("GET", "/api/queues/work/messages?offset=25&limit=10")
    assert [m["message_id"] for m in last["messages"]] == ids[25:]
    assert api.all_ids("work") == ids  # paged-out messages come from the store
    m = first["messages"][3]
    assert m["headers"] == {"n": 3, "color": "red"} and m["persistent"] is True
    assert (m["body_preview"], m["size"], m["redelivered"]) == ("m3", 2, False)
    red = api.ok("GET", "/api/queues/work/messages?limit=5&offset=2&selector="
                 + q("color = 'red' AND n > 4"))
    assert red["total"] == 13  # n = 5, 7, ..., 29
    assert [m["headers"]["n"] for m in red["messages"]] == [9, 11, 13, 15, 17]
    status, body = api.call("GET", "/api/queues/work/messages?selector=" + q("color = = 1"))
    assert status == 400 and body["error"].startswith("invalid selector:")
    status, body = api.call("GET", "/api/queues/work/messages?limit=5000")
    assert status == 400 and "limit=5000" in body["error"]
    status, body = api.call("GET", "/api/queues/absent/messages")
    assert status == 404 and "absent" in body["error"]


def test_view_shows_utf8_and_binary_bodies(api: MemoryManagement) -> None:
    c = stomp(api)
    c.send("SEND", {"destination": "/queue/bodies", "persistent": "true"},
           "héllo ✓".encode())
    c.send("SEND", {"destination": "/queue/bodies", "persistent": "true"}, b"\x00\xff\xfebin")
    api.poll(lambda: len(api.all_ids("bodies")) == 2, what="both messages queued")
    text_id, bin_id = api.all_ids("bodies")
    text = api.ok("GET", f"/api/queues/bodies/messages/{q(text_id)}")
    assert (text["body"], text["body_encoding"], text["truncated"]) == \
        ("héllo ✓", "utf-8", False)
    binary = api.ok("GET", f"/api/queues/bodies/messages/{q(bin_id)}")
    assert (binary["body"], binary["body_encoding"]) == ("AP/+Ymlu", "base64")
    assert binary["size"] == 6
    status, body = api.call("GET", "/api/queues/bodies/messages/ID:nope")
    assert status == 404 and "ID:nope" in body["error"]
    status, body = api.call("GET", f"/api/queues/nothere/messages/{q(text_id)}")
    assert status == 404


def test_delete_and_purge_leave_messages_in_flight_to_their_consumer(
        api: MemoryManagement) -> None:
    ids = send(api, "busy", 25)
    consumer = stomp(api)
    subscribe(consumer, "/queue/busy", ack="client-individual",
              **{"activemq.prefetchSize": "1"})
    frame = consumer.expect("MESSAGE")
    assert frame.get("message-id") == ids[0]
    api.poll(
        lambda: api.ok("GET", "/api/destinations/queue/busy")["in_flight"] == 1)
    status, body = api.call("DELETE", f"/api/queues/busy/messages/{q(ids[0])}")
    assert status == 409 and "acknowledged" in body["error"]
    # One in memory, one paged out to the store.
    for victim in (ids[1], ids[20]):
        assert api.ok("DELETE", f"/api/queues/busy/messages/{q(victim)}") == \
            {"deleted": victim}
    assert depth(api, "busy") == 23
    assert api.ok("POST", "/api/destinations/queue/busy/purge") == {"purged": 22}
    assert api.all_ids("busy") == [ids[0]]
    ack(consumer, frame)
    api.poll(lambda: depth(api, "busy") == 0, what="the in-flight message acked")
    status, _ = api.call("DELETE", f"/api/queues/busy/messages/{q(ids[2])}")
    assert status == 404


def test_move_and_copy_by_selector_and_ids_to_queues_and_topics(
        api: MemoryManagement) -> None:
    ids = send(api, "src", 30, headers=lambda i: {"n": i})
    copied = api.ok("POST", "/api/queues/src/move", {"to": "queue://backup", "copy": True})
    assert copied == {"copied": 30}
    assert api.all_ids("backup") == ids and api.all_ids("src") == ids
    moved = api.ok("POST", "/api/queues/src/move", {"to": "queue://low", "selector": "n < 12"})
    assert moved == {"moved": 12}
    assert api.all_ids("low") == ids[:12] and api.all_ids("src") == ids[12:]
    picked = [ids[13], ids[29]]  # one in memory, one paged out
    assert api.ok("POST", "/api/queues/src/move",
                  {"to": "queue://low", "message_ids": picked}) == {"moved": 2}
    assert api.all_ids("low") == ids[:12] + picked
    listener = stomp(api)
    subscribe(listener, "/topic/fanout")
    assert api.ok("POST", "/api/queues/src/move",
                  {"to": "topic://fanout", "selector": "n >= 20"}) == {"moved": 9}
    got = [listener.expect("MESSAGE") for _ in range(9)]
    assert [f.get("message-id") for f in got] == [i for i in ids[20:] if i != ids[29]]
    assert depth(api, "src") == 30 - 12 - 2 - 9
    for bad, why in (({"to": "queue://src"}, "another"), ({"to": "nowhere"}, "queue://NAME"),
                     ({"to": "queue://a.*"}, "wildcard"), ({}, "'to'"),
                     ({"to": "queue://x", "message_ids": "ID:1"}, "message_ids"),
                     ({"to": "queue://x", "selector": "n <"}, "invalid selector")):
        status, body = api.call("POST", "/api/queues/src/move", bad)
        assert status == 400 and why in body["error"], (bad, body)
    status, _ = api.call("POST", "/api/queues/ghost/move", {"to": "queue://x"})
    assert status == 404


def test_retry_sends_dead_lettered_messages_back_where_they_came_from(
        api: MemoryManagement) -> None:
    expires = str(int(time.time() * 1000) + 50)
    c = stomp(api)
    for i in range(3):
        c.send("SEND", {"destination": f"/queue/jobs{i % 2}", "persistent": "true",
                        "expires": expires, "n": str(i)}, f"job{i}".encode())
    api.poll(
        lambda: api.call("GET", "/api/destinations/queue/ActiveMQ.DLQ")[1].get("depth") == 3,
        what="expired messages in the DLQ")
    dlq = api.ok("GET", "/api/queues/ActiveMQ.DLQ/messages")["messages"]
    assert {m["headers"]["originalDestination"] for m in dlq} == \
        {"queue://jobs0", "queue://jobs1"}
    stray = api.ok("POST", "/api/destinations/queue/ActiveMQ.DLQ/send", {"body": "x"},
                   201)["message_id"]  # never dead-lettered: no original destination
    assert api.ok("GET", "/api/destinations/queue/ActiveMQ.DLQ")["dead_lettered"] == 0
    assert api.ok("GET", "/api/destinations/queue/jobs0")["dead_lettered"] == 2
    assert api.ok("POST", "/api/queues/ActiveMQ.DLQ/retry", {"selector": "n = '2'"}) == \
        {"retried": 1, "skipped": 0}
    assert api.ok("POST", "/api/queues/ActiveMQ.DLQ/retry") == {"retried": 2, "skipped": 1}
    assert api.all_ids("ActiveMQ.DLQ") == [stray]
    assert depth(api, "jobs0") == 2 and depth(api, "jobs1") == 1
    back = api.ok("GET", "/api/queues/jobs0/messages")["messages"]
    assert all("dlqDeliveryFailureCause" not in m["headers"]
               and "originalDestination" not in m["headers"] for m in back)


def test_create_inspect_list_and_delete_destinations(api: MemoryManagement) -> None:
    made = api.ok("POST", "/api/destinations", {"type": "queue", "name": "orders/eu"}, 201)
    fields = {"type", "name", "depth", "enqueued", "dequeued", "dispatched", "expired",
              "dead_lettered", "in_flight", "consumers", "producers", "memory_bytes",
              "store_bytes", "enqueue_rate", "dequeue_rate"}
    assert set(made) == fields and (made["name"], made["depth"]) == ("orders/eu", 0)
    status, body = api.call("POST", "/api/destinations", {"type": "queue", "name": "orders/eu"})
    assert status == 409 and "already exists" in body["error"]
    api.ok("POST", "/api/destinations", {"type": "topic", "name": "news"}, 201)
    send(api, "orders/eu", 15)
    got = api.ok("GET", f"/api/destinations/queue/{q('orders/eu')}")
    assert got["depth"] == 15 and got["store_bytes"] > 0 and got["enqueued"] == 15
    queues = api.ok("GET", "/api/destinations?type=queue")["destinations"]
    assert [d["name"] for d in queues] == ["orders/eu"]
    assert [d["name"] for d in api.ok("GET", "/api/destinations?filter=ew")
            ["destinations"]] == ["news"]
    assert api.ok("DELETE", f"/api/destinations/queue/{q('orders/eu')}") == \
        {"deleted": "orders/eu", "messages": 15}
    assert api.ok("DELETE", "/api/destinations/topic/news") == {"deleted": "news",
                                                                 "messages": 0}
    for path in (f"/api/destinations/queue/{q('orders/eu')}", "/api/destinations/topic/news"):
        status, body = api.call("GET", path)
        assert status == 404 and body["error"]
    for bad, why in (({"type": "stack", "name": "x"}, "queue or topic"),
                     ({"type": "queue"}, "'name'"), ({"type": "queue", "name": "a..b"},
                                                    "empty segment")):
        status, body = api.call("POST", "/api/destinations", bad)
        assert status == 400 and why in body["error"], body
    status, body = api.call("GET", "/api/destinations?type=stack")
    assert status == 400


def test_a_queue_with_consumers_is_not_deleted(api: MemoryManagement) -> None:
    c = stomp(api)
    subscribe(c, "/queue/held")
    api.poll(lambda: api.ok("GET", "/api/destinations/queue/held")["consumers"] == 1)
    status, body = api.call("DELETE", "/api/destinations/queue/held")
    assert status == 409 and "consumer" in body["error"]


def test_rates_follow_the_traffic(api: MemoryManagement) -> None:
    sent = 0

    def rate() -> float:  # sends on while the broker samples its counters
        nonlocal sent
        sent += len(send(api, "busy", 5, persistent=False))
        return float(api.ok("GET", "/api/destinations/queue/busy")["enqueue_rate"])
    api.poll(lambda: rate() > 0, what="a sampled enqueue rate")
    assert 0 < float(api.ok("GET", "/api/destinations/queue/busy")["enqueue_rate"]) <= sent
    assert api.ok("GET", "/api/destinations/queue/busy")["dequeue_rate"] == 0


def test_only_admins_change_destinations() -> None:
    users = AuthConfig(users=(User("admin", "s3cret", ("admins",)),
                              User("bob", "bobpw", ("users",))))
    with memory_management(memory_config(persistent=True, auth=users)) as api:
        bob: dict[str, Any] = {"user": "bob", "password": "bobpw"}
        admin: dict[str, Any] = {"user": "admin", "password": "s3cret"}
        api.ok("POST", "/api/destinations", {"type": "queue", "name": "q1"}, 201, **admin)
        for method, path, body in (
                ("POST", "/api/destinations", {"type": "queue", "name": "q2"}),
                ("POST", "/api/destinations/queue/q1/send", {"body": "x"}),
                ("POST", "/api/destinations/queue/q1/purge", None),
                ("DELETE", "/api/destinations/queue/q1", None),
                ("POST", "/api/queues/q1/move", {"to": "queue://q3"}),
                ("POST", "/api/queues/q1/retry", None),
                ("DELETE", "/api/queues/q1/messages/ID:x", None)):
            status, answer = api.call(method, path, body, **bob)
            assert status == 403 and "admins" in answer["error"], (method, path)
        assert api.ok("GET", "/api/destinations", **bob)["destinations"][0]["name"] == "q1"
        assert api.ok("GET", "/api/queues/q1/messages", **bob)["total"] == 0


def test_a_returned_message_is_listed_once_and_flagged_redelivered(
        api: MemoryManagement) -> None:
    ids = send(api, "back", 3)
    consumer = stomp(api)
    subscribe(consumer, "/queue/back", ack="client-individual",
              **{"activemq.prefetchSize": "1"})
    consumer.expect("MESSAGE")
    api.poll(
        lambda: api.ok("GET", "/api/queues/back/messages")["messages"][-1]["in_flight"])
    consumer.send("DISCONNECT")
    consumer.wait_closed()
    # The consumer closed without acknowledging: its message is back in the queue.
    api.poll(lambda: not any(
        m["in_flight"] for m in api.ok("GET", "/api/queues/back/messages")["messages"]),
        what="the unacknowledged message back in the queue")
    listed = api.ok("GET", "/api/queues/back/messages")["messages"]
    assert [m["message_id"] for m in listed] == ids
    assert [m["redelivered"] for m in listed] == [True, False, False]


def test_a_subscribed_topic_exists_before_its_first_message(api: MemoryManagement) -> None:
    # As in ActiveMQ, a subscription makes its topic: operators see who listens on a
    # topic nobody has published to yet.
    listener = api.broker.stomp()
    listener.connect()
    listener.send("SUBSCRIBE", {"destination": "/topic/prices.eu", "id": "1",
                                "receipt": "r"})
    listener.expect("RECEIPT")
    wildcard = api.broker.stomp()
    wildcard.connect()
    wildcard.send("SUBSCRIBE", {"destination": "/topic/prices.>", "id": "1", "receipt": "r"})
    wildcard.expect("RECEIPT")
    view = api.ok("GET", "/api/destinations/topic/prices.eu")
    assert (view["consumers"], view["enqueued"]) == (2, 0)  # the wildcard matches it too
    names = [d["name"] for d in api.ok("GET", "/api/destinations?type=topic")["destinations"]]
    assert names == ["prices.eu"]  # a wildcard subscription names no topic
    assert api.call("DELETE", "/api/destinations/topic/prices.eu")[0] == 409
    listener.send("DISCONNECT")
    wildcard.send("DISCONNECT")
    api.poll(lambda: api.ok("GET", "/api/destinations/topic/prices.eu")["consumers"] == 0
             or None)
    api.ok("DELETE", "/api/destinations/topic/prices.eu")
    assert api.call("GET", "/api/destinations/topic/prices.eu")[0] == 404
