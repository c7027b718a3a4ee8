"""Failover URIs as typed settings: every ActiveMQ option and ours, endpoints, nested
options, priority brokers, and one-line errors that name what is wrong."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshmq.backoff import ReconnectPolicy
from meshmq.client import Endpoint, FailoverOptions, parse_failover
from meshmq.client.tls import TlsSettings
from meshmq.uri import URIError

ONE = "failover:(stomp://a:1)"


def options(query: str) -> FailoverOptions:
    return parse_failover(f"{ONE}?{query}").options


def uri_error(uri: str, **kw: Any) -> URIError:
    with pytest.raises(URIError) as info:
        parse_failover(uri, **kw)
    return info.value


# ------------------------------------------------------------------------- options


def test_defaults_are_activemqs() -> None:
    o = parse_failover(ONE).options
    assert o == FailoverOptions()
    assert (o.randomize, o.maxReconnectAttempts, o.startupMaxReconnectAttempts,
            o.initialReconnectDelay, o.maxReconnectDelay, o.useExponentialBackOff,
            o.reconnectDelayExponent, o.timeout, o.backup, o.backupPoolSize,
            o.priorityBackup, o.trackMessages, o.maxCacheSize, o.updateURIsSupported,
            o.rebalanceUpdateURIs, o.warnAfterReconnectAttempts) == (
        True, -1, -1, 10, 30000, True, 2.0, -1, False, 1, False, False, 131072, True,
        True, 10)
    assert o.policy() == ReconnectPolicy()
    assert o.timeout_s is None and o.reply_timeout_s is None
    assert o.checkForDuplicates and o.auditDepth == 2048 and o.nested == {}


@pytest.mark.parametrize(("query", "name", "value"), [
    ("randomize=false", "randomize", False),
    ("maxReconnectAttempts=3", "maxReconnectAttempts", 3),
    ("maxReconnectAttempts=0", "maxReconnectAttempts", 0),
    ("startupMaxReconnectAttempts=5", "startupMaxReconnectAttempts", 5),
    ("initialReconnectDelay=250", "initialReconnectDelay", 250),
    ("maxReconnectDelay=5000", "maxReconnectDelay", 5000),
    ("useExponentialBackOff=false", "useExponentialBackOff", False),
    ("reconnectDelayExponent=1.5", "reconnectDelayExponent", 1.5),
    ("timeout=3000", "timeout", 3000),
    ("backup=true", "backup", True),
    ("backupPoolSize=3", "backupPoolSize", 3),
    ("priorityBackup=true", "priorityBackup", True),
    ("trackMessages=true", "trackMessages", True),
    ("maxCacheSize=0", "maxCacheSize", 0),
    ("updateURIsSupported=false", "updateURIsSupported", False),
    ("updateURIsURL=file:///etc/brokers.txt", "updateURIsURL", "file:///etc/brokers.txt"),
    ("rebalanceUpdateURIs=false", "rebalanceUpdateURIs", False),
    ("warnAfterReconnectAttempts=0", "warnAfterReconnectAttempts", 0),
    ("replyTimeout=500", "replyTimeout", 500),
    ("jitter=0.25", "jitter", 0.25),
    ("reconnectResetAfter=1000", "reconnectResetAfter", 1000),
    ("checkForDuplicates=false", "checkForDuplicates", False),
    ("auditDepth=16", "auditDepth", 16),
])
def test_each_option_is_parsed_to_its_type(query: str, name: str, value: object) -> None:
    parsed = getattr(options(query), name)
    assert parsed == value and type(parsed) is type(value)
    # Only that option changed.
    others = {k: v for k, v in vars_of(options(query)).items() if k != name}
    assert others == {k: v for k, v in vars_of(FailoverOptions()).items() if k != name}


def vars_of(o: FailoverOptions) -> dict[str, object]:
    return {f: getattr(o, f) for f in o.__dataclass_fields__}


def test_an_empty_update_uris_url_means_none() -> None:
    assert options("updateURIsURL=").updateURIsURL is None


@pytest.mark.parametrize(("text", "value"), [
    ("true", True), ("TRUE", True), ("1", True), ("yes", True), ("on", True),
    ("%20true%20", True), ("false", False), ("False", False), ("0", False), ("no", False),
    ("off", False),
])
def test_boolean_spellings(text: str, value: bool) -> None:
    assert options(f"trackMessages={text}").trackMessages is value


def test_options_map_onto_the_reconnect_policy_in_seconds() -> None:
    o = options("randomize=false&maxReconnectAttempts=4&startupMaxReconnectAttempts=2&"
                "initialReconnectDelay=100&maxReconnectDelay=2000&"
                "useExponentialBackOff=false&reconnectDelayExponent=1.5&jitter=0.25&"
                "reconnectResetAfter=5000")
    assert o.policy() == ReconnectPolicy(
        initial_delay=0.1, max_delay=2.0, exponential=False, multiplier=1.5,
        max_attempts=4, startup_max_attempts=2, randomize=False, jitter=0.25,
        reset_after=5.0)


@pytest.mark.parametrize(("query", "timeout_s", "reply_s"), [
    ("timeout=-1", None, None),
    ("timeout=0", 0.0, None),
    ("timeout=1500", 1.5, None),
    ("replyTimeout=-1", None, None),
    ("replyTimeout=250", None, 0.25),
])
def test_timeouts_in_seconds(query: str, timeout_s: float | None,
                             reply_s: float | None) -> None:
    o = options(query)
    assert (o.timeout_s, o.reply_timeout_s) == (timeout_s, reply_s)


@pytest.mark.parametrize(("item", "reason"), [
    ("randomize=maybe", "bad value for randomize: expected true or false"),
    ("randomize=", "bad value for randomize"),
    ("useExponentialBackOff=2", "bad value for useExponentialBackOff"),
    ("maxReconnectAttempts=-2", "must be -1 (for ever), 0 or more"),
    ("maxReconnectAttempts=1.5", "bad value for maxReconnectAttempts"),
    ("startupMaxReconnectAttempts=-3", "must be -1 (for ever), 0 or more"),
    ("initialReconnectDelay=-1", "initialReconnectDelay must be >= 0"),
    ("initialReconnectDelay=10ms", "bad value for initialReconnectDelay"),
    ("maxReconnectDelay=-5", "maxReconnectDelay must be >= 0"),
    ("reconnectDelayExponent=0.5", "reconnectDelayExponent must be >= 1"),
    ("reconnectDelayExponent=nan", "expected a finite number"),
    ("reconnectDelayExponent=inf", "expected a finite number"),
    ("timeout=-2", "must be -1 (block) or a time in ms"),
    ("timeout=soon", "bad value for timeout"),
    ("backupPoolSize=-1", "backupPoolSize must be >= 0"),
    ("maxCacheSize=-1", "maxCacheSize must be >= 0"),
    ("warnAfterReconnectAttempts=-1", "warnAfterReconnectAttempts must be >= 0"),
    ("replyTimeout=0", "must be -1 (off) or a time in ms"),
    ("replyTimeout=-7", "must be -1 (off) or a time in ms"),
    ("jitter=-0.1", "between 0 and 1"),
    ("jitter=1.01", "between 0 and 1"),
    ("reconnectResetAfter=-1", "reconnectResetAfter must be >= 0"),
    ("auditDepth=-1", "auditDepth must be >= 0"),
])
def test_bad_values_are_one_line_errors_naming_the_option(item: str, reason: str) -> None:
    error = uri_error(f"{ONE}?{item}")
    assert error.part == item
    assert reason in error.reason
    assert "\n" not in str(error) and item in str(error)


@pytest.mark.parametrize(("key", "suggestion"), [
    ("maxReconectAttempts", "maxReconnectAttempts"),
    ("randomise", "randomize"),
    ("initialReconnectdelay", "initialReconnectDelay"),
    ("priorityURI", "priorityURIs"),
])
def test_a_misspelt_option_suggests_the_right_one(key: str, suggestion: str) -> None:
    error = uri_error(f"{ONE}?{key}=1")
    assert error.part == key
    assert f"unknown failover option {key!r} (did you mean {suggestion!r}?)" in error.reason


def test_an_unknown_option_lists_the_known_ones_without_guessing() -> None:
    error = uri_error(f"{ONE}?zzz=1")
    assert "did you mean" not in error.reason
    assert "known: auditDepth, backup, backupPoolSize," in error.reason


def test_an_option_given_twice_is_an_error() -> None:
    assert "given twice" in uri_error(f"{ONE}?timeout=1&timeout=2").reason


def test_an_endpoint_option_belongs_on_the_endpoint_or_under_nested() -> None:
    assert uri_error(f"{ONE}?connectionTimeout=5").part == "connectionTimeout"
    assert parse_failover(f"{ONE}?nested.connectionTimeout=5").endpoints[0] \
        .connect_timeout == 0.005


def test_a_failover_option_on_an_endpoint_is_an_error() -> None:
    error = uri_error("failover:(stomp://a:1?randomize=false)")
    assert error.part == "randomize" and "unknown endpoint option" in error.reason


# ----------------------------------------------------------------------- endpoints


@pytest.mark.parametrize(("scheme", "protocol", "tls", "port", "websocket"), [
    ("stomp", "stomp", False, 61613, False),
    ("stomp+nio", "stomp", False, 61613, False),
    ("stomp+ssl", "stomp", True, 61612, False),
    ("stomp+nio+ssl", "stomp", True, 61612, False),
    ("tcp", "stomp", False, 61613, False),
    ("nio", "stomp", False, 61613, False),
    ("ssl", "stomp", True, 61612, False),
    ("nio+ssl", "stomp", True, 61612, False),
    ("mqtt", "mqtt", False, 1883, False),
    ("mqtt+nio", "mqtt", False, 1883, False),
    ("mqtts", "mqtt", True, 8883, False),
    ("mqtt+ssl", "mqtt", True, 8883, False),
    ("mqtt+nio+ssl", "mqtt", True, 8883, False),
    ("ws", "stomp", False, 80, True),
    ("wss", "stomp", True, 443, True),
])
def test_schemes_give_protocol_tls_and_default_port(scheme: str, protocol: str, tls: bool,
                                                    port: int, websocket: bool) -> None:
    (e,) = parse_failover(f"{scheme}://h").endpoints
    assert (e.protocol, e.tls, e.port, e.websocket) == (protocol, tls, port, websocket)


@pytest.mark.parametrize(("uri", "port", "tls"), [
    ("tcp://h", 1883, False), ("ssl://h", 8883, True), ("ws://h/mqtt", 80, False),
])
def test_protocol_neutral_schemes_take_the_clients_protocol(uri: str, port: int,
                                                            tls: bool) -> None:
    (e,) = parse_failover(uri, protocol="mqtt").endpoints
    assert (e.protocol, e.port, e.tls) == ("mqtt", port, tls)


def test_a_plain_uri_is_a_list_of_one_with_default_options() -> None:
    spec = parse_failover("stomp://h:7")
    assert spec.endpoints == (Endpoint("stomp", "h", 7),)
    assert spec.options == FailoverOptions()


def test_the_bare_form_lists_endpoints_in_order() -> None:
    spec = parse_failover("failover:stomp://a:1,stomp://b:2,stomp://c:3")
    assert [(e.host, e.port) for e in spec.endpoints] == [("a", 1), ("b", 2), ("c", 3)]


def test_ipv6_hosts_are_kept_without_brackets_and_written_with_them() -> None:
    (e,) = parse_failover("failover:(stomp://[::1]:61613)").endpoints
    assert e.host == "::1" and e.uri() == "stomp://[::1]:61613"


def test_a_websocket_endpoint_keeps_its_path_and_others_drop_theirs() -> None:
    ws, plain = parse_failover("failover:(ws://h:61614/stomp,stomp://h:61613/x)").endpoints
    assert (ws.path, ws.uri()) == ("/stomp", "ws://h:61614/stomp")
    assert (plain.path, plain.uri()) == ("", "stomp://h:61613")


@pytest.mark.parametrize(("uri", "canonical"), [
    ("tcp://h:1", "stomp://h:1"), ("ssl://h:2", "stomp+ssl://h:2"),
    ("stomp+nio://h:3", "stomp://h:3"), ("mqtt+ssl://h:4", "mqtts://h:4"),
    ("wss://h:5/ws", "wss://h:5/ws"),
])
def test_an_endpoint_is_written_back_in_its_canonical_scheme(uri: str,
                                                            canonical: str) -> None:
    (e,) = parse_failover(uri).endpoints
    assert e.uri() == str(e) == canonical
    assert parse_failover(canonical).endpoints == (e,)


@settings(max_examples=50)
@given(protocol=st.sampled_from(["stomp", "mqtt"]), tls=st.booleans(),
       websocket=st.booleans(),
       host=st.from_regex(r"[a-z][a-z0-9-]{0,10}(\.[a-z0-9]{1,5}){0,2}", fullmatch=True),
       port=st.integers(0, 65535))
def test_endpoint_uri_round_trips(protocol: str, tls: bool, websocket: bool, host: str,
                                  port: int) -> None:
    e = Endpoint(protocol, host, port, tls, websocket=websocket,
                 path="/ws" if websocket else "")
    assert parse_failover(e.uri(), protocol=protocol).endpoints == (e,)


def test_settings_do_not_make_a_different_broker() -> None:
    a, b = parse_failover("failover:(stomp://h:1?connectionTimeout=100,"
                          "stomp://h:1?verifyHostName=false)").endpoints
    assert a != b and a.key == b.key
    assert a.key != parse_failover("stomp+ssl://h:1").endpoints[0].key


def test_the_protocol_is_taken_from_the_schemes() -> None:
    assert parse_failover("failover:(mqtt://a,tcp://b)").endpoints[1].protocol == "mqtt"
    assert parse_failover("failover:(tcp://a,ssl://b)").endpoints[0].protocol == "stomp"


def test_stomp_and_mqtt_in_one_list_is_an_error() -> None:
    error = uri_error("failover:(stomp://a:1,mqtt://b:1)")
    assert error.part == "mqtt,stomp" and "mixes STOMP and MQTT" in error.reason


def test_an_endpoint_of_the_other_protocol_than_the_clients_is_an_error() -> None:
    error = uri_error("failover:(stomp://a:1,mqtt://b:2)", protocol="stomp")
    assert error.part == "mqtt://b:2" and "MQTT endpoint in a STOMP client" in error.reason


def test_the_protocol_argument_is_stomp_or_mqtt() -> None:
    with pytest.raises(ValueError, match="'stomp' or 'mqtt'"):
        parse_failover("stomp://a:1", protocol="amqp")


@pytest.mark.parametrize(("uri", "part", "reason"), [
    ("static:(stomp://a:1)", "static", "network connectors"),
    ("masterslave:(stomp://a:1,stomp://b:1)", "masterslave", "network connectors"),
    ("failover:(failover:(stomp://a:1))", "failover:(stomp://a:1)", "not composites"),
    ("failover:(multicast://a:1)", "multicast", "cannot dial multicast://"),
    ("failover:(auto://a:1)", "auto", "cannot dial auto://"),
    ("failover:()", "failover:()", "needs at least one URI"),
    ("failover:(stomp://a:1,,stomp://b:1)", "stomp://a:1,,stomp://b:1", "stray comma"),
    ("failover:(stomp://a:99999)", "99999", "port must be a number"),
    ("failover:(stomp://u@a:1)", "u@a:1", "user information"),
])
def test_lists_the_client_cannot_dial(uri: str, part: str, reason: str) -> None:
    error = uri_error(uri)
    assert error.part == part and reason in error.reason


# ------------------------------------------------------------ per-endpoint options


def test_connection_timeout_is_in_ms_and_defaults_to_30_s() -> None:
    a, b = parse_failover("failover:(stomp://a:1,stomp://b:1?connectionTimeout=1500)") \
        .endpoints
    assert (a.connect_timeout, b.connect_timeout) == (30.0, 1.5)


@pytest.mark.parametrize(("option", "reason"), [
    ("connectionTimeout=0", "connectionTimeout must be > 0"),
    ("connectionTimeout=-5", "connectionTimeout must be > 0"),
    ("connectionTimeout=abc", "bad endpoint option"),
    ("verifyHostName=perhaps", "bad endpoint option: expected true or false"),
    ("trustAll=sure", "bad endpoint option: expected true or false"),
    ("keyStoreKey=k.pem", "keyStoreKey needs keyStore"),
    ("soTimeout=5", "unknown endpoint option 'soTimeout'"),
])
def test_bad_endpoint_options(option: str, reason: str) -> None:
    assert reason in uri_error(f"failover:(stomp+ssl://a:1?{option})").reason


def test_nested_options_apply_to_every_endpoint_and_the_endpoints_own_win() -> None:
    spec = parse_failover("failover:(stomp://a:1,stomp://b:2?connectionTimeout=500)"
                          "?nested.connectionTimeout=2000&nested.verifyHostName=false")
    assert [e.connect_timeout for e in spec.endpoints] == [2.0, 0.5]
    assert [e.verify_host_name for e in spec.endpoints] == [False, False]
    assert spec.options.nested == {"connectionTimeout": "2000", "verifyHostName": "false"}


@pytest.mark.parametrize("query", ["nested.bogus=1", "nested.=1"])
def test_nested_options_must_be_endpoint_options(query: str) -> None:
    assert uri_error(f"{ONE}?{query}").part in ("bogus", "nested.")


@pytest.mark.parametrize("spelling", ["verifyHostName", "socket.verifyHostName"])
def test_verify_host_name_in_either_spelling(spelling: str) -> None:
    (e,) = parse_failover(f"stomp+ssl://a?{spelling}=false").endpoints
    assert e.verify_host_name is False
    assert e.tls_settings(TlsSettings()).check_hostname is False


def test_tls_options_of_the_uri_override_the_clients_settings() -> None:
    client = TlsSettings(cafile="client-ca.pem", certfile="client.pem",
                         keyfile="client.key", key_password="pw", verify=True)
    (plain,) = parse_failover("stomp+ssl://a").endpoints
    assert plain.tls_settings(client) == client
    (e,) = parse_failover("stomp+ssl://a?trustStore=ca.pem&keyStore=me.pem&"
                          "keyStoreKey=me.key&keyStorePassword=s3cret").endpoints
    assert e.tls_settings(client) == TlsSettings(
        cafile="ca.pem", certfile="me.pem", keyfile="me.key", key_password="s3cret",
        verify=True, check_hostname=True)


def test_a_uri_certificate_never_borrows_the_clients_key() -> None:
    client = TlsSettings(certfile="client.pem", keyfile="client.key", key_password="pw")
    (e,) = parse_failover("stomp+ssl://a?keyStore=both.pem").endpoints
    settings = e.tls_settings(client)
    assert (settings.certfile, settings.keyfile, settings.key_password) == \
        ("both.pem", None, None)


@pytest.mark.parametrize(("option", "client_verify", "verify"), [
    ("", True, True), ("", False, False),
    ("?trustAll=true", True, False), ("?trustAll=false", False, True),
])
def test_trust_all_on_the_uri_decides_verification(option: str, client_verify: bool,
                                                   verify: bool) -> None:
    (e,) = parse_failover(f"stomp+ssl://a{option}").endpoints
    assert e.tls_settings(TlsSettings(verify=client_verify)).verify is verify


# ---------------------------------------------------------------- priority brokers


def test_priority_backup_prefers_the_first_uri() -> None:
    spec = parse_failover("failover:(stomp://a:1,stomp://b:2)?priorityBackup=true")
    assert spec.priority_endpoints() == spec.endpoints[:1]


def test_no_priority_without_the_options() -> None:
    assert parse_failover("failover:(stomp://a:1,stomp://b:2)").priority_endpoints() == ()


def test_priority_uris_name_brokers_of_the_list_by_address() -> None:
    spec = parse_failover("failover:(stomp://a:1,stomp://b:2?connectionTimeout=50,"
                          "stomp://c:3)?priorityURIs=tcp://b:2,stomp://c:3,stomp://z:9"
                          "&priorityBackup=true")
    # Matched by address whatever their settings; a broker not in the list is ignored;
    # priorityURIs wins over priorityBackup's "the first one".
    assert [e.host for e in spec.priority_endpoints()] == ["b", "c"]


def test_priority_uris_may_be_percent_encoded() -> None:
    spec = parse_failover("failover:(stomp://a:1,stomp://b:2)?priorityURIs="
                          "stomp%3A%2F%2Fb%3A2")
    assert spec.priority_endpoints() == spec.endpoints[1:]


@pytest.mark.parametrize(("value", "reason"), [
    ("nonsense", "missing scheme"),
    ("mqtt://a:1", "MQTT endpoint in a STOMP client's list"),
    ("multicast://a:1", "cannot dial multicast://"),
])
def test_a_bad_priority_uri_is_an_error_of_the_failover_uri(value: str,
                                                            reason: str) -> None:
    error = uri_error(f"{ONE}?priorityURIs={value}")
    assert error.part == f"priorityURIs={value}"
    assert "bad URI in priorityURIs" in error.reason and reason in error.reason
