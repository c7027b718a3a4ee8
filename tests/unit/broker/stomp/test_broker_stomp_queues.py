"""Queue semantics and topics, without sockets."""

from __future__ import annotations

import pytest
from tests.support.raw_stomp import uid

# ------------------------------------------------------------------ competing consumers


def test_competing_consumers_round_robin(broker, client):
    producer, c1, c2, c3 = client(), client(), client(), client()
    q = f"/queue/{uid('rr')}"
    for c in (c1, c2, c3):
        c.subscribe(q)
    for i in range(12):
        producer.send(q, str(i))
    broker.wait_for(lambda: sum(len(c.messages) for c in (c1, c2, c3)) == 12, what="12 messages")
    got = [[int(b) for b in c.bodies()] for c in (c1, c2, c3)]
    assert sorted(n for g in got for n in g) == list(range(12))  # each exactly once
    assert [len(g) for g in got] == [4, 4, 4]
    # strict rotation: each consumer gets every third message
    assert sorted({g[0] % 3 for g in got}) == [0, 1, 2]
    for g in got:
        assert all(n % 3 == g[0] % 3 for n in g)


def test_each_message_delivered_once_across_consumers(broker, client):
    producer = client()
    consumers = [client() for _ in range(4)]
    q = f"/queue/{uid('once')}"
    for c in consumers:
        c.subscribe(q, ack="client-individual", headers={"activemq.prefetchSize": "3"})
    for i in range(40):
        producer.send(q, str(i), receipt=(i == 39))

    def drain() -> int:
        for c in consumers:
            for m in c.messages:
                if m.headers["message-id"] not in acked:
                    acked.add(m.headers["message-id"])
                    c.ack(m, receipt=False)  # inside the wait: no nested wait
        return len(acked) == 40

    acked: set[str] = set()
    broker.wait_for(drain, what="all 40 messages to be consumed")
    bodies = sorted(int(b) for c in consumers for b in c.bodies())
    assert bodies == list(range(40))


def test_consumer_priority_wins_then_falls_back(broker, client):
    producer, low, high = client(), client(), client()
    q = f"/queue/{uid('cp')}"
    low.subscribe(q, headers={"activemq.priority": "0"})
    high.subscribe(q, ack="client-individual",
                   headers={"activemq.priority": "9", "activemq.prefetchSize": "2"})
    for i in range(5):
        producer.send(q, str(i))
    high.wait_messages(2)
    low.wait_messages(3)
    assert high.bodies() == ["0", "1"]  # the high-priority consumer is served first
    assert low.bodies() == ["2", "3", "4"]  # the rest spill over once it is full


def test_round_robin_only_within_highest_priority(broker, client):
    producer, low, h1, h2 = client(), client(), client(), client()
    q = f"/queue/{uid('cp2')}"
    low.subscribe(q, headers={"activemq.priority": "1"})
    h1.subscribe(q, headers={"activemq.priority": "5"})
    h2.subscribe(q, headers={"activemq.priority": "5"})
    for i in range(6):
        producer.send(q, str(i))
    h1.wait_messages(3)
    h2.wait_messages(3)
    low.barrier()
    assert low.messages == []


def test_ordering_per_producer(broker, client):
    p1, p2, consumer = client(), client(), client()
    q = f"/queue/{uid('order')}"
    consumer.subscribe(q)
    for i in range(30):
        p1.conn.send(q, f"p1-{i}")
        p2.conn.send(q, f"p2-{i}")
    p1.barrier()
    p2.barrier()
    consumer.wait_messages(60)
    for p in ("p1", "p2"):
        nums = [int(b.split("-")[1]) for b in consumer.bodies() if b.startswith(p)]
        assert nums == list(range(30))


# ------------------------------------------------------------------ redelivery


@pytest.mark.parametrize("version", ["1.1", "1.2"])
def test_nack_redelivers_with_flag_and_count(broker, client, version):
    producer, consumer = client(), client(version)
    q = f"/queue/{uid('nack')}"
    consumer.subscribe(q, "s", ack="client-individual")
    producer.send(q, "again")
    (first,) = consumer.wait_messages(1)
    consumer.nack(first)
    second = consumer.wait_messages(2)[1]
    assert second.body == "again"
    assert second.headers["redelivered"] == "true"
    assert second.headers.get("JMSXDeliveryCount") == "2"
    consumer.ack(second)
    producer.send(q, "marker")
    consumer.wait_messages(3)
    consumer.barrier()
    assert consumer.bodies() == ["again", "again", "marker"]


