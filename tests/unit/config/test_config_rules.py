"""The TOML loader's rules for master/slave HA, the store, authorization, management,
metrics, streams, logging, trace and advertised peers: each distinct mistake an operator
can write is one error naming the file, the line and the option, and the valid forms
build the model they describe."""

from __future__ import annotations

from pathlib import Path

import pytest

from meshmq.config.model import (
    AuthorizationConfig,
    AuthorizationEntry,
    AuthorizationRights,
    HaConfig,
    LoggingConfig,
    MetricsConfig,
    StreamPolicy,
)
from meshmq.config.toml_loader import loads_toml
from meshmq.errors import ConfigError

FILE = "/etc/meshmq/broker.toml"
REPLICATED = ('[ha]\nmode = "replicated"\nlisten = "10.0.0.1:7000"\n'
              'members = ["10.0.0.2:7000", "10.0.0.3:7000"]\n')
POSTGRES = '[store]\nkind = "postgres"\ndsn = "host=db dbname=meshmq"\n'

# Each row: file text, the line and option the error must name, and the reason's words.
ERRORS = [
    # The store and master/slave HA.
    pytest.param('[store]\nkind = "postgres"\n', 1, "store.dsn",
                 "store kind 'postgres' needs a dsn", id="postgres-without-dsn"),
    pytest.param('[broker]\npersistent = false\n[ha]\nmode = "shared"\n', 4, "ha.mode",
                 "ha mode 'shared' needs a persistent journal or postgres store",
                 id="ha-without-persistence"),
    pytest.param('[store]\nkind = "memory"\n[ha]\nmode = "database"\n', 4, "ha.mode",
                 "ha mode 'database' needs a persistent journal or postgres store",
                 id="ha-on-memory-store"),
    pytest.param(POSTGRES + '[ha]\nmode = "shared"\n', 5, "ha.mode",
                 "with a postgres store use mode 'database'", id="shared-on-postgres"),
    pytest.param('[ha]\nmode = "database"\n', 2, "ha.mode",
                 "keeps its lease row in the postgres store; set store.kind = 'postgres'",
                 id="database-on-journal"),
    pytest.param('[ha]\nmode = "shared"\nlease_ms = 1000\nkeepalive_ms = 501\n', 4,
                 "ha.keepalive_ms", "keepalive_ms (501) must be at most half of lease_ms "
                 "(1000)", id="keepalive-over-half-the-lease"),
    pytest.param('[ha]\nmode = "shared"\nholder_id = "' + "h" * 65 + '"\n', 3,
                 "ha.holder_id", "holder_id must be 1 to 64 bytes", id="holder-id-too-long"),
    pytest.param('[ha]\nlease_ms = 99\n', 2, "ha.lease_ms", "must be >= 100, got 99",
                 id="lease-too-short"),
    pytest.param('[ha]\nacquire_interval_ms = 5\n', 2, "ha.acquire_interval_ms",
                 "must be >= 10, got 5", id="acquire-interval-too-short"),
    pytest.param('[ha]\nmode = "cluster"\n', 2, "ha.mode",
                 "must be one of 'none', 'shared', 'database', 'replicated', got 'cluster'",
                 id="ha-mode-choice"),
    pytest.param('[ha]\nrole = "voter"\n', 2, "ha.role",
                 "must be one of 'broker', 'witness', got 'voter'", id="ha-role-choice"),
    # Replicated HA.
    pytest.param(POSTGRES + REPLICATED, 5, "ha.mode",
                 "ha mode 'replicated' copies a journal store to every node",
                 id="replicated-on-postgres"),
    pytest.param('[ha]\nmode = "replicated"\nmembers = ["b:1"]\n', 1, "ha.listen",
                 "needs listen = \"HOST:PORT\"", id="replicated-without-listen"),
    pytest.param('[ha]\nmode = "replicated"\nlisten = "a:1"\n', 1, "ha.members",
                 "needs members = [\"HOST:PORT\", ...]", id="replicated-without-members"),
    pytest.param('[ha]\nmode = "replicated"\nlisten = "a:1"\nmembers = [\n  "b:1",\n'
                 '  "c",\n]\n', 6, "ha.members[1]", "'c' is not a HOST:PORT address",
                 id="member-without-port"),
    pytest.param('[ha]\nmode = "replicated"\nlisten = "a:0"\nmembers = ["b:1"]\n', 3,
                 "ha.listen", "'a:0' is not a HOST:PORT address", id="listen-port-zero"),
    pytest.param('[ha]\nmode = "replicated"\nlisten = ":7000"\nmembers = ["b:1"]\n', 3,
                 "ha.listen", "':7000' is not a HOST:PORT address", id="listen-without-host"),
    pytest.param('[ha]\nmode = "replicated"\nlisten = "a:1"\nmembers = ["b:70000"]\n', 4,
                 "ha.members[0]", "'b:70000' is not a HOST:PORT address",
                 id="member-port-out-of-range"),
    pytest.param('[ha]\nmode = "replicated"\nlisten = "a:1"\nmembers = ["a:1", "b:1"]\n', 4,
                 "ha.members", "members must list each other node once, not this one",
                 id="members-name-this-node"),
    pytest.param('[ha]\nmode = "replicated"\nlisten = "a:1"\nmembers = ["b:1", "b:1"]\n', 4,
                 "ha.members", "members must list each other node once",
                 id="member-listed-twice"),
    pytest.param(REPLICATED + 'node_id = ""\n', 5, "ha.node_id",
                 "node_id must be 1 to 64 bytes", id="empty-node-id"),
    # Authorization.
    pytest.param('[[auth.authorization.entries]]\nread = ["apps"]\n', 1,
                 "auth.authorization.entries[0]",
                 "an authorization entry names a queue or a topic pattern", id="entry-no-kind"),
    pytest.param('[[auth.authorization.entries]]\nqueue = "a.>"\ntopic = "b.>"\n', 3,
                 "auth.authorization.entries[0].topic",
                 "give either 'queue' or 'topic' in one entry, not both", id="entry-both"),
    pytest.param('[[auth.authorization.entries]]\nqueue = "a..b"\n', 2,
                 "auth.authorization.entries[0].queue",
                 "not a destination pattern like 'orders.>': destination 'a..b' has an "
                 "empty segment", id="entry-bad-pattern"),
    pytest.param('[[auth.authorization.entries]]\nqueue = "a"\nread = "apps"\n', 3,
                 "auth.authorization.entries[0].read", "expected an array, got string",
                 id="rights-not-an-array"),
    pytest.param('[auth.authorization]\nentry = []\n', 2, "auth.authorization.entry",
                 "did you mean 'entries'?", id="authorization-typo"),
    pytest.param('[auth.authorization.default]\nwrite = ["a"]\nbrowse = ["b"]\n', 3,
                 "auth.authorization.default.browse", "unknown option", id="unknown-right"),
    # Management and metrics.
    pytest.param('[management]\nssl_keyfile = "k.pem"\n', 2, "management.ssl_keyfile",
                 "ssl_keyfile needs ssl_certfile", id="management-key-without-cert"),
    pytest.param('[management]\nenabled = true\nhost = "0.0.0.0"\n', 3, "management.host",
                 "'0.0.0.0' is not a loopback address and no users are configured",
                 id="management-open-to-the-network"),
    pytest.param('[management]\nadmin_group = " "\n', 2, "management.admin_group",
                 "must not be empty", id="empty-admin-group"),
    pytest.param('[management.metrics]\ndestinations = ["orders.>", "a..b"]\n', 2,
                 "management.metrics.destinations[1]", "destination 'a..b' has an empty "
                 "segment", id="metrics-pattern"),
    pytest.param('[management.metrics]\nmax_destinations = 0\n', 2,
                 "management.metrics.max_destinations", "must be >= 1, got 0",
                 id="metrics-max-zero"),
    # Streams.
    pytest.param('[[streams]]\nmatch = "topic://log.>"\n', 2, "streams[0].match",
                 "streams are queues: use a queue:// pattern", id="stream-topic"),
    pytest.param('[[streams]]\nmatch = "temp-queue://log"\n', 2, "streams[0].match",
                 "streams are queues", id="stream-temporary"),
    pytest.param('[[streams]]\nmatch = "log.>"\n', 2, "streams[0].match",
                 "not a queue pattern like 'queue://stream.>'", id="stream-no-kind"),
    pytest.param('[[streams]]\nmax_bytes = "huge"\n', 2, "streams[0].max_bytes",
                 "not a size: 'huge'", id="stream-size"),
    # Advertised peers.
    pytest.param('[broker]\nadvertised_peers = "stomp://b:61613, bogus"\n', 2,
                 "broker.advertised_peers", "bad URI 'bogus': missing scheme",
                 id="peer-without-scheme"),
    pytest.param('[broker]\nadvertised_peers = "failover:(stomp://b:61613)"\n', 2,
                 "broker.advertised_peers", "not a failover:(...) URI",
                 id="peer-composite"),
    pytest.param('[broker]\nadvertised_peers = "failover:(stomp://b:61613,stomp://c:61613)"\n',
                 2, "broker.advertised_peers",
                 "list each peer's client URI, comma separated", id="peer-failover-list"),
    pytest.param('[broker]\nadvertised_peers = "static:stomp://b:61613"\n', 2,
                 "broker.advertised_peers", "a peer is one endpoint URI, not a composite",
                 id="peer-static"),
    # Logging and trace.
    pytest.param('[logging]\nlevel = "loud"\n', 2, "logging.level",
                 "must be one of 'debug', 'info', 'warning', 'error', 'critical'",
                 id="log-level"),
    pytest.param('[logging]\nloggers = { "meshmq.network" = "verbose" }\n', 2,
                 'logging.loggers["meshmq.network"]', "got 'verbose'", id="logger-level"),
    pytest.param('[logging]\nloggers = ["meshmq"]\n', 2, "logging.loggers",
                 "expected a table, got array", id="loggers-not-a-table"),
    pytest.param('[logging]\nformat = "xml"\n', 2, "logging.format",
                 "must be one of 'text', 'json', got 'xml'", id="log-format"),
    pytest.param('[trace]\nformat = "csv"\n', 2, "trace.format",
                 "must be one of 'jsonl', 'parquet', got 'csv'", id="trace-format"),
    pytest.param('[trace]\nsample_rate = -0.1\n', 2, "trace.sample_rate",
                 "must be >= 0.0, got -0.1", id="trace-sample-rate"),
    pytest.param('[trace]\nflush_interval_ms = 0\n', 2, "trace.flush_interval_ms",
                 "must be >= 1, got 0", id="trace-flush-interval"),
    # Values of the wrong kind anywhere.
    pytest.param('[stomp]\nmax_headers = 1.5\n', 2, "stomp.max_headers",
                 "expected an integer, got number 1.5", id="fraction-for-an-integer"),
    pytest.param('[auth]\nusers = { name = "x" }\n', 2, "auth.users",
                 "expected an array, got table", id="table-for-an-array"),
    pytest.param('[broker]\nexpiry_check_interval_ms = -1\n', 2,
                 "broker.expiry_check_interval_ms", "must be >= 0, got -1",
                 id="negative-interval"),
    pytest.param('[[policies]]\npage_size = 0\n', 2, "policies[0].page_size",
                 "must be >= 1, got 0", id="page-size-zero"),
    pytest.param('[[listeners]]\nname = "a"\nport = 1\nmax_connections = 0\n', 4,
                 "listeners[0].max_connections", "must be >= 1, got 0",
                 id="no-connections-allowed"),
    pytest.param('[auth]\nanonymous_user = ""\n', 2, "auth.anonymous_user",
                 "must not be empty", id="empty-anonymous-user"),
]


