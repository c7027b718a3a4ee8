"""The ``multicast://`` discovery URI grammar, by property: every URI written from
valid parts parses back to those parts, every settings it yields can be sent in a
heartbeat, and any text at all is either settings or a DiscoveryUriError naming the
bad part (never another exception a config loader would not expect)."""

from __future__ import annotations

import urllib.parse

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshmq.discovery_uri import (
    DEFAULT_GROUP_ADDRESS,
    DEFAULT_PORT,
    DiscoveryUriError,
    MulticastSettings,
    parse_multicast_uri,
)
from meshmq.network.discovery import Beat, decode_beat, encode_beat

groups = st.text(st.characters(blacklist_categories=("Cs", "Cc")), min_size=1,
                 max_size=20).filter(lambda g: g.strip() != "")
addresses = st.tuples(st.integers(224, 239), st.integers(0, 255), st.integers(0, 255),
                      st.integers(0, 255)).map(lambda t: ".".join(map(str, t)))
options = st.fixed_dictionaries({}, optional={
    "group": groups,
    "keepAliveInterval": st.integers(1, 0xFFFFFFFF),
    "timeToLive": st.integers(0, 255),
    "interface": st.sampled_from(["127.0.0.1", "10.1.2.3"]),
    "initialReconnectDelay": st.integers(0, 10**6),
    "maxReconnectDelay": st.integers(0, 10**6),
    "useExponentialBackOff": st.sampled_from(["true", "false", "TRUE"]),
    "backOffMultiplier": st.floats(1.0, 100.0),
    "maxReconnectAttempts": st.integers(-1, 1000),
})
FIELDS = {"group": "group", "keepAliveInterval": "keepalive_interval_ms",
          "timeToLive": "time_to_live", "interface": "interface",
          "initialReconnectDelay": "initial_reconnect_delay_ms",
          "maxReconnectDelay": "max_reconnect_delay_ms",
          "useExponentialBackOff": "use_exponential_backoff",
          "backOffMultiplier": "backoff_multiplier",
          "maxReconnectAttempts": "max_reconnect_attempts"}


@settings(max_examples=25)
@given(st.one_of(st.none(), addresses), st.one_of(st.none(), st.integers(1, 65535)),
       options, st.dictionaries(st.text("abcXYZ.", min_size=1, max_size=8),
                                st.text("xyz01", max_size=5), max_size=2))
def test_a_uri_written_from_valid_parts_parses_back_to_them(
        address: str | None, port: int | None, opts: dict[str, object],
        discovered: dict[str, str]) -> None:
    host = address or "default"
    query = {k: str(v) for k, v in opts.items()}
    query.update({f"discovered.{k}": v for k, v in discovered.items()})
    uri = f"multicast://{host}{'' if port is None else f':{port}'}"
    if query:
        uri += "?" + urllib.parse.urlencode(query)
    settings = parse_multicast_uri(uri)
    assert settings.address == (address or DEFAULT_GROUP_ADDRESS)
    assert settings.port == (port or DEFAULT_PORT)
    for option, value in opts.items():
        got = getattr(settings, FIELDS[option])
        if option == "useExponentialBackOff":
            assert got is (str(value).lower() == "true")
        elif option == "backOffMultiplier":
            assert got == float(str(value))
        else:
            assert got == value
    assert settings.discovered_options == discovered


@settings(max_examples=50)
@given(st.integers(1, 2**40), groups)
def test_whatever_interval_and_group_a_uri_allows_can_be_sent_in_a_heartbeat(
        interval: int, group: str) -> None:
    query = urllib.parse.urlencode({"keepAliveInterval": interval, "group": group})
    try:
        parsed = parse_multicast_uri(f"multicast://default?{query}")
    except DiscoveryUriError as exc:
        assert "keepAliveInterval must be <=" in str(exc)
        return
    beat = Beat(parsed.group, "broker", "tcp://h:61616", True, parsed.keepalive_interval_ms,
                b"\0" * 8)
    assert decode_beat(encode_beat(beat)) == beat


@settings(max_examples=50)
@given(st.text(max_size=60).map(lambda t: "multicast://" + t))
def test_any_text_is_settings_or_a_discovery_uri_error(text: str) -> None:
    try:
        settings = parse_multicast_uri(text)
    except DiscoveryUriError as exc:
        assert str(exc)
        return
    assert isinstance(settings, MulticastSettings)


@pytest.mark.parametrize(("uri", "reason"), [
    ("multicast://[ff02::1", "not a multicast:// URI"),
    ("multicast://default?keepAliveInterval=4294967296",
     "keepAliveInterval must be <= 4294967295"),
    ("multicast://default?backOffMultiplier=nan", "backOffMultiplier must be a finite number"),
    ("multicast://default?backOffMultiplier=inf", "backOffMultiplier must be a finite number"),
    ("multicast://default?discovered.=x", "unknown multicast URI option 'discovered.'"),
    ("multicast://default?initialReconnectDelay=-1", "initialReconnectDelay must be >= 0"),
])
def test_a_uri_no_agent_could_use_is_refused_up_front(uri: str, reason: str) -> None:
    with pytest.raises(DiscoveryUriError, match=reason):
        parse_multicast_uri(uri)


def test_the_last_of_a_repeated_option_wins() -> None:
    assert parse_multicast_uri("multicast://default?group=a&group=b").group == "b"