def test_unacked_messages_redelivered_on_disconnect(broker, client):
    producer, c1 = client(), client()
    q = f"/queue/{uid('lost')}"
    c1.subscribe(q, ack="client")
    for i in range(3):
        producer.send(q, str(i))
    c1.wait_messages(3)
    c1.ack(c1.messages[0])  # cumulative: only "0" is consumed
    c1.disconnect()
    c2 = client()
    c2.subscribe(q)
    msgs = c2.wait_messages(2)
    assert [m.body for m in msgs] == ["1", "2"]
    assert all(m.headers["redelivered"] == "true" for m in msgs)
    producer.send(q, "marker")
    c2.wait_messages(3)
    c2.barrier()
    assert c2.bodies() == ["1", "2", "marker"]


def test_unacked_messages_redelivered_on_unsubscribe(broker, client):
    producer, c1 = client(), client()
    q = f"/queue/{uid('unsub')}"
    c1.subscribe(q, "s", ack="client-individual")
    producer.send(q, "x")
    c1.wait_messages(1)
    c1.unsubscribe("s")
    c1.subscribe(q, "s2")
    (again,) = c1.wait_messages(2)[1:]
    assert again.body == "x"
    assert again.headers["redelivered"] == "true"


def test_dead_letter_queue_after_six_redeliveries(broker, client):
    producer, consumer, dlq = client(), client(), client()
    name = uid("poison")
    q = f"/queue/{name}"
    dlq.subscribe("/queue/ActiveMQ.DLQ",
                  headers={"selector": f"JMSDestination = 'queue://{name}'"})
    consumer.subscribe(q, ack="client-individual")
    producer.send(q, "poison", {"persistent": "true", "x-app": "kept"})
    for n in range(1, 8):
        msgs = consumer.wait_messages(n)
        m = msgs[n - 1]
        assert m.body == "poison"
        assert (m.headers.get("redelivered") == "true") == (n > 1)
        consumer.nack(m)
    (dead,) = dlq.wait_messages(1)
    assert dead.body == "poison"
    assert dead.headers["original-destination"] == q
    assert dead.headers["destination"] == "/queue/ActiveMQ.DLQ"
    assert dead.headers["persistent"] == "true"
    assert dead.headers["x-app"] == "kept"
    assert dead.headers.get("dlqDeliveryFailureCause")
    # exactly 7 deliveries, and nothing more on the original queue
    producer.send(q, "marker")
    consumer.wait_messages(8)
    consumer.barrier()
    assert consumer.bodies() == ["poison"] * 7 + ["marker"]
    assert broker.destination_stats(name)["depth"] == 1  # only the unacked marker


def test_dead_letter_on_repeated_consumer_loss(broker, client):
    producer, dlq = client(), client()
    name = uid("crashy")
    q = f"/queue/{name}"
    dlq.subscribe("/queue/ActiveMQ.DLQ",
                  headers={"selector": f"JMSDestination = 'queue://{name}'"})
    producer.send(q, "boom", {"persistent": "true"})
    for _ in range(7):
        c = client()
        c.subscribe(q, ack="client-individual")
        c.wait_messages(1)
        c.disconnect()
    (dead,) = dlq.wait_messages(1)
    assert dead.body == "boom"
    assert dead.headers["original-destination"] == q


def test_exclusive_consumer_failover(broker, client):
    producer, first, second = client(), client(), client()
    q = f"/queue/{uid('exfo')}"
    first.subscribe(q, "x1", headers={"activemq.exclusive": "true"})
    second.subscribe(q, "x2", headers={"activemq.exclusive": "true"})
    for i in range(3):
        producer.send(q, f"a{i}")
    first.wait_messages(3)
    second.barrier()
    assert second.messages == []
    first.disconnect()
    for i in range(3):
        producer.send(q, f"b{i}")
    second.wait_messages(3)
    assert second.bodies() == ["b0", "b1", "b2"]