@pytest.mark.parametrize(("text", "line", "option", "reason"), ERRORS)
def test_each_mistake_names_file_line_and_option(text: str, line: int, option: str,
                                                 reason: str) -> None:
    with pytest.raises(ConfigError) as info:
        loads_toml(text, file=FILE)
    err = info.value
    assert (err.file, err.line, err.option) == (FILE, line, option)
    assert reason in err.reason
    assert str(err).startswith(f"{FILE}:{line}, option {option!r}: ")
    assert "\n" not in str(err)


def test_replicated_ha_builds_its_model() -> None:
    config = loads_toml(REPLICATED + 'node_id = "n1"\ncan_be_master = false\n'
                        'synchronous = false\nlog_retain_bytes = "16 mb"\n'
                        'ssl_certfile = "tls/node.pem"\nssl_cafile = "tls/ca.pem"\n'
                        'user = "repl"\npassword = "pw"\n', base_dir=Path("/srv/m"))
    assert config.ha == HaConfig(
        mode="replicated", listen="10.0.0.1:7000", members=("10.0.0.2:7000", "10.0.0.3:7000"),
        node_id="n1", can_be_master=False, synchronous=False, log_retain_bytes=16 * 1024**2,
        ssl_certfile=Path("/srv/m/tls/node.pem"), ssl_cafile=Path("/srv/m/tls/ca.pem"),
        user="repl", password="pw")


