"""[[network_connectors]], broker.network_connector_start_async and listener discovery_uri
in TOML: mapping, and each mistake located at file:line:option."""

from pathlib import Path

import pytest

from meshmq.config.load import load_config
from meshmq.config.model import BrokerConfig, ListenerConfig, NetworkConnectorConfig
from meshmq.config.toml_loader import check_connector_uri
from meshmq.errors import ConfigError


def load(tmp_path: Path, text: str) -> BrokerConfig:
    path = tmp_path / "meshmq.toml"
    path.write_text(text)
    return load_config(path)


def test_connectors_map_onto_the_model(tmp_path: Path) -> None:
    config = load(tmp_path, """
[broker]
name = "hub"
network_connector_start_async = true

[[listeners]]
name = "bridges"
url = "tcp://127.0.0.1:61616"
discovery_uri = "multicast://default?group=prod"

[[network_connectors]]
name = "to-spokes"
uri = "static:(tcp://10.0.0.2:61616,tcp://10.0.0.3:61616)"
username = "bridge"
password = "secret"
duplex = true
conduit_subscriptions = false
network_ttl = -1
message_ttl = 3
consumer_ttl = 1
consumer_priority_base = -10
prefetch_size = 1
excluded_destinations = ["queue://internal.>", "topic://ActiveMQ.Advisory.>"]
dynamically_included_destinations = ["queue://orders.*", "topic://prices.>"]
statically_included_destinations = ["queue://audit"]
replay_when_no_consumers = true
replay_delay_ms = 500
rate_limit = 100
backoff_multiplier = 1.5
max_reconnect_attempts = -1

[[network_connectors]]
name = "discovered"
uri = "multicast://default"
""")
    assert config.network_connector_start_async is True
    assert config.listeners == (ListenerConfig(
        name="bridges", protocol="tcp", host="127.0.0.1", port=61616,
        discovery_uri="multicast://default?group=prod"),)
    spokes, discovered = config.network_connectors
    assert spokes == NetworkConnectorConfig(
        uri="static:(tcp://10.0.0.2:61616,tcp://10.0.0.3:61616)", name="to-spokes",
        username="bridge", password="secret", duplex=True, conduit_subscriptions=False,
        network_ttl=-1, message_ttl=3, consumer_ttl=1, consumer_priority_base=-10,
        prefetch_size=1,
        excluded_destinations=("queue://internal.>", "topic://ActiveMQ.Advisory.>"),
        dynamically_included_destinations=("queue://orders.*", "topic://prices.>"),
        statically_included_destinations=("queue://audit",),
        replay_when_no_consumers=True, replay_delay_ms=500, rate_limit=100,
        backoff_multiplier=1.5, max_reconnect_attempts=-1)
    assert discovered == NetworkConnectorConfig(uri="multicast://default", name="discovered")


def test_no_connectors_by_default(tmp_path: Path) -> None:
    config = load(tmp_path, "[broker]\nname = 'b'\n")
    assert config.network_connectors == ()
    assert config.network_connector_start_async is False


NC = "[[network_connectors]]\nuri = 'tcp://h:61616'\n"

