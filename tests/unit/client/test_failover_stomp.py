"""The STOMP failover client against real brokers and scripted peers, without sockets:
which broker it picks, what it restores after a connection loss, redelivery, receipts,
resends with the same dedup-id, transactions, refusals and giving up."""

from __future__ import annotations

import re
from typing import Any

import pytest
from tests.support.memory_failover import (
    ClientDialer,
    Reaction,
    ScriptedStompPeer,
    kinds,
    run,
    until,
)
from tests.support.memory_network import MemoryNetwork

from meshmq.client import (
    AuthenticationFailedError,
    BrokerError,
    ClientClosedError,
    ClientError,
    ConnectionFailedError,
    Event,
    EventKind,
    FailoverClient,
    Message,
    OperationTimeoutError,
    TransactionInDoubtError,
    TransactionRolledBackError,
)
from meshmq.config.model import AuthConfig, User
from meshmq.protocol.stomp import Frame

AB = "failover:(stomp://a,stomp://b)?randomize=false&initialReconnectDelay=1"
A_ONLY = "failover:(stomp://a)?initialReconnectDelay=1"
PEER = "failover:(stomp://p)?initialReconnectDelay=1"


def client(dialer: ClientDialer, uri: str = AB, **kw: Any) -> FailoverClient:
    kw.setdefault("heartbeat_ms", (0, 0))
    return FailoverClient(uri, dialer=dialer, **kw)


def scripted(dialer: ClientDialer, script: Any = None) -> ScriptedStompPeer:
    peer = ScriptedStompPeer() if script is None else ScriptedStompPeer(script)
    dialer.peers["p"] = peer
    return peer


# ------------------------------------------------------------------ choosing brokers


def test_connects_to_the_first_broker_of_an_ordered_list(ab: MemoryNetwork,
                                                        dialer: ClientDialer) -> None:
    events: list[Event] = []

    async def main() -> None:
        async with client(dialer, on_event=events.append) as c:
            assert c.connected and c.endpoint is not None and c.endpoint.host == "a"
    run(ab, main())
    assert kinds(events) == [EventKind.CONNECTED] and events[0].endpoint is not None
    assert events[0].endpoint.host == "a" and dialer.dials == ["a"]


def test_a_broker_that_refuses_at_start_is_skipped(ab: MemoryNetwork,
                                                   dialer: ClientDialer) -> None:
    dialer.refuse("a")

    async def main() -> None:
        async with client(dialer) as c:
            assert c.endpoint is not None and c.endpoint.host == "b"
    run(ab, main())
    assert dialer.dials == ["a", "b"]


def test_an_operation_before_connect_connects(ab: MemoryNetwork,
                                              dialer: ClientDialer) -> None:
    async def main() -> None:
        c = client(dialer)
        try:
            assert not c.connected
            await c.send("/queue/lazy", "x")
            assert c.connected
        finally:
            await c.close()
    run(ab, main())
    assert ab.brokers["a"].queue_depth("lazy") == 1


def test_startup_attempts_bound_the_passes_over_the_list(network: MemoryNetwork,
                                                         dialer: ClientDialer) -> None:
    events: list[Event] = []

    async def main() -> None:
        c = client(dialer, AB + "&startupMaxReconnectAttempts=2", on_event=events.append)
        with pytest.raises(ConnectionFailedError, match="failover gave up"):
            await c.connect()
        await c.close()
    run(network, main())  # no broker a or b: every dial is refused
    assert dialer.dials == ["a", "b", "a", "b"]
    assert kinds(events) == [EventKind.FAILED]
    assert str(events[0].error) == "stomp://b:61613: connection refused"  # the last try


def test_the_failover_timeout_bounds_waiting_for_a_broker(ab: MemoryNetwork,
                                                          dialer: ClientDialer) -> None:
    dialer.refuse("a", "b")

    async def main() -> None:
        c = client(dialer, AB + "&timeout=30")
        with pytest.raises(OperationTimeoutError, match="not connected to any of "
                           "stomp://a:61613, stomp://b:61613 within the timeout"):
            await c.connect()
        with pytest.raises(OperationTimeoutError):
            await c.send("/queue/x", "y")
        assert not c.is_closed()  # still trying: a broker that comes up is used
        dialer.accept("b")
        await c.connect(timeout=5)
        assert c.endpoint is not None and c.endpoint.host == "b"
        await c.close()
    run(ab, main())


