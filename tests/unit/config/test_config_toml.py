"""The TOML loader: mapping, defaults, and one table row per kind of mistake."""

import dataclasses
import typing
from pathlib import Path

import pytest

from meshmq.config import model
from meshmq.config.load import default_config, load_config
from meshmq.config.model import (
    BrokerConfig,
    DestinationPolicy,
    ListenerConfig,
    NetworkConnectorConfig,
    User,
)
from meshmq.config.sizes import format_size
from meshmq.config.toml_loader import (
    SIZE_FIELDS,
    loads_toml,
    option_key,
    split_listener_url,
    toml_positions,
)
from meshmq.errors import ConfigError

EXAMPLE = Path(__file__).parents[3] / "examples" / "meshmq.toml"


def load(tmp_path: Path, text: str, name: str = "meshmq.toml") -> BrokerConfig:
    path = tmp_path / name
    path.write_text(text)
    return load_config(path)


def test_empty_file_is_the_defaults(tmp_path: Path) -> None:
    config = load(tmp_path, "")
    assert config.source == str(tmp_path / "meshmq.toml")
    assert dataclasses.replace(config, source=None) == BrokerConfig() == default_config()


def _toml_value(cls: type, name: str, value: object) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if f"{cls.__name__}.{name}" in SIZE_FIELDS:
        return f'"{format_size(typing.cast(int, value))}"'
    if isinstance(value, str | Path):
        return f'"{value}"'
    if isinstance(value, tuple):
        return "[" + ", ".join(_toml_value(cls, name, v) for v in value) + "]"
    return repr(value)


def _toml_table(obj: object) -> list[str]:
    return [f"{option_key(type(obj), f.name)} = "
            f"{_toml_value(type(obj), f.name, getattr(obj, f.name))}"
            for f in dataclasses.fields(obj)  # type: ignore[arg-type]
            if getattr(obj, f.name) is not None and f.name != "source"
            and not (isinstance(getattr(obj, f.name), tuple) and getattr(obj, f.name)
                     and dataclasses.is_dataclass(getattr(obj, f.name)[0]))
            and not dataclasses.is_dataclass(getattr(obj, f.name))]


def test_every_option_written_out_round_trips(tmp_path: Path) -> None:
    """Spelling out every default by its documented key gives the defaults back."""
    defaults = BrokerConfig(data_directory=tmp_path / "data",
                            auth=model.AuthConfig(users=(User("u", "p", ("g",)),)),
                            network_connectors=(NetworkConnectorConfig(uri="tcp://h:61616"),),
                            streams=(model.StreamPolicy(),))
    lines = ["[broker]", *_toml_table(defaults)]
    for section in ("stomp", "store", "usage", "auth", "management", "trace"):
        lines += [f"[{section}]", *_toml_table(getattr(defaults, section))]
    for listener in defaults.listeners:
        lines += ["[[listeners]]", *_toml_table(listener)]
    for policy in defaults.policies:
        lines += ["[[policies]]", *_toml_table(policy)]
    for user in defaults.auth.users:
        lines += ["[[auth.users]]", *_toml_table(user)]
    for connector in defaults.network_connectors:
        lines += ["[[network_connectors]]", *_toml_table(connector)]
    for stream in defaults.streams:
        lines += ["[[streams]]", *_toml_table(stream)]
    config = load(tmp_path, "\n".join(lines) + "\n")
    assert dataclasses.replace(config, source=None) == defaults


