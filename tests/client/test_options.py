"""Failover URIs as typed options: ActiveMQ's names and defaults, errors naming the option."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshmq.backoff import ReconnectPolicy
from meshmq.client.dedup import DuplicateFilter
from meshmq.client.options import Endpoint, FailoverOptions, parse_failover
from meshmq.uri import URIError


def test_activemq_defaults() -> None:
    o = parse_failover("failover:(stomp://a:1)").options
    assert o == FailoverOptions()
    assert (o.randomize, o.maxReconnectAttempts, o.startupMaxReconnectAttempts) == (True, -1, -1)
    assert (o.initialReconnectDelay, o.maxReconnectDelay, o.useExponentialBackOff) == \
        (10, 30000, True)
    assert (o.reconnectDelayExponent, o.timeout, o.backup, o.backupPoolSize) == (2.0, -1,
                                                                                 False, 1)
    assert (o.priorityBackup, o.trackMessages, o.maxCacheSize) == (False, False, 131072)
    assert o.updateURIsSupported and o.rebalanceUpdateURIs and o.updateURIsURL is None
    assert o.timeout_s is None
    assert o.policy() == ReconnectPolicy()


def test_options_are_typed_and_mapped_to_the_policy() -> None:
    spec = parse_failover("failover:(stomp://a:1,stomp://b:2)?randomize=false&"
                          "maxReconnectAttempts=0&initialReconnectDelay=100&"
                          "maxReconnectDelay=2000&useExponentialBackOff=false&"
                          "reconnectDelayExponent=1.5&timeout=3000&jitter=0.25&"
                          "reconnectResetAfter=5000")
    p = spec.options.policy()
    assert p == ReconnectPolicy(initial_delay=0.1, max_delay=2.0, exponential=False,
                                multiplier=1.5, max_attempts=0, randomize=False,
                                jitter=0.25, reset_after=5.0)
    assert spec.options.timeout_s == 3.0


def test_endpoints_protocols_ports_and_tls() -> None:
    spec = parse_failover("failover:(stomp+ssl://a,stomp://b,tcp://c:7,ssl://d:8)")
    assert spec.endpoints == (Endpoint("stomp", "a", 61612, True), Endpoint("stomp", "b", 61613),
                              Endpoint("stomp", "c", 7), Endpoint("stomp", "d", 8, True))
    mqtt = parse_failover("failover:mqtt://a,mqtts://b")
    assert [(e.protocol, e.port, e.tls) for e in mqtt.endpoints] == [("mqtt", 1883, False),
                                                                     ("mqtt", 8883, True)]
    assert parse_failover("tcp://h:1", protocol="mqtt").endpoints[0].protocol == "mqtt"
    assert parse_failover("stomp://h:1").endpoints[0].uri() == "stomp://h:1"
    ws = parse_failover("failover:(ws://h:61614/stomp,wss://g)").endpoints
    assert [(e.protocol, e.websocket, e.tls, e.port, e.path) for e in ws] == [
        ("stomp", True, False, 61614, "/stomp"), ("stomp", True, True, 443, "")]
    assert ws[0].uri() == "ws://h:61614/stomp"
    assert parse_failover("ws://h:1", protocol="mqtt").endpoints[0].protocol == "mqtt"


def test_nested_options_apply_to_every_endpoint_and_endpoint_options_win() -> None:
    spec = parse_failover("failover:(stomp://a:1,stomp://b:2?connectionTimeout=500)"
                          "?nested.connectionTimeout=2000&nested.verifyHostName=false")
    assert [e.connect_timeout for e in spec.endpoints] == [2.0, 0.5]
    assert not any(e.verify_host_name for e in spec.endpoints)
    assert spec.options.nested == {"connectionTimeout": "2000", "verifyHostName": "false"}


def test_priority_uris() -> None:
    spec = parse_failover("failover:(stomp://a:1,stomp://b:2)?priorityBackup=true")
    assert spec.priority_endpoints() == spec.endpoints[:1]
    spec = parse_failover("failover:(stomp://a:1,stomp://b:2)?priorityURIs="
                          "stomp%3A%2F%2Fb%3A2")
    assert spec.priority_endpoints() == spec.endpoints[1:]
    assert parse_failover("failover:(stomp://a:1)").priority_endpoints() == ()


@pytest.mark.parametrize(("uri", "part", "reason"), [
    ("failover:(stomp://a:1)?maxReconectAttempts=1", "maxReconectAttempts",
     "did you mean 'maxReconnectAttempts'"),
    ("failover:(stomp://a:1)?randomize=maybe", "randomize=maybe", "bad value for randomize"),
    ("failover:(stomp://a:1)?maxReconnectAttempts=-5", "maxReconnectAttempts=-5", "-1"),
    ("failover:(stomp://a:1)?timeout=soon", "timeout=soon", "bad value for timeout"),
    ("failover:(stomp://a:1)?jitter=2", "jitter=2", "between 0 and 1"),
    ("failover:(stomp://a:1)?replyTimeout=0", "replyTimeout=0", "-1 (off)"),
    ("failover:(stomp://a:1)?reconnectDelayExponent=nan", "reconnectDelayExponent=nan",
     "finite"),
    ("failover:(stomp://a:1?soTimeout=5)", "soTimeout", "unknown endpoint option"),
    ("failover:(stomp://a:1)?nested.bogus=1", "bogus", "unknown endpoint option"),
    ("failover:(stomp://a:1?connectionTimeout=0)", "connectionTimeout", "must be > 0"),
    ("failover:(multicast://a:1)", "multicast", "cannot dial multicast://"),
    ("failover:(stomp://a:1,mqtt://b:1)", "mqtt,stomp", "mixes STOMP and MQTT"),
    ("static:(stomp://a:1)", "static", "network connectors"),
    ("failover:(failover:(stomp://a:1))", "failover:(stomp://a:1)", "not composites"),
])
def test_errors_name_the_option(uri: str, part: str, reason: str) -> None:
    with pytest.raises(URIError) as info:
        parse_failover(uri)
    assert info.value.part == part and reason in info.value.reason


def test_protocol_mismatch_with_the_client() -> None:
    with pytest.raises(URIError, match="MQTT endpoint in a STOMP client"):
        parse_failover("mqtt://a:1", protocol="stomp")
    with pytest.raises(ValueError, match="'stomp' or 'mqtt'"):
        parse_failover("stomp://a:1", protocol="amqp")


def test_duplicate_filter_window() -> None:
    f = DuplicateFilter(3)
    assert [f.seen(k) for k in ["a", "b", "a", "c", "d", "e", "a"]] == \
        [False, False, True, False, False, False, False]
    assert f.seen(None) is False and len(f) == 3
    f.add("z")
    assert "z" in f
    f.forget("z")
    assert "z" not in f
    off = DuplicateFilter(0)
    assert not off.seen("a") and not off.seen("a")


def test_duplicate_filter_copies_of_a_message_in_hand() -> None:
    f = DuplicateFilter(10)
    f.hold("k")  # handed to the application, not acked yet
    assert f.is_duplicate("k", redelivered=False)  # another copy (a producer resend)
    assert not f.is_duplicate("k", redelivered=True)  # the broker's redelivery of it
    f.release("k")
    assert not f.is_duplicate("k", redelivered=False)
    f.add("k")  # acked
    assert f.is_duplicate("k", redelivered=True)
    assert not f.is_duplicate(None, redelivered=False)


@given(st.lists(st.tuples(st.sampled_from(["seen", "add", "hold", "release"]),
                          st.integers(0, 20)), max_size=200), st.integers(1, 8))
def test_duplicate_filter_never_exceeds_its_window(ops: list[tuple[str, int]],
                                                   window: int) -> None:
    f = DuplicateFilter(window)
    for op, k in ops:
        getattr(f, op)(str(k))
        assert len(f) <= window
