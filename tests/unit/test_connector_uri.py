"""Network connector URIs -> bridges and their targets."""

from __future__ import annotations

import pytest

from meshmq.config.model import NetworkConnectorConfig
from meshmq.connector_uri import plan_connector
from meshmq.errors import ConfigError


def plan(uri: str):
    return plan_connector(NetworkConnectorConfig(uri=uri))


def hosts(p) -> list[list[str]]:
    return [[f"{e.host}:{e.port}" for e in t] for t in p.targets]


@pytest.mark.parametrize(("uri", "expected"), [
    ("tcp://a:61616", [["a:61616"]]),
    ("nio://a:1", [["a:1"]]),
    ("static:(tcp://a:1,tcp://b:2)", [["a:1"], ["b:2"]]),
    ("static://(tcp://a:1,tcp://b:2)", [["a:1"], ["b:2"]]),  # the seeds' spelling
    ("static:(failover:(tcp://m:1,tcp://s:2)?randomize=false&maxReconnectAttempts=0)",
     [["m:1", "s:2"]]),
    ("static:failover:(tcp://m:1,tcp://s:2)?randomize=false&maxReconnectAttempts=0",
     [["m:1", "s:2"]]),
    ("masterslave:(tcp://m:1,tcp://s:2,tcp://t:3)", [["m:1", "s:2", "t:3"]]),
    ("masterslave://(tcp://m:1,tcp://s:2)", [["m:1", "s:2"]]),
])
def test_targets(uri: str, expected: list[list[str]]) -> None:
    assert hosts(plan(uri)) == expected


def test_static_options_set_the_reconnect_policy() -> None:
    p = plan("static:(tcp://a:1)?initialReconnectDelay=5&maxReconnectDelay=50"
             "&useExponentialBackOff=false&backOffMultiplier=3&maxReconnectAttempts=7")
    c = p.config
    assert (c.initial_reconnect_delay_ms, c.max_reconnect_delay_ms, c.use_exponential_backoff,
            c.backoff_multiplier, c.max_reconnect_attempts) == (5, 50, False, 3.0, 7)
    assert plan("masterslave:(tcp://m:1,tcp://s:2)?maxReconnectDelay=9").config \
        .max_reconnect_delay_ms == 9


def test_multicast_is_discovery() -> None:
    p = plan("multicast://default")
    assert p.targets == () and p.discovery == "multicast://default"


@pytest.mark.parametrize(("uri", "fragment"), [
    ("static:(tcp://a)", "needs host:port"),
    ("static:(http://a:1)", "unknown scheme"),
    ("static:(stomp://a:1)", "not a broker URI"),
    ("static:(tcp://a:1)?bogus=1", "unknown static: option 'bogus'"),
    ("static:(tcp://a:1)?maxReconnectAttempts=x", "maxReconnectAttempts='x' is not a int"),
    ("static:(tcp://a:1", "unbalanced"),
    ("masterslave:(tcp://a:1)", "at least two"),
    ("static:(failover:(tcp://a:1)?nope=1)", "unknown failover: option 'nope'"),
])
def test_bad_uris_name_the_bad_part(uri: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as err:
        plan(uri)
    assert fragment in str(err.value) and "NC" in str(err.value)