def test_connection_timeout_skips_a_broker_that_accepts_but_never_answers(
        ab: MemoryNetwork, dialer: ClientDialer) -> None:
    scripted(dialer, lambda frame, n: "silent")  # takes the connection, says nothing

    async def main() -> None:
        async with client(dialer, "failover:(stomp://p?connectionTimeout=20,stomp://b)"
                          "?randomize=false") as c:
            assert c.endpoint is not None and c.endpoint.host == "b"
    run(ab, main())
    assert dialer.dials == ["p", "b"] and dialer.connected_to("p") == 0


def test_priority_backup_moves_back_to_the_first_broker_when_it_returns(
        ab: MemoryNetwork, dialer: ClientDialer) -> None:
    events: list[Event] = []

    def on_event(event: Event) -> None:
        events.append(event)
        if event.kind is EventKind.RESUMED and event.endpoint is not None \
                and event.endpoint.host == "b":
            dialer.accept("a")  # the preferred broker is back

    async def main() -> None:
        async with client(dialer, AB + "&priorityBackup=true", on_event=on_event) as c:
            sub = await c.subscribe("/queue/pri")
            dialer.refuse("a")
            dialer.cut("a")
            await until(lambda: len(events) == 5, what="the move back to a")
            assert c.endpoint is not None and c.endpoint.host == "a"
            await c.send("/queue/pri", "home")
            assert (await sub.get(5)).text == "home"
    run(ab, main())
    assert [(e.kind, e.endpoint.host if e.endpoint else None) for e in events] == [
        (EventKind.CONNECTED, "a"), (EventKind.INTERRUPTED, "a"), (EventKind.RESUMED, "b"),
        (EventKind.INTERRUPTED, "b"), (EventKind.RESUMED, "a")]
    assert dialer.connected_to("b") == 0


def test_without_priority_backup_the_client_stays_where_it_is(
        ab: MemoryNetwork, dialer: ClientDialer) -> None:
    async def main() -> None:
        async with client(dialer) as c:
            dialer.refuse("a")
            dialer.cut("a")
            await until(lambda: c.connected and c.stats["reconnects"] == 1, what="b")
            dialer.accept("a")
            await c.send("/queue/stay", "x")
            assert c.endpoint is not None and c.endpoint.host == "b"
    run(ab, main())
    assert dialer.dials == ["a", "b"]


def test_a_backup_connection_is_kept_open_and_taken_over(network: MemoryNetwork,
                                                         dialer: ClientDialer) -> None:
    for name in "abc":
        network.add(name)
    network.start()

    async def main() -> None:
        async with client(dialer, "failover:(stomp://a,stomp://b,stomp://c)?randomize=false"
                          "&initialReconnectDelay=1&backup=true&backupPoolSize=1") as c:
            await until(lambda: c.backup_endpoints, what="a backup connection")
            assert [e.host for e in c.backup_endpoints] == ["b"]  # in list order
            sub = await c.subscribe("/queue/bk")
            dialer.refuse("a")  # a goes away
            dialer.cut("a")
            await c.send("/queue/bk", "after")
            assert (await sub.get(5)).text == "after"
            assert c.stats["backup_used"] == 1
            assert c.endpoint is not None and c.endpoint.host == "b"
            # The pool is refilled from the brokers left.
            await until(lambda: [e.host for e in c.backup_endpoints] == ["c"],
                        what="c as the new backup")
    run(network, main())
    assert dialer.dials == ["a", "b", "a", "c"]  # the failover itself dialed nothing


# ------------------------------------------------------------ sending and receiving


