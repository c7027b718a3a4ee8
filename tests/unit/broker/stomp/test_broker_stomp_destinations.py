"""ActiveMQ destinations, message headers and subscription headers."""

from __future__ import annotations

import time

import pytest
from tests.support.raw_stomp import uid

from meshmq.config.model import DestinationPolicy

# ------------------------------------------------------------------ destination kinds


def test_queue_point_to_point(broker, client):
    producer, consumer = client(), client()
    q = f"/queue/{uid('p2p')}"
    producer.send(q, "before-subscribe")  # queues keep messages for later consumers
    consumer.subscribe(q)
    (m,) = consumer.wait_messages(1)
    assert m.body == "before-subscribe"
    assert m.headers["destination"] == q


def test_topic_is_not_retroactive(broker, client):
    producer, consumer = client(), client()
    t = f"/topic/{uid('t')}"
    producer.send(t, "nobody listening")
    consumer.subscribe(t)
    producer.send(t, "live")
    consumer.wait_messages(1)
    consumer.barrier()
    assert consumer.bodies() == ["live"]
    assert consumer.messages[0].headers["destination"] == t


def test_temp_queue_request_reply(broker, client):
    requester, replier = client(), client()
    service = f"/queue/{uid('svc')}"
    replier.subscribe(service, "svc")
    requester.subscribe("/temp-queue/replies", "replies")
    requester.send(service, "what time is it?",
                   {"reply-to": "/temp-queue/replies", "correlation-id": "req-1"})
    (req,) = replier.wait_messages(1)
    reply_to = req.headers["reply-to"]
    assert reply_to != "/temp-queue/replies"  # another connection sees the global name
    assert req.headers["correlation-id"] == "req-1"
    replier.send(reply_to, "noon", {"correlation-id": req.headers["correlation-id"]})
    (rep,) = requester.wait_messages(1)
    assert rep.body == "noon"
    assert rep.headers["correlation-id"] == "req-1"
    # the owner sees its own name for the temporary queue
    assert rep.headers["destination"] == "/temp-queue/replies"


def test_temp_queue_disappears_with_its_connection(broker, client, raw):
    owner, other = client(), client()
    service = f"/queue/{uid('svc')}"
    other.subscribe(service)
    owner.subscribe("/temp-queue/r", "r")
    owner.send(service, "req", {"reply-to": "/temp-queue/r"})
    (req,) = other.wait_messages(1)
    owner.disconnect()
    broker.wait_for(lambda: broker.stats()["connections"] == 1, what="the owner to be gone")
    r = raw()
    r.connect("1.2")
    r.send_frame("SEND", [("destination", req.headers["reply-to"]), ("receipt", "x")], b"late")
    err = r.expect_error_and_close()
    assert "does not exist" in err["message"]


def test_temp_topic(broker, client):
    owner, other = client(), client()
    service = f"/queue/{uid('svc')}"
    other.subscribe(service)
    owner.subscribe("/temp-topic/events", "ev")
    owner.send("/temp-topic/events", "from owner")
    owner.send(service, "tell me", {"reply-to": "/temp-topic/events"})
    (req,) = other.wait_messages(1)
    assert "temp-topic" in req.headers["reply-to"]
    other.send(req.headers["reply-to"], "from other")
    msgs = owner.wait_messages(2)
    assert [m.body for m in msgs] == ["from owner", "from other"]
    assert all(m.headers["destination"] == "/temp-topic/events" for m in msgs)


def test_temp_destinations_are_private_names(broker, client):
    # The same local name on two connections is two different destinations.
    a, b = client(), client()
    a.subscribe("/temp-queue/x", "a")
    b.subscribe("/temp-queue/x", "b")
    a.send("/temp-queue/x", "for a")
    b.send("/temp-queue/x", "for b")
    a.wait_messages(1)
    b.wait_messages(1)
    a.barrier()
    b.barrier()
    assert a.bodies() == ["for a"]
    assert b.bodies() == ["for b"]


# ------------------------------------------------------------------ wildcards and composites


