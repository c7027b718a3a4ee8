"""MQTT $SYS statistics after messages flow, read by an MQTT subscriber of the
in-memory broker (no sockets). Their figures are the ones /api/stat and /metrics
report: "messages received" counts the operator's destinations, not $SYS itself."""

from __future__ import annotations

from tests.support.memory_broker import MemoryBroker, MqttClient, memory_broker

from meshmq.protocol.mqtt.packets import Publish, Suback, Subscribe, SubscriptionOptions

SYS_NAMES = {"version", "uptime", "clients/connected", "messages/received",
             "messages/sent", "store/messages/count", "heap/current"}


def _sys_reader(broker: MemoryBroker) -> MqttClient:
    reader = broker.mqtt()
    reader.connect("sys-reader")
    reader.send(Subscribe(packet_id=1, subscriptions=[("$SYS/#", SubscriptionOptions())]))
    reader.expect(Suback)
    return reader


def _read_sys(broker: MemoryBroker, reader: MqttClient) -> dict[str, bytes]:
    """Publish the $SYS values once; what the subscriber got, by name."""
    broker.runtime.sys_topics.publish()
    got: dict[str, bytes] = {}
    while set(got) != SYS_NAMES:
        packet = reader.expect(Publish)
        assert packet.topic.startswith("$SYS/broker/"), packet.topic
        got[packet.topic.removeprefix("$SYS/broker/")] = packet.payload
    return got


def _sent_and_consumed(broker: MemoryBroker, sent: int, consumed: int) -> None:
    producer = broker.stomp()
    producer.connect()
    for n in range(sent):
        producer.send("SEND", {"destination": "/queue/orders", "receipt": f"r{n}"},
                      b"order")
        producer.expect("RECEIPT")
    consumer = broker.stomp()
    consumer.connect()
    consumer.send("SUBSCRIBE", {"id": "1", "destination": "/queue/orders",
                                "ack": "client-individual", "activemq.prefetchSize":
                                str(consumed)})
    for _ in range(consumed):
        consumer.expect("MESSAGE")


def test_sys_values_count_the_messages_that_flowed() -> None:
    with memory_broker() as broker:
        reader = _sys_reader(broker)
        _sent_and_consumed(broker, sent=3, consumed=2)
        values = _read_sys(broker, reader)
        assert values["messages/received"] == b"3"
        assert values["messages/sent"] == b"2"
        assert values["store/messages/count"] == b"3"  # unacknowledged: still queued
        assert values["clients/connected"] == b"3"
        assert values["version"].startswith(b"meshmq ")
        assert int(values["heap/current"]) > 0


def test_sys_publications_are_not_counted_as_messages_received() -> None:
    with memory_broker() as broker:
        reader = _sys_reader(broker)
        _sent_and_consumed(broker, sent=1, consumed=1)
        first = _read_sys(broker, reader)
        second = _read_sys(broker, reader)
        assert first["messages/received"] == second["messages/received"] == b"1"


def test_sys_messages_received_is_the_metrics_enqueued_total() -> None:
    with memory_broker() as broker:
        reader = _sys_reader(broker)
        _sent_and_consumed(broker, sent=4, consumed=1)
        stat = broker.runtime.statistics()
        enqueued = sum(int(d["enqueued"]) for d in stat["destinations"])  # type: ignore[attr-defined]
        assert _read_sys(broker, reader)["messages/received"] == str(enqueued).encode()


def test_the_publisher_repeats_on_its_interval_until_stopped() -> None:
    with memory_broker() as broker:
        reader = _sys_reader(broker)
        topics = broker.runtime.sys_topics
        topics.interval_ms = 20
        topics.start(broker.loop)

        def rounds() -> int:
            return sum(1 for p in reader.received()
                       if isinstance(p, Publish) and p.topic == "$SYS/broker/version")

        broker.wait_for(lambda: rounds() >= 2, what="two $SYS rounds")
        topics.stop()
        after_stop = rounds()
        # Five intervals of loop time pass with no further round.
        until = broker.loop.time() + 5 * topics.interval_ms / 1000
        broker.wait_for(lambda: broker.loop.time() > until, what="five intervals")
        assert rounds() == after_stop


def test_a_node_sums_its_shards_reports_with_its_own_uptime() -> None:
    from meshmq.management.sys_topics import node_figures, values_of

    reports = [{"uptime_ms": 900, "clients": 2, "received": 3, "sent": 1, "stored": 2,
                "heap": 10},
               {"uptime_ms": 800, "clients": 1, "received": 5, "sent": 4, "stored": 1,
                "heap": 20, "ignored": "x"}]
    node = node_figures(reports, uptime_ms=12_345)
    assert node == {"uptime_ms": 12_345, "clients": 3, "received": 8, "sent": 5,
                    "stored": 3, "heap": 30}
    values = values_of(node)
    assert values["uptime"] == "12 seconds" and values["messages/received"] == "8"
    assert values["clients/connected"] == "3"


def test_a_shard_of_a_node_reports_its_figures_instead_of_publishing_them() -> None:
    from meshmq.management.sys_topics import FIGURES

    with memory_broker() as broker:
        reader = _sys_reader(broker)
        _sent_and_consumed(broker, sent=2, consumed=0)
        sys_topics = broker.runtime.sys_topics
        reports: list[dict[str, int]] = []
        sys_topics.report, sys_topics.own = reports.append, False
        sys_topics.publish_node(dict.fromkeys(FIGURES, 1))  # not started: nothing
        sys_topics.start(broker.loop)  # reports at once, publishes nothing of its own
        assert reports[-1]["received"] == 2 and reports[-1]["clients"] == 3
        # What the node hands it is published.
        sys_topics.publish_node({**reports[-1], "received": 7})
        sys_topics.stop()
        got = {}
        while "messages/received" not in got:
            packet = reader.expect(Publish)
            got[packet.topic.removeprefix("$SYS/broker/")] = packet.payload
        assert got["messages/received"] == b"7"