# Each row: file text, the line and option the error must name, and words of the reason.
ERRORS = [
    pytest.param("[[network_connectors]]\nname = 'a'\n", 1, "network_connectors[0].uri",
                 "missing required option 'uri'", id="uri-required"),
    pytest.param(NC + "networkTTL = 2\n", 3, "network_connectors[0].networkTTL",
                 "did you mean 'network_ttl'?", id="camel-case-key"),
    pytest.param(NC + "initialReconnectDelay = 5\n", 3,
                 "network_connectors[0].initialReconnectDelay",
                 "did you mean 'initial_reconnect_delay_ms'?", id="camel-case-key-ms"),
    pytest.param(NC + "conduit_subscription = false\n", 3,
                 "network_connectors[0].conduit_subscription",
                 "did you mean 'conduit_subscriptions'?", id="typo"),
    pytest.param(NC + "network_ttl = 0\n", 3, "network_connectors[0].network_ttl",
                 "must be -1 (unlimited) or at least 1 hop, got 0", id="ttl-zero"),
    pytest.param(NC + "message_ttl = -2\n", 3, "network_connectors[0].message_ttl",
                 "must be >= -1, got -2", id="ttl-below-minus-one"),
    pytest.param(NC + "consumer_ttl = 0\n", 3, "network_connectors[0].consumer_ttl",
                 "got 0", id="consumer-ttl-zero"),
    pytest.param(NC + "prefetch_size = 0\n", 3, "network_connectors[0].prefetch_size",
                 "must be >= 1, got 0 (a bridge's consumer never polls", id="prefetch-zero"),
    pytest.param(NC + "replay_delay_ms = -1\n", 3, "network_connectors[0].replay_delay_ms",
                 "must be >= 0", id="delay-negative"),
    pytest.param(NC + "initial_reconnect_delay_ms = -5\n", 3,
                 "network_connectors[0].initial_reconnect_delay_ms", "must be >= 0",
                 id="reconnect-delay-negative"),
    pytest.param(NC + "initial_reconnect_delay_ms = 5000\nmax_reconnect_delay_ms = 100\n", 4,
                 "network_connectors[0].max_reconnect_delay_ms",
                 "must be >= initial_reconnect_delay_ms (5000), got 100", id="max-below-initial"),
    pytest.param(NC + "backoff_multiplier = 0.5\n", 3,
                 "network_connectors[0].backoff_multiplier", "must be >= 1.0",
                 id="multiplier-below-one"),
    pytest.param(NC + "rate_duration_ms = 0\n", 3, "network_connectors[0].rate_duration_ms",
                 "must be >= 1", id="rate-window-zero"),
    pytest.param(NC + "duplex = 'yes'\n", 3, "network_connectors[0].duplex",
                 "expected true or false", id="bool-type"),
    pytest.param(NC + "name = ''\n", 3, "network_connectors[0].name", "must not be empty",
                 id="empty-name"),
    pytest.param("[[network_connectors]]\nuri = 'tcp://a:1'\n\n[[network_connectors]]\n"
                 "uri = 'tcp://b:1'\n", 4, "network_connectors[1].name",
                 "duplicate network connector name 'NC'", id="duplicate-default-name"),
    pytest.param("[[network_connectors]]\nuri = 'failover:(tcp://a:1,tcp://b:1)'\n", 2,
                 "network_connectors[0].uri", "must be wrapped: 'static:(failover:",
                 id="bare-failover"),
    pytest.param("[[network_connectors]]\nuri = 'http://a:1'\n", 2,
                 "network_connectors[0].uri", "unknown network connector scheme 'http:'",
                 id="unknown-scheme"),
    pytest.param("[[network_connectors]]\nuri = 'static:()'\n", 2,
                 "network_connectors[0].uri", "static: needs at least one URI", id="static-empty"),
    pytest.param("[[network_connectors]]\nuri = 'static:(tcp://a:1'\n", 2,
                 "network_connectors[0].uri", "unbalanced '('", id="static-parens"),
    pytest.param("[[network_connectors]]\nuri = 'masterslave:(tcp://a:1)'\n", 2,
                 "network_connectors[0].uri", "masterslave: needs at least two URIs",
                 id="masterslave-one"),
    pytest.param("[[network_connectors]]\nuri = 'tcp://host'\n", 2,
                 "network_connectors[0].uri", "'tcp://host' needs host:port", id="tcp-no-port"),
    pytest.param("[[network_connectors]]\nuri = 'multicast://default?keepAlive=5'\n", 2,
                 "network_connectors[0].uri",
                 "unknown multicast URI option 'keepAlive'; did you mean 'keepAliveInterval'?",
                 id="multicast-option"),
    pytest.param("[[network_connectors]]\nuri = 'multicast://10.1.1.1:6155'\n", 2,
                 "network_connectors[0].uri", "'10.1.1.1' is not an IPv4 multicast address",
                 id="multicast-not-multicast"),
    pytest.param(NC + "excluded_destinations = [\n  'queue://a',\n  'b.>',\n]\n", 5,
                 "network_connectors[0].excluded_destinations[1]",
                 "not a destination like 'queue://orders.>'", id="destination-no-kind"),
    pytest.param(NC + "dynamically_included_destinations = ['queue://a.>.b']\n", 3,
                 "network_connectors[0].dynamically_included_destinations[0]",
                 "'>' must be the last segment", id="destination-bad-wildcard"),
    pytest.param(NC + "statically_included_destinations = ['queues://a']\n", 3,
                 "network_connectors[0].statically_included_destinations[0]",
                 "unknown destination kind", id="destination-bad-kind"),
    pytest.param(NC + "excluded_destinations = 'queue://a'\n", 3,
                 "network_connectors[0].excluded_destinations", "expected an array",
                 id="destinations-not-array"),
    pytest.param("[broker]\nnetwork_connector_start_async = 1\n", 2,
                 "broker.network_connector_start_async", "expected true or false",
                 id="start-async-type"),
    pytest.param("[[listeners]]\nname = 's'\nport = 1\ndiscovery_uri = 'multicast://default'\n",
                 4, "listeners[0].discovery_uri",
                 "only tcp, ssl and nio listeners carry broker links", id="discovery-on-stomp"),
    pytest.param("[[listeners]]\nurl = 'tcp://h:1'\ndiscovery_uri = 'static:(tcp://a:1)'\n",
                 3, "listeners[0].discovery_uri", "not a multicast:// URI",
                 id="discovery-not-multicast"),
    pytest.param("[[listeners]]\nurl = 'tcp://h:1'\n"
                 "discovery_uri = 'multicast://default?timeToLive=300'\n",
                 3, "listeners[0].discovery_uri", "timeToLive must be <= 255",
                 id="discovery-ttl"),
]