def test_topic_wildcards(broker, client):
    star, gt, exact, producer = client(), client(), client(), client()
    base = uid("prices")
    star.subscribe(f"/topic/{base}.*")
    gt.subscribe(f"/topic/{base}.>")
    exact.subscribe(f"/topic/{base}.stock.ibm")
    for name in ("stock", "stock.ibm", "bond.x.y"):
        producer.send(f"/topic/{base}.{name}", name)
    producer.send(f"/topic/{base}", "root")  # '>' needs at least one more segment
    producer.send(f"/topic/{base}.end", "end")
    star.wait_messages(2)
    gt.wait_messages(4)
    exact.wait_messages(1)
    for c in (star, gt, exact):
        c.barrier()
    assert star.bodies() == ["stock", "end"]
    assert gt.bodies() == ["stock", "stock.ibm", "bond.x.y", "end"]
    assert exact.bodies() == ["stock.ibm"]
    assert gt.messages[1].headers["destination"] == f"/topic/{base}.stock.ibm"


def test_queue_wildcard_consumer_sees_existing_and_new_queues(broker, client):
    producer, consumer = client(), client()
    base = uid("orders")
    producer.send(f"/queue/{base}.us", "us")  # this queue exists before the subscription
    consumer.subscribe(f"/queue/{base}.*")
    (first,) = consumer.wait_messages(1)
    assert first.headers["destination"] == f"/queue/{base}.us"
    producer.send(f"/queue/{base}.eu", "eu")  # a queue created after the subscription
    producer.send(f"/queue/{base}.eu.north", "too deep")
    producer.send(f"/queue/{base}.us", "marker")
    msgs = consumer.wait_messages(3)
    consumer.barrier()
    assert [m.body for m in consumer.messages] == ["us", "eu", "marker"]
    assert msgs[1].headers["destination"] == f"/queue/{base}.eu"


def test_composite_send_to_queue_and_topic(broker, client):
    producer, qc, tc = client(), client(), client()
    q, t = uid("cq"), uid("ct")
    qc.subscribe(f"/queue/{q}")
    tc.subscribe(f"/topic/{t}")
    producer.send(f"/queue/{q},/topic/{t}", "both", {"k": "v"})
    (qm,) = qc.wait_messages(1)
    (tm,) = tc.wait_messages(1)
    assert qm.body == tm.body == "both"
    assert qm.headers["destination"] == f"/queue/{q}"
    assert tm.headers["destination"] == f"/topic/{t}"
    assert qm.headers["k"] == tm.headers["k"] == "v"


def test_composite_without_repeated_prefix(broker, client):
    producer, consumer = client(), client()
    a, b = uid("ca"), uid("cb")
    consumer.subscribe(f"/queue/{a},{b}")  # composite subscription; prefix inherited
    producer.send(f"/queue/{a}", "a")
    producer.send(f"/queue/{b}", "b")
    consumer.wait_messages(2)
    assert sorted(consumer.bodies()) == ["a", "b"]


# ------------------------------------------------------------------ message headers


def test_standard_and_user_headers(broker, client):
    producer, consumer = client(), client()
    q = f"/queue/{uid('hdr')}"
    consumer.subscribe(q)
    before = int(time.time() * 1000)
    producer.send(q, "payload", {
        "persistent": "true", "priority": "7", "correlation-id": "corr-9",
        "reply-to": "/queue/answers", "type": "order", "x-custom": "custom value",
        "JMSXGroupID": "g1", "content-type": "text/plain"})
    after = int(time.time() * 1000)
    (m,) = consumer.wait_messages(1)
    h = m.headers
    assert h["message-id"]
    assert before - 1000 <= int(h["timestamp"]) <= after + 1000
    assert h["persistent"] == "true"
    assert h["priority"] == "7"
    assert h["correlation-id"] == "corr-9"
    assert h["reply-to"] == "/queue/answers"
    assert h["type"] == "order"
    assert h["x-custom"] == "custom value"
    assert h["JMSXGroupID"] == "g1"
    assert h["content-type"].startswith("text/plain")
    assert h["expires"] == "0"
    assert "redelivered" not in h or h["redelivered"] == "false"


def test_message_ids_are_unique(broker, client):
    producer, consumer = client(), client()
    q = f"/queue/{uid('ids')}"
    consumer.subscribe(q)
    for i in range(20):
        producer.send(q, str(i))
    msgs = consumer.wait_messages(20)
    assert len({m.headers["message-id"] for m in msgs}) == 20


def test_non_persistent_has_no_persistent_true(broker, client):
    producer, consumer = client(), client()
    q = f"/queue/{uid('np')}"
    consumer.subscribe(q)
    producer.send(q, "x")
    (m,) = consumer.wait_messages(1)
    assert m.headers.get("persistent", "false") != "true"


_PRIO_SENT = [("a", 1), ("b", 9), ("c", 4), ("d", 9), ("e", 0), ("f", 4), ("g", 7)]