def test_a_send_carries_a_dedup_id_and_is_persistent_by_default(ab: MemoryNetwork,
                                                                dialer: ClientDialer) -> None:
    async def main() -> None:
        async with client(dialer) as c:
            sub = await c.subscribe("/queue/q")
            dedup = await c.send("/queue/q", "hello", {"color": "red"})
            msg = await sub.get(5)
            assert (msg.text, msg.headers["color"]) == ("hello", "red")
            assert msg.headers["dedup-id"] == dedup == msg.key
            assert msg.headers["persistent"] == "true"
            await c.send("/queue/q", "light", persistent=False, dedup_id="mine-1")
            light = await sub.get(5)
            assert "persistent" not in light.headers and light.key == "mine-1"
    run(ab, main())


def test_dedup_ids_are_unique_per_send(ab: MemoryNetwork, dialer: ClientDialer) -> None:
    async def main() -> None:
        async with client(dialer) as c:
            ids = [await c.send("/queue/ids", str(i)) for i in range(5)]
            assert len(set(ids)) == 5
    run(ab, main())


def test_a_callback_subscription_receives_instead_of_the_queue(
        ab: MemoryNetwork, dialer: ClientDialer) -> None:
    got: list[Message] = []

    async def main() -> None:
        async with client(dialer) as c:
            sub = await c.subscribe("/topic/cb", callback=got.append)
            await c.send("/topic/cb", "one")
            await until(lambda: got, what="the callback")
            assert sub.queue.empty()
    run(ab, main())
    assert [m.text for m in got] == ["one"] and got[0].subscription == "sub-1"


def test_a_failing_callback_does_not_stop_delivery(ab: MemoryNetwork,
                                                   dialer: ClientDialer) -> None:
    got: list[str] = []

    def callback(msg: Message) -> None:
        got.append(msg.text)
        if msg.text == "bad":
            raise RuntimeError("application bug")

    async def main() -> None:
        async with client(dialer) as c:
            await c.subscribe("/topic/cb", callback=callback)
            await c.send("/topic/cb", "bad")
            await c.send("/topic/cb", "good")
            await until(lambda: len(got) == 2, what="both messages")
    run(ab, main())
    assert got == ["bad", "good"]


def test_get_times_out_naming_the_destination(ab: MemoryNetwork,
                                              dialer: ClientDialer) -> None:
    async def main() -> None:
        async with client(dialer) as c:
            sub = await c.subscribe("/queue/empty")
            with pytest.raises(OperationTimeoutError, match=r"'/queue/empty' within 0\.01 s"):
                await sub.get(0.01)
    run(ab, main())


def test_subscription_ids_are_unique(ab: MemoryNetwork, dialer: ClientDialer) -> None:
    async def main() -> None:
        async with client(dialer) as c:
            await c.subscribe("/queue/x", id="mine")
            with pytest.raises(ClientError, match="'mine' is already in use"):
                await c.subscribe("/queue/y", id="mine")
    run(ab, main())


def test_a_durable_subscription_needs_a_client_id(ab: MemoryNetwork,
                                                  dialer: ClientDialer) -> None:
    async def main() -> None:
        async with client(dialer) as c:
            with pytest.raises(ClientError, match="client_id"):
                await c.subscribe("/topic/t", durable_name="d")
    run(ab, main())


def test_a_durable_subscription_keeps_messages_while_away(ab: MemoryNetwork,
                                                          dialer: ClientDialer) -> None:
    async def main() -> None:
        async with client(dialer, client_id="app-1") as c:
            sub = await c.subscribe("/topic/news", durable_name="news")
            await sub.unsubscribe()  # the subscription stays on the broker
        async with client(dialer) as p:
            await p.send("/topic/news", "while away")
        async with client(dialer, client_id="app-1") as c:
            sub = await c.subscribe("/topic/news", durable_name="news")
            assert (await sub.get(5)).text == "while away"
            await sub.unsubscribe(remove_durable=True)
        async with client(dialer) as p:
            await p.send("/topic/news", "gone")
        async with client(dialer, client_id="app-1") as c:
            sub = await c.subscribe("/topic/news", durable_name="news")
            with pytest.raises(OperationTimeoutError):
                await sub.get(0.05)
    run(ab, main())