def test_a_witness_needs_no_journal_of_its_own() -> None:
    config = loads_toml(POSTGRES + REPLICATED + 'role = "witness"\n')
    assert (config.ha.role, config.store.kind) == ("witness", "postgres")


@pytest.mark.parametrize(("text", "mode", "kind"), [
    pytest.param('[ha]\nmode = "shared"\n', "shared", "journal", id="shared-journal"),
    pytest.param(POSTGRES + '[ha]\nmode = "database"\n', "database", "postgres",
                 id="database-postgres"),
    pytest.param('[ha]\nmode = "shared"\nlease_ms = 1000\nkeepalive_ms = 500\n', "shared",
                 "journal", id="keepalive-exactly-half"),
])
def test_lease_modes_that_fit_their_store_load(text: str, mode: str, kind: str) -> None:
    config = loads_toml(text)
    assert (config.ha.mode, config.store.kind) == (mode, kind)


def test_an_authorization_map_builds_its_model() -> None:
    config = loads_toml("""\
[[auth.authorization.entries]]
queue = "orders.>"
read = ["apps"]
write = ["apps", "admins"]

[[auth.authorization.entries]]
topic = "prices.*"
read = ["*"]

[auth.authorization.default]
admin = ["admins"]

[auth.authorization.temp]
read = ["*"]
write = ["*"]
""")
    assert config.auth.authorization == AuthorizationConfig(
        entries=(AuthorizationEntry(queue="orders.>", read=("apps",),
                                    write=("apps", "admins")),
                 AuthorizationEntry(topic="prices.*", read=("*",))),
        default=AuthorizationRights(admin=("admins",)),
        temp=AuthorizationRights(read=("*",), write=("*",)))