def test_priority_ordering_with_prioritized_messages(broker_factory, client):
    b = broker_factory(policies=(
        DestinationPolicy(match="queue://>", prioritized_messages=True),
        DestinationPolicy(match="topic://>")))
    producer, consumer = client(on=b), client(on=b)
    q = f"/queue/{uid('prio')}"
    for body, prio in _PRIO_SENT:
        producer.send(q, body, {"priority": prio})
    consumer.subscribe(q)
    consumer.wait_messages(len(_PRIO_SENT))
    # highest priority first, FIFO within one priority
    assert consumer.bodies() == ["b", "d", "g", "c", "f", "a", "e"]
    assert [m.headers["priority"] for m in consumer.messages] == \
        ["9", "9", "7", "4", "4", "1", "0"]


def test_priority_is_fifo_by_default(broker, client):
    # ActiveMQ's default (prioritizedMessages=false): priority is carried, order is FIFO
    producer, consumer = client(), client()
    q = f"/queue/{uid('prio')}"
    for body, prio in _PRIO_SENT:
        producer.send(q, body, {"priority": prio})
    consumer.subscribe(q)
    consumer.wait_messages(len(_PRIO_SENT))
    assert consumer.bodies() == [body for body, _ in _PRIO_SENT]
    assert [m.headers["priority"] for m in consumer.messages] == \
        [str(p) for _, p in _PRIO_SENT]


def test_expired_messages_are_never_delivered(broker, client):
    producer, consumer = client(), client()
    q = f"/queue/{uid('exp')}"
    now = int(time.time() * 1000)
    producer.send(q, "already expired", {"expires": now - 60_000})
    soon = int(time.time() * 1000) + 150
    producer.send(q, "expires soon", {"expires": soon})
    producer.send(q, "lives", {"expires": now + 3_600_000})
    broker.wait_for(lambda: time.time() * 1000 > soon + 50, what="the short expiry to pass")
    consumer.subscribe(q)
    producer.send(q, "marker")
    consumer.wait_messages(2)
    consumer.barrier()
    assert consumer.bodies() == ["lives", "marker"]


def test_expired_persistent_message_goes_to_dlq(broker, client):
    producer, consumer = client(), client()
    q = uid("expdlq")
    producer.send(f"/queue/{q}", "dead", {"expires": int(time.time() * 1000) - 1000,
                                          "persistent": "true"})
    consumer.subscribe(f"/queue/{q}")  # triggers the dispatch that finds it expired
    dlq = client()
    dlq.subscribe("/queue/ActiveMQ.DLQ", headers={"selector": f"JMSDestination = 'queue://{q}'"})
    (m,) = dlq.wait_messages(1)
    assert m.body == "dead"
    assert m.headers["original-destination"] == f"/queue/{q}"
    consumer.barrier()
    assert consumer.messages == []


def test_message_groups_are_sticky(broker, client):
    c1, c2, producer = client(), client(), client()
    q = f"/queue/{uid('grp')}"
    c1.subscribe(q, "c1")
    c2.subscribe(q, "c2")
    groups = ["A", "B", "C", "D"]
    for i in range(24):
        producer.send(q, f"{groups[i % 4]}-{i}", {"JMSXGroupID": groups[i % 4]})
    broker.wait_for(lambda: len(c1.messages) + len(c2.messages) == 24, what="all 24 messages")
    owners: dict[str, set[str]] = {}
    for name, c in (("c1", c1), ("c2", c2)):
        for m in c.messages:
            owners.setdefault(m.headers["JMSXGroupID"], set()).add(name)
    assert all(len(v) == 1 for v in owners.values()), owners
    assert {next(iter(v)) for v in owners.values()} == {"c1", "c2"}  # groups are spread
    # per group, order is preserved
    for c in (c1, c2):
        for g in groups:
            nums = [int(m.body.split("-")[1]) for m in c.messages
                    if m.headers["JMSXGroupID"] == g]
            assert nums == sorted(nums)


def test_message_group_moves_when_owner_leaves(broker, client):
    c1, producer = client(), client()
    q = f"/queue/{uid('grp2')}"
    c1.subscribe(q, "c1")
    producer.send(q, "1", {"JMSXGroupID": "G"})
    c1.wait_messages(1)
    c2 = client()
    c2.subscribe(q, "c2")
    producer.send(q, "2", {"JMSXGroupID": "G"})
    c1.wait_messages(2)  # still the owner
    c2.barrier()
    assert c2.messages == []
    c1.disconnect()
    producer.send(q, "3", {"JMSXGroupID": "G"})
    (m,) = c2.wait_messages(1)
    assert m.body == "3"