# ----------------------------------------------------------------- connection loss


def test_subscriptions_are_restored_on_the_next_broker(ab: MemoryNetwork,
                                                       dialer: ClientDialer) -> None:
    events: list[Event] = []

    async def main() -> None:
        async with client(dialer, on_event=events.append) as c:
            sub = await c.subscribe("/topic/t")
            await c.send("/topic/t", "on a")
            assert (await sub.get(5)).text == "on a"
            dialer.refuse("a")
            dialer.cut("a")
            await c.send("/topic/t", "on b")  # waits for the failover, then confirms
            assert (await sub.get(5)).text == "on b"
            assert c.endpoint is not None and c.endpoint.host == "b"
            assert c.stats["reconnects"] == 1
    run(ab, main())
    assert kinds(events) == [EventKind.CONNECTED, EventKind.INTERRUPTED, EventKind.RESUMED]
    assert events[1].endpoint is not None and events[1].endpoint.host == "a"
    assert events[2].endpoint is not None and events[2].endpoint.host == "b"
    assert events[1].error is not None


def test_after_a_loss_the_lost_broker_is_tried_last(ab: MemoryNetwork,
                                                    dialer: ClientDialer) -> None:
    ab.add("c")
    ab.start()

    async def main() -> None:
        async with client(dialer, "failover:(stomp://a,stomp://b,stomp://c)?randomize=false"
                          "&initialReconnectDelay=1") as c:
            dialer.refuse("b")
            dialer.cut("a")
            await until(lambda: c.connected and c.endpoint is not None
                        and c.endpoint.host == "c", what="the move to c")
    run(ab, main())
    assert dialer.dials == ["a", "b", "c"]


def test_max_reconnect_attempts_bounds_the_passes_after_a_loss(
        ab: MemoryNetwork, dialer: ClientDialer) -> None:
    events: list[Event] = []

    async def main() -> None:
        async with client(dialer, AB + "&maxReconnectAttempts=2",
                          on_event=events.append) as c:
            dialer.refuse("a", "b")
            dialer.cut("a")
            await until(lambda: EventKind.FAILED in kinds(events), what="FAILED")
            with pytest.raises(ConnectionFailedError, match="failover gave up"):
                await c.send("/queue/x", "y")
    run(ab, main())
    assert dialer.dials == ["a", "b", "a", "b", "a"]  # connect, then 2 passes: b first
    assert kinds(events) == [EventKind.CONNECTED, EventKind.INTERRUPTED, EventKind.FAILED]


def test_max_reconnect_attempts_zero_reports_the_loss_at_once(
        ab: MemoryNetwork, dialer: ClientDialer) -> None:
    events: list[Event] = []

    async def main() -> None:
        async with client(dialer, AB + "&maxReconnectAttempts=0",
                          on_event=events.append) as c:
            dialer.cut("a")
            await until(lambda: EventKind.FAILED in kinds(events), what="FAILED")
            with pytest.raises(ConnectionFailedError):
                await c.send("/queue/x", "y")
    run(ab, main())
    assert dialer.dials == ["a"]  # b is up, but no reconnect is allowed
    assert kinds(events) == [EventKind.CONNECTED, EventKind.INTERRUPTED, EventKind.FAILED]


def test_an_unacked_message_is_redelivered_and_an_old_ack_is_dropped(
        ab: MemoryNetwork, dialer: ClientDialer) -> None:
    async def main() -> None:
        async with client(dialer, A_ONLY) as c:
            sub = await c.subscribe("/queue/work", ack="client-individual")
            await c.send("/queue/work", "job")
            first = await sub.get(5)
            assert not first.redelivered
            dialer.cut("a")
            again = await sub.get(5)  # the same broker, after the reconnect
            assert (again.text, again.redelivered, again.key) == ("job", True, first.key)
            assert await c.ack(first) is False  # acked on a dead connection: dropped
            assert c.stats["dropped_acks"] == 1
            assert await c.ack(again) is True
            with pytest.raises(OperationTimeoutError):
                await sub.get(0.02)
    run(ab, main())
    assert ab.brokers["a"].queue_depth("work") == 0