def test_sections_map_onto_the_model(tmp_path: Path) -> None:
    config = load(tmp_path, """
[broker]
name = "b1"
data_directory = "var/data"
persistent = false
advisory_support = false
[[listeners]]
name = "stomp"
url = "stomp://0.0.0.0:61613"
[[listeners]]
name = "tls"
protocol = "stomp+ssl"
host = "::1"
port = 61612
ssl_certfile = "/etc/tls/b.pem"
[[listeners]]
name = "bridge"
url = "stomp+nio+ssl://[::1]:61617"
ssl_certfile = "b.pem"
[stomp]
max_frame_size = "1 mb"
heartbeat_grace = 2
default_heartbeat = [5000, 0]
[store]
kind = "memory"
segment_size = 4096
[[policies]]
match = "queue://orders.*"
max_redeliveries = 0
individual_dlq_prefix = "DLQ."
[usage]
memory_limit = "1.5 gb"
on_limit = "fail"
[auth]
anonymous_access = false
anonymous_groups = []
[[auth.users]]
name = "system"
password = "manager"
groups = ["admins"]
[management]
port = 0
""")
    assert config.broker_name == "b1"
    assert config.data_directory == tmp_path / "var/data"
    assert (config.persistent, config.advisory_support) == (False, False)
    assert config.listeners == (
        ListenerConfig(name="stomp", protocol="stomp", host="0.0.0.0", port=61613),
        ListenerConfig(name="tls", protocol="stomp+ssl", host="::1", port=61612,
                       ssl_certfile=Path("/etc/tls/b.pem")),
        ListenerConfig(name="bridge", protocol="stomp+ssl", host="::1", port=61617,
                       ssl_certfile=tmp_path / "b.pem"),
    )
    assert config.stomp.max_frame_size == 1024 * 1024
    assert config.stomp.heartbeat_grace == 2.0
    assert config.stomp.default_heartbeat == (5000, 0)
    assert (config.store.kind, config.store.segment_size) == ("memory", 4096)
    assert config.policies == (DestinationPolicy(match="queue://orders.*", max_redeliveries=0,
                                                 individual_dlq_prefix="DLQ."),)
    assert config.usage.memory_limit == 3 * 1024**3 // 2
    assert config.usage.on_limit == "fail"
    assert config.auth.anonymous_access is False
    assert config.auth.anonymous_groups == ()
    assert config.auth.users == (User("system", "manager", ("admins",)),)
    assert config.management.port == 0
    assert config.store_directory == tmp_path / "var/data/journal"


def test_inline_tables_and_dotted_keys(tmp_path: Path) -> None:
    config = load(tmp_path, 'stomp = { max_headers = 10 }\nusage.on_limit = "fail"\n'
                            'listeners = [{ name = "a", port = 1 }, { name = "b", port = 2 }]\n')
    assert config.stomp.max_headers == 10
    assert config.usage.on_limit == "fail"
    assert [lst.port for lst in config.listeners] == [1, 2]


def test_example_file_loads() -> None:
    config = load_config(EXAMPLE)
    assert config.broker_name == "broker-1"
    assert config.data_directory == EXAMPLE.parent / "data"
    assert [lst.protocol for lst in config.listeners] == ["stomp", "stomp+ssl", "mqtt", "ws", "tcp"]
    assert config.policies[0].match == "queue://orders.>"
    assert config.auth.anonymous_access is False