def test_redelivered_flag_after_nack(broker, client):
    producer, consumer = client(), client()
    q = f"/queue/{uid('redel')}"
    consumer.subscribe(q, ack="client-individual")
    producer.send(q, "x")
    (first,) = consumer.wait_messages(1)
    assert first.headers.get("redelivered", "false") == "false"
    consumer.nack(first)
    second = consumer.wait_messages(2)[1]
    assert second.headers["redelivered"] == "true"
    assert second.headers["message-id"] == first.headers["message-id"]


# ------------------------------------------------------------------ selectors

_SELECTOR_MESSAGES = [
    ("m1", {"color": "red", "weight": "5", "name": "ab_x", "priority": "4", "type": "order"}),
    ("m2", {"color": "green", "weight": "15", "name": "abcx", "priority": "8",
            "persistent": "true"}),
    ("m3", {"color": "blue", "weight": "25", "name": "ab_", "priority": "2",
            "correlation-id": "corr-3"}),
    ("m4", {"weight": "12", "priority": "9", "type": "order"}),
]


@pytest.mark.parametrize(("selector", "expected"), [
    ("color = 'red'", ["m1"]),
    ("color <> 'red'", ["m2", "m3"]),
    ("JMSPriority > 6", ["m2", "m4"]),
    ("JMSPriority >= 4 AND JMSPriority <= 8", ["m1", "m2"]),
    ("weight BETWEEN 10 AND 20", ["m2", "m4"]),
    ("weight NOT BETWEEN 10 AND 20", ["m1", "m3"]),
    ("color IN ('red', 'green')", ["m1", "m2"]),
    ("color NOT IN ('red', 'green')", ["m3"]),
    ("name LIKE 'ab!_%' ESCAPE '!'", ["m1", "m3"]),
    ("name LIKE 'ab_x'", ["m1", "m2"]),
    ("color IS NULL", ["m4"]),
    ("color IS NOT NULL", ["m1", "m2", "m3"]),
    ("NOT (color = 'red') AND weight * 2 > 30", ["m3"]),
    ("weight + 5 >= 20 OR color = 'red'", ["m1", "m2", "m3"]),
    ("weight / 5 = 3 OR weight - 20 = 5", ["m2", "m3"]),
    ("JMSType = 'order' AND weight < 10", ["m1"]),
    ("JMSCorrelationID = 'corr-3'", ["m3"]),
    ("JMSDeliveryMode = 'PERSISTENT'", ["m2"]),
    ("(color = 'red' OR color = 'blue') AND NOT weight > 20", ["m1"]),
])
def test_selector_on_queue(broker, client, selector, expected):
    producer, consumer = client(), client()
    q = f"/queue/{uid('sel')}"
    consumer.subscribe(q, headers={"selector": f"({selector}) OR marker = 'yes'"})
    for body, headers in _SELECTOR_MESSAGES:
        producer.send(q, body, headers)
    producer.send(q, "marker", {"marker": "yes", "priority": "0"})
    consumer.listener.wait(lambda: "marker" in consumer.listener.bodies(), what="the marker")
    consumer.barrier()
    assert sorted(consumer.bodies()) == sorted([*expected, "marker"])


def test_selector_on_topic(broker, client):
    producer, consumer = client(), client()
    t = f"/topic/{uid('selt')}"
    consumer.subscribe(t, headers={"selector": "region = 'eu' OR JMSPriority = 9"})
    producer.send(t, "us", {"region": "us"})
    producer.send(t, "eu", {"region": "eu"})
    producer.send(t, "urgent-us", {"region": "us", "priority": "9"})
    producer.send(t, "eu2", {"region": "eu"})
    consumer.wait_messages(3)
    consumer.barrier()
    assert consumer.bodies() == ["eu", "urgent-us", "eu2"]


def test_non_matching_messages_stay_on_queue(broker, client):
    producer, picky, other = client(), client(), client()
    q = f"/queue/{uid('selq')}"
    picky.subscribe(q, headers={"selector": "kind = 'a'"})
    producer.send(q, "b1", {"kind": "b"})
    producer.send(q, "a1", {"kind": "a"})
    picky.wait_messages(1)
    other.subscribe(q)
    (m,) = other.wait_messages(1)
    assert m.body == "b1"
    assert picky.bodies() == ["a1"]