def test_a_copy_the_application_already_acked_is_dropped_and_settled(
        ab: MemoryNetwork, dialer: ClientDialer) -> None:
    async def main() -> None:
        # A producer whose confirmation was lost sent the same message to both brokers.
        for host in ("a", "b"):
            async with client(dialer, f"stomp://{host}") as p:
                await p.send("/queue/orders", "order 1", dedup_id="order-1")
        async with client(dialer) as c:
            sub = await c.subscribe("/queue/orders", ack="client-individual")
            first = await sub.get(5)
            assert await c.ack(first)
            dialer.refuse("a")
            dialer.cut("a")
            async with client(dialer, "stomp://b") as p:
                await p.send("/queue/orders", "order 2", dedup_id="order-2")
            assert (await sub.get(5)).text == "order 2"
            assert sub.duplicates == 1 and c.stats["duplicates"] == 1
            # The dropped copy was acknowledged on b for the application.
            await until(lambda: ab.brokers["b"].queue_depth("orders") == 1,
                        what="order 1 settled on b")
    run(ab, main())


def test_without_check_for_duplicates_every_copy_is_delivered(
        ab: MemoryNetwork, dialer: ClientDialer) -> None:
    async def main() -> None:
        async with client(dialer, "stomp://a") as p:
            await p.send("/queue/dup", "x", dedup_id="same", persistent=False)
        async with client(dialer, "stomp://b") as p:
            await p.send("/queue/dup", "x", dedup_id="same", persistent=False)
        async with client(dialer, AB + "&checkForDuplicates=false") as c:
            sub = await c.subscribe("/queue/dup")
            assert (await sub.get(5)).key == "same"
            dialer.refuse("a")
            dialer.cut("a")
            assert (await sub.get(5)).key == "same"
            assert sub.duplicates == 0
    run(ab, main())


def test_a_nacked_message_comes_back_to_the_application(ab: MemoryNetwork,
                                                        dialer: ClientDialer) -> None:
    async def main() -> None:
        async with client(dialer) as c:
            sub = await c.subscribe("/queue/retry", ack="client-individual")
            await c.send("/queue/retry", "try me")
            first = await sub.get(5)
            assert await c.nack(first)
            again = await sub.get(5)
            assert again.key == first.key and again.redelivered
            assert await c.ack(again)
    run(ab, main())


def test_an_unsubscribed_subscription_is_not_restored(dialer: ClientDialer,
                                                      network: MemoryNetwork) -> None:
    peer = scripted(dialer)

    async def main() -> None:
        async with client(dialer, PEER) as c:
            kept = await c.subscribe("/queue/kept", ack="client", selector="x > 1",
                                     headers={"activemq.prefetchSize": "5"})
            gone = await c.subscribe("/queue/gone")
            await gone.unsubscribe()
            dialer.cut("p")
            await until(lambda: peer.connections == 2 and c.connected, what="reconnect")
            await c.send("/queue/kept", "barrier")
            assert kept.active and not gone.active
    run(network, main())
    restored = [f for n, f in peer.frames if n == 2 and f.command == "SUBSCRIBE"]
    assert [dict(f.headers) for f in restored] == [{
        "destination": "/queue/kept", "id": "sub-1", "ack": "client", "selector": "x > 1",
        "activemq.prefetchSize": "5", "receipt": restored[0].get("receipt")}]


# -------------------------------------------------------------- receipts and resends


def test_every_request_asks_for_a_receipt_and_a_fire_and_forget_send_does_not(
        dialer: ClientDialer, network: MemoryNetwork) -> None:
    peer = scripted(dialer)

    async def main() -> None:
        async with client(dialer, PEER) as c:
            await c.send("/queue/x", "confirmed")
            await c.send("/queue/x", "fire and forget", confirm=False)
            await c.subscribe("/queue/x")
    run(network, main())
    sends = peer.received("SEND")
    assert sends[0].get("receipt") is not None and sends[1].get("receipt") is None
    assert peer.received("SUBSCRIBE")[0].get("receipt") is not None
    assert peer.commands()[-1] == "DISCONNECT"