def test_exclusive_consumer_failover_redelivers_unacked(broker, client):
    producer, first, second = client(), client(), client()
    q = f"/queue/{uid('exfo2')}"
    first.subscribe(q, ack="client-individual", headers={"activemq.exclusive": "true"})
    second.subscribe(q, headers={"activemq.exclusive": "true"})
    producer.send(q, "held")
    first.wait_messages(1)
    first.disconnect()
    (m,) = second.wait_messages(1)
    assert m.body == "held"
    assert m.headers["redelivered"] == "true"


def test_queue_depth_and_counts(broker, client):
    producer, consumer = client(), client()
    name = uid("depth")
    for i in range(5):
        producer.send(f"/queue/{name}", str(i))
    assert broker.destination_stats(name)["depth"] == 5
    consumer.subscribe(f"/queue/{name}")
    consumer.wait_messages(5)
    broker.wait_for(lambda: broker.destination_stats(name)["depth"] == 0, what="the queue to drain")
    assert broker.destination_stats(name)["dequeued"] == 5


# ------------------------------------------------------------------ topics


def test_topic_fan_out_to_every_subscriber(broker, client):
    producer = client()
    subs = [client(v) for v in ("1.0", "1.1", "1.2")]
    t = f"/topic/{uid('fan')}"
    for s in subs:
        s.subscribe(t)
    for i in range(5):
        producer.send(t, str(i))
    for s in subs:
        s.wait_messages(5)
        assert s.bodies() == ["0", "1", "2", "3", "4"]


def test_unsubscribed_topic_consumer_gets_nothing(broker, client):
    producer, stays, leaves = client(), client(), client()
    t = f"/topic/{uid('unsub')}"
    stays.subscribe(t)
    leaves.subscribe(t, "gone")
    producer.send(t, "first")
    leaves.wait_messages(1)
    leaves.unsubscribe("gone")
    producer.send(t, "second")
    stays.wait_messages(2)
    leaves.barrier()
    assert leaves.bodies() == ["first"]
    assert stays.bodies() == ["first", "second"]


def test_same_connection_two_subscriptions_both_receive(broker, client):
    producer, c = client(), client()
    t = f"/topic/{uid('two')}"
    c.subscribe(t, "a")
    c.subscribe(t, "b")
    producer.send(t, "x")
    msgs = c.wait_messages(2)
    assert sorted(m.headers["subscription"] for m in msgs) == ["a", "b"]


def test_durable_topic_keeps_persistent_messages_and_resumes_order(broker, client):
    cid = uid("dcid-")
    t = f"/topic/{uid('dur')}"
    producer = client()
    s = client(client_id=cid)
    s.subscribe(t, "d", ack="client-individual",
                headers={"activemq.subscriptionName": "keep"})
    producer.send(t, "a", {"persistent": "true"})
    (a,) = s.wait_messages(1)
    s.disconnect()  # "a" unacked: it comes back with the redelivered flag
    broker.wait_for(lambda: not broker.stats()["durable_subscriptions"][0]["active"],
         what="the subscription to go offline")
    producer.send(t, "b", {"persistent": "true"})
    producer.send(t, "c", {"persistent": "true"})
    assert broker.stats()["durable_subscriptions"][0]["pending"] == 3
    s2 = client(client_id=cid)
    s2.subscribe(t, "d", headers={"activemq.subscriptionName": "keep"})
    msgs = s2.wait_messages(3)
    assert [m.body for m in msgs] == ["a", "b", "c"]
    assert msgs[0].headers["redelivered"] == "true"
    assert a.headers["message-id"] == msgs[0].headers["message-id"]


def test_durable_subscription_can_be_active_only_once(broker, client):
    cid = uid("once-")
    t = f"/topic/{uid('d1')}"
    s = client(client_id=cid)
    s.subscribe(t, "d", headers={"activemq.subscriptionName": "n"})
    s.conn.subscribe(t, "d2", headers={"activemq.subscriptionName": "n"})
    err = s.listener.wait_error()
    assert "already active" in err.headers["message"]


def test_non_durable_topic_subscriber_misses_offline_messages(broker, client):
    producer = client()
    t = f"/topic/{uid('nd')}"
    s = client()
    s.subscribe(t, "a")
    s.disconnect()
    producer.send(t, "missed")
    s2 = client()
    s2.subscribe(t, "a")
    producer.send(t, "marker")
    s2.wait_messages(1)
    s2.barrier()
    assert s2.bodies() == ["marker"]