# ------------------------------------------------------------------ consumer options


def test_prefetch_limits_unacked_messages(broker, client):
    producer, consumer = client(), client()
    q = f"/queue/{uid('pf')}"
    for i in range(6):
        producer.send(q, str(i))
    consumer.subscribe(q, ack="client-individual", headers={"activemq.prefetchSize": "2"})
    consumer.wait_messages(2)
    consumer.barrier()
    assert consumer.bodies() == ["0", "1"]
    consumer.ack(consumer.messages[0])
    consumer.wait_messages(3)
    consumer.barrier()
    assert consumer.bodies() == ["0", "1", "2"]
    for m in consumer.messages[1:3]:
        consumer.ack(m)
    consumer.wait_messages(5)
    consumer.barrier()
    assert consumer.bodies() == ["0", "1", "2", "3", "4"]


def test_prefetch_with_cumulative_client_ack(broker, client):
    producer, consumer = client(), client()
    q = f"/queue/{uid('pfc')}"
    for i in range(5):
        producer.send(q, str(i))
    consumer.subscribe(q, ack="client", headers={"activemq.prefetchSize": "3"})
    consumer.wait_messages(3)
    consumer.barrier()
    assert len(consumer.messages) == 3
    consumer.ack(consumer.messages[2])  # acks 0..2
    consumer.wait_messages(5)
    assert consumer.bodies() == ["0", "1", "2", "3", "4"]


def test_prefetch_one_spreads_work_across_consumers(broker, client):
    producer, c1, c2 = client(), client(), client()
    q = f"/queue/{uid('pf1')}"
    c1.subscribe(q, ack="client-individual", headers={"activemq.prefetchSize": "1"})
    c2.subscribe(q, ack="client-individual", headers={"activemq.prefetchSize": "1"})
    for i in range(4):
        producer.send(q, str(i))
    c1.wait_messages(1)
    c2.wait_messages(1)
    c1.barrier()
    c2.barrier()
    assert len(c1.messages) == len(c2.messages) == 1
    c1.ack(c1.messages[0])
    c1.wait_messages(2)
    c2.barrier()
    assert len(c2.messages) == 1


def test_exclusive_consumer_gets_everything(broker, client):
    producer, first, second = client(), client(), client()
    q = f"/queue/{uid('excl')}"
    first.subscribe(q, headers={"activemq.exclusive": "true"})
    second.subscribe(q, headers={"activemq.exclusive": "true"})
    for i in range(6):
        producer.send(q, str(i))
    first.wait_messages(6)
    second.barrier()
    assert second.messages == []


def test_consumer_priority_header(broker, client):
    producer, low, high = client(), client(), client()
    q = f"/queue/{uid('cprio')}"
    low.subscribe(q, headers={"activemq.priority": "1"})
    high.subscribe(q, headers={"activemq.priority": "10"})
    for i in range(5):
        producer.send(q, str(i))
    high.wait_messages(5)
    low.barrier()
    assert low.messages == []


# ------------------------------------------------------------------ durable subscriptions


def test_durable_subscription_receives_while_offline(broker, client):
    cid = uid("dur-client-")
    t = f"/topic/{uid('news')}"
    producer = client()
    sub = client(client_id=cid)
    sub.subscribe(t, "d", headers={"activemq.subscriptionName": "news-sub"})
    producer.send(t, "online", {"persistent": "true"})
    sub.wait_messages(1)
    sub.disconnect()
    broker.wait_for(lambda: not broker.stats()["durable_subscriptions"][0]["active"],
         what="the durable subscription to go offline")
    for i in range(3):
        producer.send(t, f"offline-{i}", {"persistent": "true"})
    back = client(client_id=cid)
    back.subscribe(t, "d", headers={"activemq.subscriptionName": "news-sub"})
    back.wait_messages(3)
    assert back.bodies() == ["offline-0", "offline-1", "offline-2"]


def test_durable_subscription_removed_by_unsubscribe(broker, client):
    cid = uid("dur-client-")
    t = f"/topic/{uid('news')}"
    producer = client()
    sub = client(client_id=cid)
    sub.subscribe(t, "d", headers={"activemq.subscriptionName": "gone"})
    sub.unsubscribe("d", headers={"activemq.subscriptionName": "gone"})
    assert broker.stats()["durable_subscriptions"] == []
    sub.disconnect()
    producer.send(t, "nobody keeps this", {"persistent": "true"})
    back = client(client_id=cid)
    back.subscribe(t, "d", headers={"activemq.subscriptionName": "gone"})
    producer.send(t, "marker", {"persistent": "true"})
    back.wait_messages(1)
    back.barrier()
    assert back.bodies() == ["marker"]


