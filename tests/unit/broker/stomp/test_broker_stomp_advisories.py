"""Advisory topics in ActiveMQ's names."""

from __future__ import annotations

from tests.support.raw_stomp import uid


def _advisories(c, n):
    return [m.headers for m in c.wait_messages(n)]


def test_consumer_advisory_for_queue(broker, client):
    watcher, consumer = client(), client(client_id=uid("adv-cid-"))
    name = uid("advq")
    watcher.subscribe(f"/topic/ActiveMQ.Advisory.Consumer.Queue.{name}")
    sub = consumer.subscribe(f"/queue/{name}", "s1", headers={"selector": "a = 'b'"})
    (added,) = _advisories(watcher, 1)
    assert added["advisoryType"] == "ConsumerAdded"
    assert added["consumerCount"] == "1"
    assert added["consumerId"]
    assert added["destination"] == f"queue://{name}" or name in added["destination"]
    assert added["selector"] == "a = 'b'"
    assert added["clientId"].startswith("adv-cid-")
    assert added["destination"] and added["connectionId"]
    other = client()
    other.subscribe(f"/queue/{name}", "s2")
    second = _advisories(watcher, 2)[1]
    assert second["advisoryType"] == "ConsumerAdded"
    assert second["consumerCount"] == "2"
    assert second["consumerId"] != added["consumerId"]
    consumer.unsubscribe(sub)
    removed = _advisories(watcher, 3)[2]
    assert removed["advisoryType"] == "ConsumerRemoved"
    assert removed["consumerId"] == added["consumerId"]
    assert removed["consumerCount"] == "1"


def test_consumer_advisory_for_topic(broker, client):
    watcher, consumer = client(), client()
    name = uid("advt")
    watcher.subscribe(f"/topic/ActiveMQ.Advisory.Consumer.Topic.{name}")
    consumer.subscribe(f"/topic/{name}", "t1")
    (added,) = _advisories(watcher, 1)
    assert added["advisoryType"] == "ConsumerAdded"
    assert added["consumerCount"] == "1"
    consumer.disconnect()
    removed = _advisories(watcher, 2)[1]
    assert removed["advisoryType"] == "ConsumerRemoved"
    assert removed["consumerCount"] == "0"


def test_consumer_advisory_wildcard_watch(broker, client):
    watcher, consumer = client(), client()
    a, b = uid("wa"), uid("wb")
    watcher.subscribe("/topic/ActiveMQ.Advisory.Consumer.Queue.>")
    consumer.subscribe(f"/queue/{a}")
    consumer.subscribe(f"/queue/{b}")
    msgs = watcher.wait_messages(2)
    dests = [m.headers["destination"] for m in msgs]
    assert dests == [f"/topic/ActiveMQ.Advisory.Consumer.Queue.{a}",
                     f"/topic/ActiveMQ.Advisory.Consumer.Queue.{b}"]


def test_connection_advisory(broker, client):
    watcher = client()
    watcher.subscribe("/topic/ActiveMQ.Advisory.Connection")
    cid = uid("conn-adv-")
    other = client(client_id=cid)
    (added,) = _advisories(watcher, 1)
    assert added["advisoryType"] == "ConnectionAdded"
    assert added["clientId"] == cid
    assert added["connectionId"]
    other.disconnect()
    removed = _advisories(watcher, 2)[1]
    assert removed["advisoryType"] == "ConnectionRemoved"
    assert removed["connectionId"] == added["connectionId"]


def test_producer_advisory(broker, client):
    watcher, producer = client(), client()
    name = uid("advp")
    watcher.subscribe(f"/topic/ActiveMQ.Advisory.Producer.Queue.{name}")
    producer.send(f"/queue/{name}", "x")
    producer.send(f"/queue/{name}", "y")  # one producer: one advisory
    (added,) = _advisories(watcher, 1)
    assert added["advisoryType"] == "ProducerAdded"
    assert added["producerCount"] == "1"
    producer.disconnect()
    removed = _advisories(watcher, 2)[1]
    assert removed["advisoryType"] == "ProducerRemoved"


def test_temp_queue_and_temp_topic_advisories(broker, client):
    watcher, user = client(), client()
    watcher.subscribe("/topic/ActiveMQ.Advisory.TempQueue")
    watcher.subscribe("/topic/ActiveMQ.Advisory.TempTopic")
    user.subscribe("/temp-queue/r")
    user.subscribe("/temp-topic/e")
    msgs = watcher.wait_messages(2)
    assert [m.headers["advisoryType"] for m in msgs] == ["TempDestinationAdded"] * 2
    assert [m.headers["destination"] for m in msgs] == [
        "/topic/ActiveMQ.Advisory.TempQueue", "/topic/ActiveMQ.Advisory.TempTopic"]
    user.disconnect()
    gone = watcher.wait_messages(4)[2:]
    assert sorted(m.headers["advisoryType"] for m in gone) == ["TempDestinationRemoved"] * 2


def test_advisory_message_shape(broker, client):
    watcher, consumer = client(), client()
    name = uid("shape")
    watcher.subscribe(f"/topic/ActiveMQ.Advisory.Consumer.Queue.{name}")
    consumer.subscribe(f"/queue/{name}")
    (m,) = watcher.wait_messages(1)
    assert m.headers["type"] == "Advisory"
    assert m.headers["message-id"]
    assert m.headers["originBrokerName"] == "test"
    assert '"advisoryType": "ConsumerAdded"' in m.body


def test_no_advisory_for_advisory_consumers(broker, client):
    w1, w2 = client(), client()
    w1.subscribe("/topic/ActiveMQ.Advisory.Consumer.Topic.>")
    w2.subscribe("/topic/ActiveMQ.Advisory.Connection")  # advisory topic: no advisory
    name = uid("real")
    w2.subscribe(f"/topic/{name}")
    (m,) = w1.wait_messages(1)
    assert m.headers["destination"] == f"/topic/ActiveMQ.Advisory.Consumer.Topic.{name}"