def test_cumulative_nack_in_client_mode(broker, client):
    producer, consumer = client(), client("1.1")
    q = f"/queue/{uid('cnack')}"
    consumer.subscribe(q, "s", ack="client")
    for i in range(3):
        producer.send(q, str(i))
    msgs = consumer.wait_messages(3)
    consumer.nack(msgs[1])  # client mode: NACKs "0" and "1", keeps "2" pending ack
    again = consumer.wait_messages(5)[3:]
    assert sorted(m.body for m in again) == ["0", "1"]
    assert all(m.headers["redelivered"] == "true" for m in again)
    consumer.barrier()
    assert len(consumer.messages) == 5


def test_ack_with_wrong_subscription_11(broker, client, raw):
    producer = client()
    q = f"/queue/{uid('wsub')}"
    r = raw()
    r.connect("1.1")
    r.send_frame("SUBSCRIBE", [("destination", q), ("id", "a"), ("ack", "client"),
                               ("receipt", "s")])
    r.read_until_receipt("s")
    producer.send(q, "m")
    msg = r.read_frame()
    r.send_frame("ACK", [("message-id", "not-" + msg["message-id"]), ("subscription", "a")])
    err = r.expect_error_and_close()
    assert "not-" in err["message"]


def test_topic_transaction_abort_and_commit(broker, client):
    producer, sub = client(), client()
    t = f"/topic/{uid('ttx')}"
    sub.subscribe(t)
    producer.begin("a")
    producer.conn.send(t, "aborted", headers={"transaction": "a"})
    producer.abort("a")
    producer.begin("c")
    producer.conn.send(t, "committed", headers={"transaction": "c"})
    producer.commit("c")
    sub.wait_messages(1)
    sub.barrier()
    assert sub.bodies() == ["committed"]


def test_composite_send_in_transaction(broker, client):
    producer, qc, tc = client(), client(), client()
    q, t = uid("ctq"), uid("ctt")
    qc.subscribe(f"/queue/{q}")
    tc.subscribe(f"/topic/{t}")
    producer.begin("tx")
    producer.conn.send(f"/queue/{q},/topic/{t}", "both", headers={"transaction": "tx"})
    producer.send(f"/queue/{q}", "marker")
    qc.wait_messages(1)
    assert qc.bodies() == ["marker"]
    producer.commit("tx")
    qc.wait_messages(2)
    tc.wait_messages(1)
    assert qc.bodies() == ["marker", "both"]
    assert tc.bodies() == ["both"]


def test_offline_durable_removed_without_resubscribing(broker, client):
    cid = uid("drm-")
    t = f"/topic/{uid('drm')}"
    s = client(client_id=cid)
    s.subscribe(t, "d", headers={"activemq.subscriptionName": "old"})
    s.disconnect()
    broker.wait_for(lambda: not broker.stats()["durable_subscriptions"][0]["active"],
         what="the subscription to go offline")
    back = client(client_id=cid)
    back.unsubscribe("d", headers={"activemq.subscriptionName": "old"})
    assert broker.stats()["durable_subscriptions"] == []


def test_pipelined_burst_arrives_complete_and_in_order(broker, client, raw):
    consumer = client()
    q = f"/queue/{uid('burst')}"
    consumer.subscribe(q)
    r = raw()
    r.connect("1.2")
    n = 3000
    payload = b"".join(
        b"SEND\ndestination:" + q.encode() + b"\ncontent-length:%d\n\n%d\x00" % (len(b"%d" % i), i)
        for i in range(n))
    r.send_bytes(payload)
    r.receipt_roundtrip()
    msgs = consumer.wait_messages(n)
    assert [int(m.body) for m in msgs] == list(range(n))


def test_large_message_round_trip(broker, client):
    producer, consumer = client(), client(auto_decode=False)
    q = f"/queue/{uid('large')}"
    consumer.subscribe(q)
    body = bytes(range(256)) * 8192  # 2 MiB, every byte value
    producer.send(q, body)
    (m,) = consumer.wait_messages(1)
    assert m.body == body