def test_durable_subscription_needs_client_id(broker, client):
    c = client()
    c.conn.subscribe(f"/topic/{uid('t')}", "d",
                     headers={"activemq.subscriptionName": "x"})
    err = c.listener.wait_error()
    assert "client-id" in err.headers["message"]


def test_duplicate_client_id_is_refused(broker, client):
    cid = uid("dup-")
    client(client_id=cid)
    second = client(client_id=cid, connect=False)
    second.connect(wait=False)
    err = second.listener.wait_error()
    assert cid in err.headers["message"]


# ------------------------------------------------------------------ browsing


def test_browser_sees_without_consuming(broker, client):
    producer, browser, consumer = client(), client(), client()
    q = f"/queue/{uid('browse')}"
    for i in range(3):
        producer.send(q, f"m{i}")
    browser.subscribe(q, "b", headers={"browser": "true"})
    msgs = browser.wait_messages(4)
    assert [m.body for m in msgs[:3]] == ["m0", "m1", "m2"]
    assert msgs[3].headers["browser"] == "end"
    assert all(m.headers.get("browser") != "end" for m in msgs[:3])
    # a live message sent after browsing is not delivered to the browser
    producer.send(q, "m3")
    consumer.subscribe(q)
    consumer.wait_messages(4)
    assert consumer.bodies() == ["m0", "m1", "m2", "m3"]
    browser.barrier()
    assert len(browser.messages) == 4


def test_browser_on_empty_queue_gets_only_end(broker, client):
    browser = client()
    q = f"/queue/{uid('browse0')}"
    browser.subscribe(q, "b", headers={"browser": "true"})
    (end,) = browser.wait_messages(1)
    assert end.headers["browser"] == "end"
    assert end.headers["subscription"] == "b"


def test_browser_with_selector(broker, client):
    producer, browser = client(), client()
    q = f"/queue/{uid('bsel')}"
    for i in range(4):
        producer.send(q, str(i), {"even": "yes" if i % 2 == 0 else "no"})
    browser.subscribe(q, "b", headers={"browser": "true", "selector": "even = 'yes'"})
    msgs = browser.wait_messages(3)
    assert [m.body for m in msgs[:2]] == ["0", "2"]
    assert msgs[2].headers["browser"] == "end"


def test_no_local_topic_subscription(broker, client):
    me, other = client(), client()
    t = f"/topic/{uid('nolocal')}"
    me.subscribe(t, headers={"activemq.noLocal": "true"})
    me.send(t, "mine")
    other.send(t, "theirs")
    me.wait_messages(1)
    me.barrier()
    assert me.bodies() == ["theirs"]


def test_durable_subscription_with_selector_filters_offline_messages(broker, client):
    cid = uid("dsel-")
    t = f"/topic/{uid('dsel')}"
    producer = client()
    s = client(client_id=cid)
    s.subscribe(t, "d", headers={"activemq.subscriptionName": "s",
                                 "selector": "level = 'high'"})
    s.disconnect()
    broker.wait_for(lambda: not broker.stats()["durable_subscriptions"][0]["active"],
         what="the subscription to go offline")
    producer.send(t, "low", {"level": "low", "persistent": "true"})
    producer.send(t, "high", {"level": "high", "persistent": "true"})
    s2 = client(client_id=cid)
    s2.subscribe(t, "d", headers={"activemq.subscriptionName": "s",
                                  "selector": "level = 'high'"})
    producer.send(t, "high2", {"level": "high", "persistent": "true"})
    s2.wait_messages(2)
    s2.barrier()
    assert s2.bodies() == ["high", "high2"]


def test_selector_on_jms_redelivered_and_delivery_count(broker, client):
    producer, first = client(), client()
    q = f"/queue/{uid('rsel')}"
    first.subscribe(q, "f", ack="client-individual")
    producer.send(q, "x")
    (m,) = first.wait_messages(1)
    first.unsubscribe("f")  # releases the message: now redelivered
    retry = client()
    retry.subscribe(q, headers={"selector": "JMSRedelivered = TRUE AND JMSXDeliveryCount >= 2"})
    (again,) = retry.wait_messages(1)
    assert again.headers["message-id"] == m.headers["message-id"]