def test_the_connect_frame_names_version_host_login_and_client_id(
        dialer: ClientDialer, network: MemoryNetwork) -> None:
    peer = scripted(dialer)

    async def main() -> None:
        async with client(dialer, PEER, login="app", passcode="pw", client_id="c-1",
                          heartbeat_ms=(1000, 2000)):
            pass
        async with client(dialer, PEER):
            pass
    run(network, main())
    with_login, anonymous = peer.received("CONNECT")
    assert dict(with_login.headers) == {"accept-version": "1.2", "host": "p",
                                        "heart-beat": "1000,2000", "login": "app",
                                        "passcode": "pw", "client-id": "c-1"}
    assert "login" not in dict(anonymous.headers)
    assert "client-id" not in dict(anonymous.headers)


def test_an_unconfirmed_send_is_resent_with_the_same_dedup_id(
        dialer: ClientDialer, network: MemoryNetwork) -> None:
    def script(frame: Frame, n: int) -> Reaction:
        return "drop" if frame.command == "SEND" and n == 1 else "answer"
    peer = scripted(dialer, script)

    async def main() -> None:
        async with client(dialer, PEER) as c:
            dedup = await c.send("/queue/x", "once")
            assert c.stats["resent"] == 1
            assert [f.get("dedup-id") for f in peer.received("SEND")] == [dedup, dedup]
    run(network, main())


def test_reply_timeout_treats_a_silent_broker_as_dead(dialer: ClientDialer,
                                                      network: MemoryNetwork) -> None:
    def script(frame: Frame, n: int) -> Reaction:
        return "silent" if frame.command == "SEND" and n == 1 else "answer"
    peer = scripted(dialer, script)
    events: list[Event] = []

    async def main() -> None:
        async with client(dialer, PEER + "&replyTimeout=20", on_event=events.append) as c:
            await c.send("/queue/x", "eventually")
            assert c.stats["resent"] == 1
    run(network, main())
    assert peer.commands().count("SEND") == 2 and peer.connections == 2
    assert kinds(events)[:3] == [EventKind.CONNECTED, EventKind.INTERRUPTED,
                                 EventKind.RESUMED]
    assert "replyTimeout=20 ms" in str(events[1].error)


def test_an_operation_timeout_bounds_a_send_without_a_receipt(
        dialer: ClientDialer, network: MemoryNetwork) -> None:
    scripted(dialer, lambda frame, n: "silent" if frame.command == "SEND" else "answer")

    async def main() -> None:
        async with client(dialer, PEER) as c:
            with pytest.raises(OperationTimeoutError, match="no confirmation"):
                await c.send("/queue/x", "never confirmed", timeout=0.02)
            assert c.connected  # the connection itself is fine
    run(network, main())


def test_a_tracked_fire_and_forget_send_is_confirmed_in_the_background(
        dialer: ClientDialer, network: MemoryNetwork) -> None:
    def script(frame: Frame, n: int) -> Reaction:
        return "drop" if frame.command == "SEND" and n == 1 else "answer"
    peer = scripted(dialer, script)

    async def main() -> None:
        async with client(dialer, PEER + "&trackMessages=true&maxCacheSize=100") as c:
            dedup = await c.send("/queue/x", "tracked", confirm=False)
            assert c.tracked_bytes == len("tracked")
            await until(lambda: c.tracked_bytes == 0, what="the tracked send confirmed")
            assert [f.get("dedup-id") for f in peer.received("SEND")] == [dedup, dedup]
            # Over maxCacheSize: sent once, untracked, without a receipt.
            await c.send("/queue/x", "y" * 101, confirm=False)
            assert c.tracked_bytes == 0
            await until(lambda: len(peer.received("SEND")) == 3, what="the third SEND")
            assert peer.received("SEND")[-1].get("receipt") is None
    run(network, main())


