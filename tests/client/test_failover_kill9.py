"""Failover with real subprocess brokers, one killed with SIGKILL mid-stream.

A and B are two independent brokers (no shared store yet). A producer and a consumer
both use ``failover:(A,B)``. When A dies, both move to B; the messages A had stored
but not delivered are still in A's journal, so A is restarted afterwards and the
consumer (``priorityBackup``) moves back to it to drain them. Every confirmed
persistent message must reach the application exactly once: a copy that exists on
both brokers (stored on A, confirmation lost, re-sent to B) is dropped by the
consumer's duplicate filter.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from meshmq.client import Event, EventKind, FailoverClient, Message
from tests.client.conftest import mqtt_uri, stomp_uri, wait_for_event
from tests.client.test_client_features import run
from tests.support.brokers import ProcessBroker

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

TOTAL = 400
KILL_AFTER = 100


def test_stomp_queue_kill9_every_confirmed_message_received_once(
        process_brokers: Callable[[str], ProcessBroker]) -> None:
    a, b = process_brokers("a"), process_brokers("b")
    pair = f"{stomp_uri(a)},{stomp_uri(b)}"

    async def main() -> None:
        confirmed: list[str] = []
        received: list[str] = []
        markers: set[str] = set()
        marker_seen = asyncio.Event()
        consumer_events: list[Event] = []
        killed = asyncio.Event()
        held: list[Message] = []

        def on_message(msg: Message) -> None:
            if msg.text.startswith("marker"):
                markers.add(msg.text)
                marker_seen.set()
            else:
                received.append(msg.headers["dedup-id"])
            if killed.is_set():
                consumer.ack_later(msg)
            else:
                held.append(msg)  # acks held back: these acks are lost with A

        consumer = AckingConsumer(f"failover:({pair})?randomize=false&priorityBackup=true",
                                  consumer_events)
        await consumer.client.connect()
        await consumer.client.subscribe("/queue/orders", ack="client-individual",
                                        callback=on_message)
        producer = FailoverClient(f"failover:({pair})?randomize=false&timeout=60000")
        await producer.connect()
        for i in range(TOTAL):
            confirmed.append(await producer.send("/queue/orders", f"order {i}"))
            if len(confirmed) == KILL_AFTER:
                await asyncio.to_thread(a.kill9)
                killed.set()
                for msg in held:
                    consumer.ack_later(msg)  # too late: A is gone, the acks are dropped
        assert producer.endpoint is not None and producer.endpoint.port == b.ports["stomp"]
        # B is drained once the consumer sees a marker sent after everything else.
        await producer.send("/queue/orders", "marker b")
        async with asyncio.timeout(60):
            await marker_seen.wait()
        # Restart A: the consumer moves back (priorityBackup) and drains A's journal,
        # where the messages whose acks were lost come back as redeliveries.
        await asyncio.to_thread(process_brokers, "a")
        await wait_for_event(consumer_events, EventKind.RESUMED, count=2, timeout=60)
        async with FailoverClient(stomp_uri(a)) as direct:
            await direct.send("/queue/orders", "marker a")
        async with asyncio.timeout(60):
            while "marker a" not in markers or not set(confirmed) <= set(received):
                await asyncio.sleep(0.02)  # polled with a deadline
        await consumer.drain_acks()
        assert len(received) == len(set(received)), "a duplicate reached the application"
        assert set(received) == set(confirmed)
        stats = consumer.client.stats
        # Every message whose ack died with A came back from A and was dropped.
        assert held and stats["dropped_acks"] == len(held) == stats["duplicates"]
        assert consumer.client.endpoint is not None
        assert consumer.client.endpoint.port == a.ports["stomp"]
        await producer.close()
        await consumer.client.close()
    run(main())


class AckingConsumer:
    """Acks from the message callback without blocking delivery."""

    def __init__(self, uri: str, events: list[Event]) -> None:
        self.client = FailoverClient(uri, on_event=events.append)
        self.tasks: set[asyncio.Task[bool]] = set()

    def ack_later(self, msg: Message) -> None:
        task = asyncio.create_task(self.client.ack(msg))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def drain_acks(self) -> None:
        if self.tasks:
            await asyncio.gather(*self.tasks, return_exceptions=True)


def test_mqtt_topic_kill9_consumer_resubscribes_on_the_survivor(
        process_brokers: Callable[[str], ProcessBroker]) -> None:
    a, b = process_brokers("a"), process_brokers("b")
    pair = f"{mqtt_uri(a)},{mqtt_uri(b)}"

    async def main() -> None:
        events: list[Event] = []
        got: list[str] = []
        consumer = FailoverClient(f"failover:({pair})?randomize=false", client_id="c",
                                  on_event=events.append)
        await consumer.connect()
        await consumer.subscribe("plant/+/state", qos=1,
                                 callback=lambda m: got.append(m.headers["dedup-id"]))
        producer = FailoverClient(f"failover:({pair})?randomize=false&timeout=60000",
                                  client_id="p")
        await producer.connect()
        before = [await producer.send("plant/1/state", f"m{i}") for i in range(20)]
        async with asyncio.timeout(20):
            while not set(before) <= set(got):
                await asyncio.sleep(0.01)  # polled with a deadline
        await asyncio.to_thread(a.kill9)
        await wait_for_event(events, EventKind.RESUMED)
        after = [await producer.send("plant/1/state", f"n{i}") for i in range(20)]
        async with asyncio.timeout(20):
            while not set(after) <= set(got):
                await asyncio.sleep(0.01)  # polled with a deadline
        assert len(got) == len(set(got))
        assert consumer.endpoint is not None and consumer.endpoint.port == b.ports["mqtt"]
        await producer.close()
        await consumer.close()
    run(main())


def test_blocking_client_survives_a_kill9(process_brokers: Callable[[str], ProcessBroker]
                                          ) -> None:
    from meshmq.client import BlockingClient

    a, b = process_brokers("a"), process_brokers("b")
    uri = f"failover:({stomp_uri(a)},{stomp_uri(b)})?randomize=false&timeout=30000"
    with BlockingClient(uri) as consumer, BlockingClient(uri) as producer:
        sub = consumer.subscribe("/queue/blocking", ack="client-individual")
        producer.send("/queue/blocking", "before")
        first = sub.get(10)
        assert first.text == "before" and consumer.ack(first)
        a.kill9()
        producer.send("/queue/blocking", "after")  # blocks through the failover
        msg = sub.get(20)
        assert msg.text == "after" and consumer.ack(msg)
        assert producer.endpoint.port == b.ports["stomp"]
        assert consumer.stats["reconnects"] == 1