# Each row: file text, the line and option the error must name, and words of the reason.
ERRORS = [
    pytest.param("[broker]\nname = 'x'\n[stmop]\nmax_headers = 1\n", 3, "stmop",
                 "unknown section 'stmop'; did you mean 'stomp'?", id="unknown-section"),
    pytest.param("[stomp]\nmax_headers = 5\n\nmax_fram_size = '1 mb'\n", 4,
                 "stomp.max_fram_size",
                 "unknown option 'stomp.max_fram_size'; did you mean 'max_frame_size'?",
                 id="unknown-key"),
    pytest.param("[broker]\nbroker_name = 'x'\n", 2, "broker.broker_name",
                 "did you mean 'name'?", id="model-name-is-not-the-key"),
    pytest.param("[[listeners]]\nname = 'a'\n[[listeners]]\nname = 'b'\nprot = 'tcp'\n", 5,
                 "listeners[1].prot", "did you mean 'port'?", id="unknown-key-in-array"),
    pytest.param("[management]\nport = '8161'\n", 2, "management.port",
                 "expected an integer, got string '8161'", id="wrong-type-int"),
    pytest.param("[store]\n# comment\nfsync = 1\n", 3, "store.fsync",
                 "expected true or false, got integer 1", id="wrong-type-bool"),
    pytest.param("[broker]\nname = 5\n", 2, "broker.name", "expected a string",
                 id="wrong-type-str"),
    pytest.param("stomp = 5\n", 1, "stomp", "expected a table", id="section-not-a-table"),
    pytest.param("[auth]\nanonymous_groups = [\n  'a',\n  7,\n]\n", 4,
                 "auth.anonymous_groups[1]", "expected a string, got integer 7",
                 id="wrong-type-in-array"),
    pytest.param("[stomp]\ndefault_heartbeat = [1, 2, 3]\n", 2, "stomp.default_heartbeat",
                 "expected an array of 2 values", id="wrong-arity"),
    pytest.param("[[listeners]]\nname = 'a'\nport = 65536\n", 3, "listeners[0].port",
                 "must be <= 65535, got 65536", id="port-too-high"),
    pytest.param("[[listeners]]\nurl = 'stomp+ssl://h:1'\nssl_certfile = 'c.pem'\n"
                 "client_auth = 'need'\n", 4, "listeners[0].client_auth",
                 "client_auth = 'need' needs ssl_cafile", id="client-auth-without-ca"),
    pytest.param("[[listeners]]\nurl = 'stomp://h:1'\nclient_auth = 'want'\n", 3,
                 "listeners[0].client_auth", "client_auth applies to TLS listeners",
                 id="client-auth-on-plain-listener"),
    pytest.param("[[listeners]]\nurl = 'stomp+ssl://h:1'\nssl_certfile = 'c.pem'\n"
                 "client_auth = 'required'\n", 4, "listeners[0].client_auth",
                 "must be one of 'none', 'want', 'need'", id="client-auth-choice"),
    pytest.param("[management]\nport = -1\n", 2, "management.port", "must be >= 0",
                 id="port-negative"),
    pytest.param("[usage]\nmemory_limit = -5\n", 2, "usage.memory_limit", "size must be >= 0",
                 id="size-negative"),
    pytest.param("[usage]\nmemory_limit = '64 parsecs'\n", 2, "usage.memory_limit",
                 "unknown size unit", id="size-unit"),
    pytest.param("[stomp]\nheartbeat_grace = 0.5\n", 2, "stomp.heartbeat_grace",
                 "must be >= 1.0", id="grace-below-one"),
    pytest.param("[store]\ncompact_live_ratio = 1.5\n", 2, "store.compact_live_ratio",
                 "must be <= 1.0", id="ratio-above-one"),
    pytest.param("[usage]\non_limit = 'drop'\n", 2, "usage.on_limit",
                 "must be one of 'block', 'fail'", id="on-limit-choice"),
    pytest.param("[store]\nkind = 'kahadb'\n", 2, "store.kind", "must be one of",
                 id="store-kind-choice"),
    pytest.param("[[listeners]]\nname = 'x'\nprotocol = 'amqp'\n", 3, "listeners[0].protocol",
                 "must be one of 'stomp'", id="protocol-choice"),
    pytest.param("[[listeners]]\nname = 'x'\nurl = 'amqp://h:5672'\n", 3, "listeners[0].url",
                 "must be one of", id="protocol-from-url"),
    pytest.param("[[listeners]]\nname = 'x'\nurl = 'stomp://h:99999'\n", 3, "listeners[0].url",
                 "port out of range", id="url-port-range"),
    pytest.param("[[listeners]]\nname = 'x'\nurl = 'stomp://h'\n", 3, "listeners[0].url",
                 "needs host:port", id="url-without-port"),
    pytest.param("[[listeners]]\nname = 'x'\nurl = 'stomp://h:1?maximumConnections=5'\n", 3,
                 "listeners[0].url", "URL options", id="url-query"),
    pytest.param("[[listeners]]\nurl = 'stomp://h:1'\nport = 2\n", 2, "listeners[0].url",
                 "either 'url' or 'port'", id="url-and-port"),
    pytest.param("[[listeners]]\nname = 'a'\nport = 1\n\n[[listeners]]\nname = 'a'\nport = 2\n",
                 6, "listeners[1].name", "duplicate listener name 'a'", id="duplicate-listener"),
    pytest.param("[[listeners]]\nname = 'a'\nport = 1\n[[listeners]]\nname = 'b'\nport = 1\n",
                 6, "listeners[1].port", "already uses 127.0.0.1:1", id="duplicate-address"),
    pytest.param("[[listeners]]\nname = 'a'\nport = 1\n[[listeners]]\nname = 'tls'\n"
                 "url = 'stomp+ssl://0.0.0.0:61612'\n", 4, "listeners[1].ssl_certfile",
                 "stomp+ssl listener 'tls' needs ssl_certfile", id="ssl-without-cert"),
    pytest.param("[[policies]]\nmatch = 'queue://>'\n[[policies]]\nmax_redeliveries = 1\n"
                 "match = 'orders.>'\n", 5, "policies[1].match", "not a destination pattern",
                 id="policy-match-no-kind"),
    pytest.param("[[policies]]\nmatch = 'queue://a.>.b'\n", 2, "policies[0].match",
                 "'>' must be the last segment", id="policy-match-bad-wildcard"),
    pytest.param("[[policies]]\ndead_letter_queue = 'DLQ.*'\n", 2,
                 "policies[0].dead_letter_queue", "cannot be a wildcard", id="dlq-wildcard"),
    pytest.param("[[policies]]\nindividual_dlq_prefix = 'a..'\n", 2,
                 "policies[0].individual_dlq_prefix", "empty segment", id="dlq-prefix"),
    pytest.param("[auth]\n[[auth.users]]\nname = 'u'\npassword = 'p'\n[[auth.users]]\n"
                 "name = 'u'\npassword = 'q'\n", 6, "auth.users[1].name", "duplicate user 'u'",
                 id="duplicate-user"),
    pytest.param("[[auth.users]]\nname = 'u'\n", 1, "auth.users[0].password",
                 "missing required option 'password'", id="missing-required"),
    pytest.param("[broker]\nname = '  '\n", 2, "broker.name", "must not be empty",
                 id="empty-name"),
    pytest.param("[broker]\ndata_directory = ''\n", 2, "broker.data_directory",
                 "expected a path", id="empty-path"),
]