@pytest.mark.parametrize(("text", "line", "option", "reason"), ERRORS)
def test_errors_name_file_line_and_option(tmp_path: Path, text: str, line: int, option: str,
                                          reason: str) -> None:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, text)
    err = info.value
    assert (err.file, err.line, err.option) == (str(tmp_path / "meshmq.toml"), line, option)
    assert reason in err.reason


@pytest.mark.parametrize("uri", [
    "static:(tcp://a:61616,tcp://b:61616)",
    "static://(tcp://localhost:61626,tcp://localhost:61627)",
    "static:(tcp://a:1)?initialReconnectDelay=100&useExponentialBackOff=false",
    "static:tcp://a:1",
    "static:failover:(tcp://a:1,tcp://b:1)?randomize=false&maxReconnectAttempts=0",
    "static:(failover:(tcp://a:1,tcp://b:1)?randomize=false&maxReconnectAttempts=0)",
    "masterslave:(tcp://master:61616,tcp://slave:61616)",
    "masterslave:(tcp://m:1,tcp://s1:1,tcp://s2:1)",
    "multicast://default",
    "multicast://239.1.2.3:7000?group=g&keepAliveInterval=100&discovered.x=1",
    "tcp://127.0.0.1:61616",
    "ssl://h:61617",
    "nio://h:61616",
])
def test_connector_uri_forms_accepted(uri: str) -> None:
    check_connector_uri(uri)


@pytest.mark.parametrize(("uri", "reason"), [
    ("61616", "not a network connector URI"),
    ("static:(foo)", "missing scheme (expected e.g. tcp://host:port) ('foo')"),
    ("static:(stomp://a:1)", "'stomp://a:1' is not a broker URI"),
    ("static:(tcp://a:1,,)", "empty URI in the list"),
    ("masterslave:()", "masterslave: needs at least one URI"),
    ("vm://localhost", "unknown network connector scheme 'vm:'"),
    ("MASTERSLAVE:(tcp://m:1,tcp://s:1)", "write the scheme 'MASTERSLAVE:' in lower case"),
    ("Tcp://h:1", "write the scheme 'Tcp:' in lower case"),
])
def test_connector_uri_forms_rejected(uri: str, reason: str | None) -> None:
    if reason is None:
        check_connector_uri(uri)
        return
    with pytest.raises(ValueError, match=reason.replace("(", r"\(").replace(")", r"\)")):
        check_connector_uri(uri)