def test_without_an_authorization_table_everything_is_allowed() -> None:
    assert loads_toml("[auth]\nanonymous_access = true\n").auth.authorization is None


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1"])
def test_management_on_loopback_needs_no_users(host: str) -> None:
    assert loads_toml(f'[management]\nhost = "{host}"\n').management.host == host


def test_management_off_loopback_loads_with_users_or_disabled() -> None:
    with_users = loads_toml('[management]\nhost = "0.0.0.0"\n'
                            '[[auth.users]]\nname = "ops"\npassword = "pw"\n')
    assert with_users.management.host == "0.0.0.0"
    disabled = loads_toml('[management]\nenabled = false\nhost = "0.0.0.0"\n')
    assert disabled.management.enabled is False


def test_metrics_logging_and_streams_build_their_models() -> None:
    config = loads_toml("""\
[management.metrics]
destinations = ["orders.>", "audit"]
max_destinations = 20

[logging]
level = "warning"
loggers = { "meshmq.network" = "debug" }
file = "log/broker.log"
max_file_bytes = "1 mb"
format = "json"

[[streams]]
match = "queue://events.>"
max_bytes = "2 gb"
max_age_ms = 86400000
""", base_dir=Path("/srv/m"))
    assert config.management.metrics == MetricsConfig(destinations=("orders.>", "audit"),
                                                      max_destinations=20)
    assert config.logging == LoggingConfig(level="warning", loggers={"meshmq.network": "debug"},
                                           file=Path("/srv/m/log/broker.log"),
                                           max_file_bytes=1024**2, format="json")
    assert config.streams == (StreamPolicy(match="queue://events.>", max_bytes=2 * 1024**3,
                                           max_age_ms=86_400_000),)


def test_advertised_peers_are_split_and_trimmed() -> None:
    config = loads_toml('[broker]\nadvertised_peers = " stomp://b:61613 , mqtt://b:1883,"\n')
    assert config.advertised_peer_list == ("stomp://b:61613", "mqtt://b:1883")