@pytest.mark.parametrize(("text", "line", "option", "reason"), ERRORS)
def test_errors_name_file_line_and_option(tmp_path: Path, text: str, line: int, option: str,
                                          reason: str) -> None:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, text)
    err = info.value
    assert (err.file, err.line, err.option) == (str(tmp_path / "meshmq.toml"), line, option)
    assert reason in err.reason
    assert str(err).startswith(f"{tmp_path / 'meshmq.toml'}:{line}, option {option!r}: ")


@pytest.mark.parametrize(("text", "line", "reason"), [
    pytest.param("[broker]\nname = \n", 2, "Invalid value", id="missing-value"),
    pytest.param("[stomp]\nmax_headers = 1\nmax_headers = 2\n", 3, "Cannot overwrite",
                 id="duplicate-key"),
    pytest.param("[broker\n", 1, "Expected ']'", id="unclosed-header"),
    pytest.param("a = 1\nb = 'unterminated\n\n", 2, "Expected", id="end-of-document"),
    pytest.param('a = 1\nb = "unterminated\n', 2, "Illegal character", id="string"),
])
def test_syntax_errors_carry_tomllib_line(tmp_path: Path, text: str, line: int,
                                          reason: str) -> None:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, text)
    assert (info.value.file, info.value.line, info.value.option) == (
        str(tmp_path / "meshmq.toml"), line, None)
    assert info.value.reason.startswith("TOML syntax error")
    assert reason in info.value.reason
    assert "(at line" not in info.value.reason


def test_unreadable_and_non_utf8_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file") as info:
        load_config(tmp_path / "missing.toml")
    assert info.value.file == str(tmp_path / "missing.toml")
    (tmp_path / "latin1.toml").write_bytes(b"[broker]\nname = '\xe9'\n")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_config(tmp_path / "latin1.toml")


def test_unknown_suffix(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"expected \.toml") as info:
        load_config(tmp_path / "meshmq.yaml")
    assert info.value.file == str(tmp_path / "meshmq.yaml")


def test_loads_without_a_file_keeps_relative_paths() -> None:
    config = loads_toml("[broker]\ndata_directory = 'd'\n")
    assert (config.data_directory, config.source) == (Path("d"), None)


def test_positions_cover_tricky_toml() -> None:
    text = '''# header comment
title = """
[not.a.table]
fake = 1
"""
"quoted.key" = 'x'  # comment
[a . "b"]
c = [
  { d = 1, e = [2,
     3] },
  {f = 'g'},
]
[[t]]
[[t]]
x.y = 1
[t.sub]
z = 2
'''
    lines = toml_positions(text)
    assert "not.a.table" not in lines and "fake" not in lines
    assert lines["title"] == 2
    assert lines["quoted.key"] == 6
    assert lines["a.b"] == 7
    assert lines["a.b.c"] == 8
    assert lines["a.b.c[0].d"] == 9
    assert lines["a.b.c[0].e[1]"] == 10
    assert lines["a.b.c[1].f"] == 11
    assert lines["t[0]"] == 13
    assert lines["t[1]"] == 14
    assert lines["t[1].x.y"] == 15
    assert lines["t[1].sub.z"] == 17


@pytest.mark.parametrize(("url", "expected"), [
    ("stomp://127.0.0.1:61613", ("stomp", "127.0.0.1", 61613, "")),
    ("STOMP+NIO://0.0.0.0:1?a=b", ("stomp", "0.0.0.0", 1, "a=b")),
    ("tcp://[::1]:61616", ("tcp", "::1", 61616, "")),
    ("ssl://broker.example:0/", ("ssl", "broker.example", 0, "")),
])
def test_split_listener_url(url: str, expected: tuple[str, str, int, str]) -> None:
    assert split_listener_url(url) == expected


@pytest.mark.parametrize("url", ["61613", "stomp://", "stomp://h:1/path", "stomp://h:x"])
def test_split_listener_url_rejects(url: str) -> None:
    with pytest.raises(ValueError):
        split_listener_url(url)
