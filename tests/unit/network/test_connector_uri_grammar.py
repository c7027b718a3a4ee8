"""The network connector URI grammar (``meshmq.connector_uri``): which bridges a URI
asks for, over which transport, with which reconnect policy, and the error an operator
sees for each kind of mistake (it names the bad part, the connector and the URI)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshmq.config.model import NetworkConnectorConfig
from meshmq.connector_uri import (
    ConnectorPlan,
    activemq_attempts,
    check_uri,
    parse_endpoint,
    plan_connector,
)
from meshmq.errors import ConfigError


def plan(uri: str, **kw: object) -> ConnectorPlan:
    return plan_connector(NetworkConnectorConfig(uri=uri, **kw))  # type: ignore[arg-type]


def targets(p: ConnectorPlan) -> list[list[tuple[str, int, bool]]]:
    return [[(e.host, e.port, e.tls) for e in t] for t in p.targets]


# ---------------------------------------------------------------- targets and transports
@pytest.mark.parametrize(("uri", "tls"), [("tcp://h:1", False), ("nio://h:1", False),
                                          ("ssl://h:1", True)])
def test_a_single_broker_uri_is_one_bridge_and_only_ssl_is_tls(uri: str, tls: bool) -> None:
    assert targets(plan(uri)) == [[("h", 1, tls)]]


def test_static_lists_mix_plain_and_tls_targets_each_on_its_own_bridge() -> None:
    assert targets(plan("static:(tcp://a:1,ssl://b:2,nio://c:3)")) == [
        [("a", 1, False)], [("b", 2, True)], [("c", 3, False)]]


def test_a_bare_static_uri_without_parentheses_is_one_bridge() -> None:
    assert targets(plan("static:tcp://a:61616")) == [[("a", 61616, False)]]


def test_an_ipv6_target_keeps_its_address_without_brackets() -> None:
    (endpoint,), = plan("static:(tcp://[::1]:61616)").targets
    assert (endpoint.host, endpoint.port, endpoint.uri) == ("::1", 61616, "tcp://[::1]:61616")


def test_surrounding_white_space_is_ignored() -> None:
    assert targets(plan("  tcp://a:1 \n")) == [[("a", 1, False)]]


def test_a_failover_list_beside_plain_targets_is_one_bridge_among_several() -> None:
    p = plan("static:(tcp://x:1,failover:(tcp://m:1,tcp://s:2))")
    assert targets(p) == [[("x", 1, False)], [("m", 1, False), ("s", 2, False)]]


def test_a_masterslave_pair_over_tls_keeps_tls_for_each_member() -> None:
    p = plan("masterslave:(ssl://m:1,ssl://s:2)")
    assert targets(p) == [[("m", 1, True), ("s", 2, True)]]


@pytest.mark.parametrize("option", ["verifyHostName", "socket.verifyHostName",
                                    "transport.verifyHostName"])
@pytest.mark.parametrize(("value", "expected"), [("false", False), ("TRUE", True)])
def test_each_spelling_of_the_host_name_check_sets_it_for_that_target(
        option: str, value: str, expected: bool) -> None:
    (endpoint,), = plan(f"static:(ssl://h:1?{option}={value},ssl://k:2)").targets[:1]
    (other,), = plan(f"static:(ssl://h:1?{option}={value},ssl://k:2)").targets[1:]
    assert endpoint.verify_hostname is expected
    assert other.verify_hostname is None  # the connector's own option applies there


def test_a_host_name_check_that_is_not_a_boolean_is_an_error() -> None:
    with pytest.raises(ConfigError, match=r"verifyHostName='maybe' is not true or false"):
        plan("ssl://h:1?verifyHostName=maybe")


def test_an_endpoint_prints_as_its_uri() -> None:
    assert str(parse_endpoint("ssl://h:7?verifyHostName=false")) == \
        "ssl://h:7?verifyHostName=false"


@pytest.mark.parametrize(("text", "fragment"), [
    ("stomp://h:1", "not a broker URI"),
    ("tcp://h", "needs host:port"),
    ("failover:(tcp://a:1)", "not a broker URI"),
    ("tcp://h:1:2", "bad URI"),
])
def test_parse_endpoint_says_what_is_wrong_as_a_value_error(text: str, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        parse_endpoint(text)


# ---------------------------------------------------------------- discovery
def test_a_multicast_uri_plans_discovery_and_no_fixed_targets() -> None:
    p = plan("multicast://239.1.2.3:7000?group=prod")
    assert p.targets == () and p.discovery == "multicast://239.1.2.3:7000?group=prod"


@pytest.mark.parametrize(("uri", "fragment"), [
    ("multicast://10.0.0.1", "not an IPv4 multicast address"),
    ("multicast://default?grup=prod", "did you mean 'group'"),
    ("multicast://default?keepAliveInterval=0", "keepAliveInterval must be >= 1"),
])
def test_a_bad_multicast_connector_uri_is_refused_when_the_connector_is_planned(
        uri: str, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        plan(uri)
    with pytest.raises(ValueError, match=fragment):
        check_uri(uri)


# ---------------------------------------------------------------- reconnect options
@pytest.mark.parametrize(("option", "value", "field", "expected"), [
    ("initialReconnectDelay", "250", "initial_reconnect_delay_ms", 250),
    ("maxReconnectDelay", "9000", "max_reconnect_delay_ms", 9000),
    ("useExponentialBackOff", "FALSE", "use_exponential_backoff", False),
    ("backOffMultiplier", "1.5", "backoff_multiplier", 1.5),
    ("maxReconnectAttempts", "4", "max_reconnect_attempts", 4),
    ("maxReconnectAttempts", "-1", "max_reconnect_attempts", -1),
    ("minConnectTime", "700", "min_connect_time_ms", 700),
])
def test_each_static_option_sets_its_reconnect_key(option: str, value: str, field: str,
                                                   expected: object) -> None:
    p = plan(f"static:(tcp://a:1)?{option}={value}")
    assert getattr(p.config, field) == expected


def test_uri_options_take_precedence_over_the_connectors_keys() -> None:
    p = plan("static:(tcp://a:1)?maxReconnectDelay=10", max_reconnect_delay_ms=99_000,
             initial_reconnect_delay_ms=5)
    assert (p.config.max_reconnect_delay_ms, p.config.initial_reconnect_delay_ms) == (10, 5)


def test_options_leave_every_other_connector_key_alone() -> None:
    base = NetworkConnectorConfig(uri="static:(tcp://a:1)?minConnectTime=1", name="x",
                                  network_ttl=3, duplex=True)
    p = plan_connector(base)
    assert (p.config.name, p.config.network_ttl, p.config.duplex) == ("x", 3, True)
    assert p.config.uri == base.uri


def test_activemqs_zero_attempts_in_a_static_uri_means_for_ever() -> None:
    assert plan("static:(tcp://a:1)?maxReconnectAttempts=0").config \
        .max_reconnect_attempts == -1
    assert [activemq_attempts(v) for v in ("0", "-1", "1", "12")] == [-1, -1, 1, 12]


@pytest.mark.parametrize(("option", "value", "kind"), [
    ("initialReconnectDelay", "1.5", "int"),
    ("maxReconnectDelay", "soon", "int"),
    ("useExponentialBackOff", "yes", "bool"),
    ("backOffMultiplier", "double", "float"),
    ("maxReconnectAttempts", "many", "int"),
    ("minConnectTime", "", "int"),
])
def test_a_static_option_of_the_wrong_type_names_option_value_and_type(
        option: str, value: str, kind: str) -> None:
    with pytest.raises(ConfigError) as err:
        plan(f"static:(tcp://a:1)?{option}={value}", name="to-hub")
    text = str(err.value)
    assert f"static: option {option}={value!r} is not a {kind}" in text
    assert "network connector 'to-hub'" in text and "(uri 'static:" in text


def test_an_unknown_static_option_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError) as err:
        plan("static:(tcp://a:1)?networkTTL=2")
    text = str(err.value)
    assert "unknown static: option 'networkTTL'" in text
    assert "initialReconnectDelay" in text and "minConnectTime" in text


@pytest.mark.parametrize("option", ["randomize=false", "maxReconnectAttempts=0",
                                    "initialReconnectDelay=1", "maxReconnectDelay=2",
                                    "useExponentialBackOff=false", "timeout=3000",
                                    "startupMaxReconnectAttempts=1",
                                    "reconnectDelayExponent=2", "nested.wireFormat.x=1"])
def test_failover_options_inside_static_are_accepted_and_change_nothing(option: str) -> None:
    p = plan(f"static:(failover:(tcp://m:1,tcp://s:2)?{option})")
    default = NetworkConnectorConfig(uri="x")
    assert targets(p) == [[("m", 1, False), ("s", 2, False)]]
    assert (p.config.max_reconnect_attempts, p.config.initial_reconnect_delay_ms) == \
        (default.max_reconnect_attempts, default.initial_reconnect_delay_ms)


# ---------------------------------------------------------------- shapes that are refused
@pytest.mark.parametrize(("uri", "fragment"), [
    ("failover:(tcp://a:1,tcp://b:1)", "a failover: URI must be wrapped"),
    ("discovery:(multicast://default)", "discovery: is a client URI"),
    ("static:(static:(tcp://a:1))", "static: cannot be nested in static:"),
    ("static:(masterslave:(tcp://a:1,tcp://b:1))", "masterslave: cannot be nested"),
    ("static:()", "needs at least one URI"),
    ("static:(multicast://default)", "'multicast://default' is not a broker URI"),
    ("masterslave:(tcp://a:1,failover:(tcp://b:1))", "is not a broker URI"),
    ("masterslave:(ssl://a:1)", "needs at least two URIs"),
    ("bogus://a:1", "unknown scheme"),
    ("", "empty URI"),
])
def test_a_connector_uri_of_the_wrong_shape_says_how_to_write_it(uri: str,
                                                                 fragment: str) -> None:
    with pytest.raises(ConfigError) as err:
        plan(uri)
    assert fragment in str(err.value)


def test_check_uri_raises_plain_value_errors_for_the_config_loaders() -> None:
    check_uri("static:(tcp://a:1,tcp://b:2)")  # valid: nothing to report
    with pytest.raises(ValueError) as err:
        check_uri("static:(tcp://a)")
    assert not isinstance(err.value, ConfigError)
    assert str(err.value) == "'tcp://a' needs host:port"


# ---------------------------------------------------------------- any URI
hosts = st.lists(st.text("abcxyz019-", min_size=1, max_size=8).map(lambda s: "h" + s),
                 min_size=1, max_size=3).map(".".join)
broker_uris = st.tuples(st.sampled_from(["tcp", "ssl", "nio"]), hosts, st.integers(1, 65535))


@settings(max_examples=40)
@given(st.lists(st.tuples(st.lists(broker_uris, min_size=1, max_size=3), st.booleans()),
                min_size=1, max_size=4),
       st.integers(0, 100_000), st.integers(-1, 50))
def test_any_written_static_uri_plans_exactly_its_targets(
        groups: list[tuple[list[tuple[str, str, int]], bool]], delay: int,
        attempts: int) -> None:
    """A list of one is written bare or as failover:(...) (the same bridge either way)."""
    parts = []
    for group, bare in groups:
        uris = [f"{s}://{h}:{p}" for s, h, p in group]
        parts.append(uris[0] if bare and len(uris) == 1 else f"failover:({','.join(uris)})")
    text = f"static:({','.join(parts)})?initialReconnectDelay={delay}" \
        f"&maxReconnectAttempts={attempts}"
    p = plan(text)
    assert targets(p) == [[(h, port, s == "ssl") for s, h, port in g] for g, _ in groups]
    assert p.config.initial_reconnect_delay_ms == delay
    assert p.config.max_reconnect_attempts == (-1 if attempts == 0 else attempts)


@given(st.text(st.sampled_from("static:masterslave:failover(),?=&tcp://ssl:a1b.[]:%"),
               max_size=60))
def test_any_text_is_planned_or_refused_with_a_config_error(text: str) -> None:
    try:
        p = plan_connector(NetworkConnectorConfig(uri=text))
    except ConfigError as exc:
        assert "network connector 'NC'" in str(exc)
        return
    assert p.discovery is not None or all(p.targets)