def test_a_refusal_is_raised_and_not_retried(dialer: ClientDialer,
                                             network: MemoryNetwork) -> None:
    peer = scripted(dialer, lambda frame, n: "error" if frame.command == "SEND" and n == 1
                    else "answer")

    async def main() -> None:
        async with client(dialer, PEER) as c:
            with pytest.raises(BrokerError, match="broker error: SEND refused"):
                await c.send("/queue/x", "refused")
            await c.send("/queue/x", "next")  # the client reconnected (ERROR closes)
    run(network, main())
    assert peer.commands().count("SEND") == 2 and peer.connections == 2


def test_a_refused_subscription_is_not_kept(dialer: ClientDialer,
                                            network: MemoryNetwork) -> None:
    peer = scripted(dialer, lambda frame, n: "error" if frame.command == "SUBSCRIBE"
                    and n == 1 else "answer")

    async def main() -> None:
        async with client(dialer, PEER) as c:
            with pytest.raises(BrokerError, match="SUBSCRIBE refused"):
                await c.subscribe("/queue/secret")
            await until(lambda: peer.connections == 2 and c.connected, what="reconnect")
            await c.send("/queue/x", "barrier")
    run(network, main())
    assert "SUBSCRIBE" not in peer.commands(2)


# ------------------------------------------------------------------- transactions


def test_a_committed_transaction_is_delivered_and_an_aborted_one_is_not(
        ab: MemoryNetwork, dialer: ClientDialer) -> None:
    async def main() -> None:
        async with client(dialer) as c:
            sub = await c.subscribe("/queue/tx")
            tx = await c.begin()
            await c.send("/queue/tx", "one", transaction=tx)
            with pytest.raises(OperationTimeoutError):
                await sub.get(0.02)  # nothing before COMMIT
            await c.commit(tx)
            assert (await sub.get(5)).text == "one"
            with pytest.raises(ClientError, match="already finished"):
                await c.send("/queue/tx", "late", transaction=tx)
            tx2 = await c.begin()
            await c.send("/queue/tx", "two", transaction=tx2)
            await c.abort(tx2)
            await c.send("/queue/tx", "three")
            assert (await sub.get(5)).text == "three"
    run(ab, main())


def test_a_transaction_whose_connection_was_lost_before_commit_is_rolled_back(
        ab: MemoryNetwork, dialer: ClientDialer) -> None:
    async def main() -> None:
        async with client(dialer) as c:
            sub = await c.subscribe("/queue/tx")
            tx = await c.begin()
            await c.send("/queue/tx", "lost", transaction=tx)
            dialer.cut("a")
            await until(lambda: c.stats["reconnects"] == 1, what="the reconnect")
            with pytest.raises(TransactionRolledBackError, match="redo it"):
                await c.send("/queue/tx", "more", transaction=tx)
            with pytest.raises(TransactionRolledBackError):
                await c.commit(tx)
            await c.abort(tx)  # harmless: the broker already rolled it back
            tx2 = await c.begin()
            await c.send("/queue/tx", "redone", transaction=tx2)
            await c.commit(tx2)
            assert (await sub.get(5)).text == "redone"
            with pytest.raises(OperationTimeoutError):
                await sub.get(0.02)  # nothing of the lost transaction
    run(ab, main())


def test_a_connection_lost_after_commit_was_sent_leaves_it_in_doubt(
        dialer: ClientDialer, network: MemoryNetwork) -> None:
    peer = scripted(dialer, lambda frame, n: "drop" if frame.command == "COMMIT"
                    else "answer")

    async def main() -> None:
        async with client(dialer, PEER) as c:
            tx = await c.begin()
            await c.send("/queue/x", "in tx", transaction=tx)
            with pytest.raises(TransactionInDoubtError, match="may or may not"):
                await c.commit(tx)
            await c.send("/queue/x", "after")  # the client reconnected and goes on
    run(network, main())
    assert peer.connections == 2
    begin, send = peer.received("BEGIN")[0], peer.received("SEND")[0]
    assert send.get("transaction") == begin.get("transaction")


def test_transactions_are_stomp_only(ab: MemoryNetwork, dialer: ClientDialer) -> None:
    async def main() -> None:
        c = client(dialer, "mqtt://a", client_id="m", keep_alive=0)
        with pytest.raises(ClientError, match="MQTT has no transactions"):
            await c.begin()
        await c.close()
    run(ab, main())


