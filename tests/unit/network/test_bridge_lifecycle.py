"""A bridge's life between real brokers linked in memory (no sockets): why it failed,
in the status an operator reads (credentials, a broker dialling itself, a remote that is
not there), giving up after max_reconnect_attempts, a remote that shuts down cleanly,
demand that appears and disappears, connectors stopped and started by an operator, the
inbound side's status and advisories, and a link cut while durable topic messages are
on the wire."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from tests.support.memory_network import (
    LINK_USER,
    NetworkBroker,
    client,
    connector,
    memory_network,
    send,
    subscribe,
)

from meshmq.config.model import AuthConfig, User


def outbound(broker: NetworkBroker) -> dict[str, Any]:
    (status,) = broker.outbound()
    return status


def error_kind(broker: NetworkBroker) -> str | None:
    error = outbound(broker)["last_error"]
    return None if error is None else str(error["kind"])


# ---------------------------------------------------------------- say why it failed
@pytest.mark.parametrize(("remote_auth", "credentials", "fragment"), [
    (None, {"password": "wrong"},
     "authentication failed for user 'link': set username/password on the network "
     "connector to a user of broker 'B', or use mutual TLS"),
    (None, {"username": None, "password": None},
     "broker links need credentials: set username/password on the network connector to "
     "a user of broker 'B', or use mutual TLS"),
    (AuthConfig(), {}, "broker 'B' has no users, and broker links need a configured user"),
])
def test_a_refused_login_says_what_to_change_and_keeps_retrying(
        remote_auth: AuthConfig | None, credentials: dict[str, Any], fragment: str) -> None:
    with memory_network() as net:
        if remote_auth is None:
            net.add("B")
        else:
            net.add("B", auth=remote_auth)
        a = net.add("A", connector("B", **credentials))
        net.start()
        a.wait_for(lambda: error_kind(a) == "authentication-failed", what="the refusal")
        status = outbound(a)
        assert fragment in status["last_error"]["message"]
        assert status["last_error"]["message"].startswith(
            "tcp://B:61616: refused by broker 'B': ")
        assert status["connects"] == 0 and status["remote_broker"] is None
        attempts = status["attempts"]
        a.wait_for(lambda: outbound(a)["attempts"] > attempts, what="a retry")


def test_a_failure_repeated_on_every_retry_is_logged_once(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="meshmq.network")
    with memory_network() as net:
        net.add("B")
        a = net.add("A", connector("B", password="wrong"))
        net.start()
        a.wait_for(lambda: outbound(a)["attempts"] >= 4, what="several refused attempts")
    warnings = [r.getMessage() for r in caplog.records if r.name == "meshmq.network"
                and r.levelno == logging.WARNING and "authentication-failed" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith("bridge NC:tcp://B:61616: tcp://B:61616: refused by broker "
                                  "'B': authentication failed for user 'link'")
    assert warnings[0].endswith("(authentication-failed); retrying with backoff")
    # The accepting broker logs the stranger once too, not once per attempt.
    refused = [r for r in caplog.records if r.levelno == logging.WARNING
               and "network link from" in r.getMessage() and "refused" in r.getMessage()]
    assert len(refused) == 1


def test_a_connector_that_dials_its_own_broker_is_refused_as_a_loop() -> None:
    with memory_network() as net:
        a = net.add("A", connector("A"))
        net.start()
        a.wait_for(lambda: error_kind(a) == "loop", what="the loop refusal")
        message = outbound(a)["last_error"]["message"]
        assert "broker 'A' connected to itself" in message
        assert "broker names must be unique in a network" in message


def test_a_remote_that_is_not_there_is_connection_refused() -> None:
    with memory_network() as net:
        a = net.add("A", connector("NOWHERE"))
        net.start()
        a.wait_for(lambda: error_kind(a) == "connection-refused", what="the refusal")
        assert outbound(a)["state"] in ("backing-off", "connecting")
        assert outbound(a)["link_ended"] is None  # no link was ever up


def test_a_bridge_gives_up_after_max_reconnect_attempts_and_says_so() -> None:
    with memory_network() as net:
        a = net.add("A", connector("", uri="static:(tcp://X:1,tcp://Y:1)",
                                   max_reconnect_attempts=2))
        net.start()
        a.wait_for(lambda: [s["state"] for s in a.outbound()] == ["stopped", "stopped"],
                   what="both bridges given up")
        for status in a.outbound():
            assert status["attempts"] == 2
            assert status["last_error"]["kind"] == "connection-refused"


def test_a_masterslave_bridge_moves_to_the_broker_that_answers() -> None:
    with memory_network() as net:
        b = net.add("B")
        a = net.add("A", connector("", uri="masterslave:(tcp://DOWN:1,tcp://B:1)"))
        net.start()
        a.wait_forwarding()
        status = outbound(a)
        assert status["connected_to"] == "tcp://B:1" and status["remote_broker"] == "B"
        assert status["attempts"] == 2 and status["targets"] == ["tcp://DOWN:1", "tcp://B:1"]
        consumer = client(b)
        subscribe(consumer, "/queue/pair")
        a.wait_for(lambda: a.consumers_on("pair") == 1, what="demand through the pair")


def test_a_clean_remote_shutdown_is_told_apart_from_a_crash(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="meshmq.network")
    with memory_network() as net:
        a, b = net.linked()
        b.stop()
        a.wait_for(lambda: outbound(a)["link_ended"] is not None, what="the link ended")
        ended = outbound(a)["link_ended"]
        assert ended["kind"] == "remote-shutdown"
        assert "the remote broker said goodbye (broker stopping)" in ended["message"]
        # Later retries are refused: the last error says so, the link's end stays.
        a.wait_for(lambda: error_kind(a) == "connection-refused", what="refused retries")
        assert outbound(a)["link_ended"]["kind"] == "remote-shutdown"
    shutdown = [r for r in caplog.records if "(remote-shutdown)" in r.getMessage()]
    assert [r.levelno for r in shutdown] == [logging.INFO]  # not a WARNING: no crash
    assert not any("link-lost" in r.getMessage() for r in caplog.records)


# ---------------------------------------------------------------- demand comes and goes
def test_demand_follows_remote_consumers_as_they_come_and_go() -> None:
    with memory_network() as net:
        a, b = net.linked()
        first, second = client(b), client(b)
        subscribe(first, "/queue/come-go")
        a.wait_for(lambda: a.consumers_on("come-go") == 1, what="demand for the first")
        subscribe(second, "/queue/come-go")
        a.turn(20)
        assert a.consumers_on("come-go") == 1  # conduit: still one demand
        first.send("UNSUBSCRIBE", {"id": "1"})
        a.turn(20)
        assert a.consumers_on("come-go") == 1  # the second still wants it
        second.drop()  # a consumer's connection lost counts as its leaving
        a.wait_for(lambda: a.consumers_on("come-go") == 0, what="the demand gone")
        send(client(a), "/queue/come-go", "kept")
        a.turn(20)
        assert a.queue_depth("come-go") == 1 and outbound(a)["forwarded"] == 0


def test_messages_that_waited_on_the_origin_follow_demand_when_it_appears() -> None:
    with memory_network() as net:
        a, b = net.linked()
        producer = client(a)
        for i in range(10):
            send(producer, "/queue/later", str(i))
        a.turn(20)
        assert a.queue_depth("later") == 10
        consumer = client(b)
        subscribe(consumer, "/queue/later")
        a.wait_for(lambda: len(consumer.bodies()) == 10, what="the backlog forwarded")
        assert consumer.bodies() == [str(i) for i in range(10)]


def test_demand_planned_before_a_link_drops_is_rebuilt_by_the_next_sync() -> None:
    with memory_network() as net:
        a, b = net.linked()
        consumer = client(b)
        subscribe(consumer, "/queue/again")
        a.wait_for(lambda: a.consumers_on("again") == 1, what="demand")
        assert net.cut("A", "B") == 1
        a.wait_for(lambda: outbound(a)["connects"] == 2 and a.consumers_on("again") == 1,
                   what="the bridge back with its demand")
        send(client(a), "/queue/again", "after")
        a.wait_for(lambda: consumer.bodies() == ["after"], what="forwarded after the cut")


# ---------------------------------------------------------------- operators
def test_an_operator_stops_and_starts_a_connector() -> None:
    with memory_network() as net:
        a, b = net.linked(name="to-b")
        manager = a.runtime.network
        assert a.loop.run_until_complete(manager.stop_connector("to-b")) is True
        assert a.outbound() == []
        b.wait_for(lambda: not [s for s in b.bridges() if s["direction"] == "inbound"],
                   what="the inbound link gone on B")
        assert a.loop.run_until_complete(manager.stop_connector("to-b")) is False
        assert a.loop.run_until_complete(manager.start_connector("to-b")) is True
        a.wait_forwarding()
        assert a.loop.run_until_complete(manager.start_connector("to-b")) is False
        with pytest.raises(KeyError):
            a.loop.run_until_complete(manager.start_connector("nope"))


def test_a_connector_that_does_not_auto_start_waits_for_an_operator() -> None:
    with memory_network() as net:
        net.add("B")
        a = net.add("A", connector("B", name="later", auto_start=False))
        net.start()
        a.turn(20)
        assert a.outbound() == []
        a.loop.run_until_complete(a.runtime.network.start_connector("later"))
        a.wait_forwarding()
        assert outbound(a)["connector"] == "later"


# ---------------------------------------------------------------- the inbound side
def test_the_accepting_broker_lists_the_link_with_who_dialled() -> None:
    with memory_network() as net:
        a, b = net.linked(name="to-b")
        (inbound,) = [s for s in b.bridges() if s["direction"] == "inbound"]
        assert (inbound["name"], inbound["connector"], inbound["remote_broker"],
                inbound["state"], inbound["duplex"]) == ("to-b<-A", "to-b", "A",
                                                         "forwarding", False)
        assert outbound(a)["name"] == "to-b:tcp://B:61616"


def test_inbound_links_are_advised_when_they_come_and_go() -> None:
    with memory_network() as net:
        b = net.add("B")
        a = net.add("A", connector("B", name="to-b"))
        b.start()
        watcher = client(b)
        subscribe(watcher, "/topic/ActiveMQ.Advisory.NetworkBridge")
        a.start()
        a.wait_forwarding()
        b.wait_for(lambda: len(watcher.bodies()) >= 1, what="the started advisory")
        a.stop()
        b.wait_for(lambda: len(watcher.bodies()) >= 2, what="the stopped advisory")
        events = [json.loads(x) for x in watcher.bodies()]
        assert [(e["advisoryType"], e["remoteBroker"], e["connector"], e["direction"])
                for e in events] == [("NetworkBridgeStarted", "A", "to-b", "inbound"),
                                     ("NetworkBridgeStopped", "A", "to-b", "inbound")]


def test_a_bridge_state_advisory_carries_the_failure() -> None:
    with memory_network() as net:
        b = net.add("B")
        a = net.add("A", connector("B", password="wrong"))
        a.start()  # its bridge waits for B, which starts once the watcher listens
        w = client(a)
        subscribe(w, "/topic/ActiveMQ.Advisory.NetworkBridge")
        b.start()
        a.wait_for(lambda: any(json.loads(x).get("lastError") == "authentication-failed"
                               for x in w.bodies()), what="an advisory with the failure")
        event = next(json.loads(x) for x in w.bodies()
                     if json.loads(x).get("lastError") == "authentication-failed")
        assert event["advisoryType"] == "NetworkBridgeState"
        assert event["state"] == "backing-off" and event["originBrokerName"] == "A"
        assert "authentication failed for user 'link'" in event["lastErrorMessage"]


# ---------------------------------------------------------------- link lost mid-stream
def test_a_link_cut_under_durable_topic_traffic_loses_and_repeats_nothing() -> None:
    total = 300
    with memory_network() as net:
        a, b = net.linked()
        sub = client(b, **{"client-id": "reader"})
        subscribe(sub, "/topic/ticks", "d", **{"activemq.subscriptionName": "ticks"})
        a.wait_for(lambda: outbound(a)["demand"] == 1, what="the durable demand")
        producer = client(a)
        for i in range(total):
            send(producer, "/topic/ticks", str(i))
        a.wait_for(lambda: outbound(a)["acknowledged"] >= 30, what="some across")
        assert outbound(a)["acknowledged"] < total, "nothing left in flight to cut"
        assert net.cut("A", "B") == 1
        a.wait_for(lambda: outbound(a)["connects"] == 2, what="the bridge back")
        a.wait_for(lambda: len(sub.bodies()) >= total and outbound(a)["inflight"] == 0,
                   timeout=30, what="every tick on B")
        a.turn(30)
        assert sorted(sub.bodies(), key=int) == [str(i) for i in range(total)]


def test_the_link_user_is_the_connectors_username() -> None:
    with memory_network() as net:
        b = net.add("B", auth=AuthConfig(users=(LINK_USER, User("other", "pw"))))
        a = net.add("A", connector("B", username="other", password="pw"))
        net.start()
        a.wait_forwarding()
        (conn,) = [c for c in b.broker.connections.values() if c.protocol == "network"]
        assert conn.principal.user == "other"