# ------------------------------------------------------------------ logins, closing


def test_a_refused_login_is_permanent(network: MemoryNetwork, dialer: ClientDialer) -> None:
    network.add("a", auth=AuthConfig(users=(User("app", "right"),), anonymous_access=False))
    network.add("b")
    network.start()
    events: list[Event] = []

    async def main() -> None:
        c = client(dialer, login="app", passcode="wrong", on_event=events.append)
        with pytest.raises(AuthenticationFailedError, match="login refused"):
            await c.connect()
        with pytest.raises(AuthenticationFailedError):
            await c.send("/queue/x", "y")
        await c.close()
    run(network, main())
    assert dialer.dials == ["a"]  # b is not tried: the credentials are wrong
    assert kinds(events) == [EventKind.FAILED]
    assert isinstance(events[0].error, AuthenticationFailedError)


def test_a_refused_login_can_be_treated_as_one_broker_failing(
        network: MemoryNetwork, dialer: ClientDialer) -> None:
    network.add("a", auth=AuthConfig(users=(User("app", "right"),), anonymous_access=False))
    network.add("b", auth=AuthConfig(users=(User("app", "wrong"),)))
    network.start()

    async def main() -> None:
        async with client(dialer, login="app", passcode="wrong",
                          give_up_on_auth_failure=False) as c:
            assert c.endpoint is not None and c.endpoint.host == "b"
    run(network, main())


@pytest.mark.parametrize(("message", "permanent"), [
    ("Authentication failed", True),  # meshmq
    ("User name [app] or password is invalid.", True),  # ActiveMQ
    ("User app is not authorized to connect", True),
    ("bad credentials", True),
    ("Broker is shutting down", False),
    ("Too many connections", False),
])
def test_an_error_answering_connect_is_a_refused_login_only_if_it_says_so(
        network: MemoryNetwork, dialer: ClientDialer, message: str,
        permanent: bool) -> None:
    network.add("b", auth=AuthConfig())  # no users: any login is accepted
    network.start()
    peer = scripted(dialer, lambda frame, n: "error" if frame.command == "CONNECT"
                    else "answer")
    peer.error_message = message

    async def main() -> None:
        c = client(dialer, "failover:(stomp://p,stomp://b)?randomize=false", login="app",
                   passcode="pw")
        try:
            if permanent:
                with pytest.raises(AuthenticationFailedError, match=re.escape(message)):
                    await c.connect()
            else:  # another broker may well accept: the next one is tried
                await c.connect()
                assert c.endpoint is not None and c.endpoint.host == "b"
        finally:
            await c.close()
    run(network, main())
    assert dialer.dials == (["p"] if permanent else ["p", "b"])


def test_close_is_polite_and_final(dialer: ClientDialer, network: MemoryNetwork) -> None:
    peer = scripted(dialer)

    async def main() -> None:
        c = client(dialer, PEER)
        await c.connect()
        sub = await c.subscribe("/queue/x")
        await c.close()
        await c.close()  # twice is fine
        assert c.is_closed() and not c.connected and not sub.active
        with pytest.raises(ClientClosedError):
            await c.connect()
        with pytest.raises(ClientClosedError):
            await c.send("/queue/x", "y")
    run(network, main())
    assert peer.commands() == ["CONNECT", "SUBSCRIBE", "DISCONNECT"]


def test_a_failing_event_listener_does_not_stop_the_client(ab: MemoryNetwork,
                                                           dialer: ClientDialer) -> None:
    seen: list[EventKind] = []

    def bad(event: Event) -> None:
        raise RuntimeError("listener bug")

    async def main() -> None:
        c = client(dialer, on_event=bad)
        c.add_listener(lambda e: seen.append(e.kind))
        async with c:
            dialer.cut("a")
            await until(lambda: EventKind.RESUMED in seen, what="RESUMED")
    run(ab, main())
    assert seen == [EventKind.CONNECTED, EventKind.INTERRUPTED, EventKind.RESUMED]
