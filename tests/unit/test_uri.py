"""The URI grammar: examples from ActiveMQ's docs, errors naming the bad part, round trips."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshmq.errors import MeshmqError
from meshmq.uri import (
    COMPOSITE_SCHEMES,
    SIMPLE_SCHEMES,
    URI,
    CompositeURI,
    Options,
    SimpleURI,
    URIError,
    format_uri,
    parse_uri,
)


def test_simple_uri_parts() -> None:
    u = parse_uri("tcp://broker1:61616?wireFormat.maxFrameSize=1024&soTimeout=0")
    assert u == SimpleURI("tcp", "broker1", 61616, "",
                          Options([("wireFormat.maxFrameSize", "1024"), ("soTimeout", "0")]))
    assert isinstance(u, SimpleURI) and u.address == ("broker1", 61616)


@pytest.mark.parametrize("text", [
    "ssl://h:1", "nio://h:1", "stomp://h:61613", "stomp+ssl://h:61614", "mqtt://h:1883",
    "mqtts://h:8883", "ws://h:61614/stomp", "wss://h:443/mqtt", "multicast://default",
    "multicast://239.255.2.3:6155", "tcp://[::1]:61616", "tcp://[fe80::1%eth0]:1",
])
def test_simple_schemes(text: str) -> None:
    u = parse_uri(text)
    assert isinstance(u, SimpleURI)
    assert format_uri(u) == text


def test_scheme_is_case_insensitive() -> None:
    assert parse_uri("TCP://h:1") == parse_uri("tcp://h:1")


def test_failover_parenthesized_with_options() -> None:
    u = parse_uri("failover:(tcp://a:61616,tcp://b:61616)?randomize=false&timeout=3000")
    assert u == CompositeURI("failover", (SimpleURI("tcp", "a", 61616),
                                          SimpleURI("tcp", "b", 61616)),
                             Options([("randomize", "false"), ("timeout", "3000")]))


def test_failover_bare_form_is_canonicalised() -> None:
    u = parse_uri("failover:tcp://a:1,tcp://b:2")
    assert u == parse_uri("failover:(tcp://a:1,tcp://b:2)")
    assert format_uri(u) == "failover:(tcp://a:1,tcp://b:2)"


def test_bare_form_query_belongs_to_last_component_as_in_activemq() -> None:
    u = parse_uri("failover:tcp://a:1,tcp://b:2?soTimeout=5")
    assert isinstance(u, CompositeURI) and not u.options
    assert u.components[1] == SimpleURI("tcp", "b", 2, "", Options({"soTimeout": "5"}))


def test_network_connector_forms() -> None:
    nested = parse_uri("static:(failover:(tcp://m:61616,tcp://s:61616)"
                       "?randomize=false&maxReconnectAttempts=0)")
    assert isinstance(nested, CompositeURI) and nested.scheme == "static"
    (inner,) = nested.components
    assert isinstance(inner, CompositeURI) and inner.scheme == "failover"
    assert inner.options == Options([("randomize", "false"), ("maxReconnectAttempts", "0")])
    # The seed's forms: "static://(...)" and "static:failover:(...)?...".
    assert parse_uri("static://(tcp://a:1,tcp://b:2)") == parse_uri("static:(tcp://a:1,tcp://b:2)")
    assert parse_uri("static:failover:(tcp://m:61616,tcp://s:61616)?randomize=false&"
                     "maxReconnectAttempts=0") == nested
    ms = parse_uri("masterslave:(tcp://m:1,tcp://s:1)?initialReconnectDelay=1000")
    assert isinstance(ms, CompositeURI) and len(ms.components) == 2
    assert parse_uri("discovery:(multicast://default)").components == (  # type: ignore[union-attr]
        SimpleURI("multicast", "default"),)


def test_options_helpers() -> None:
    opts = Options([("nested.soTimeout", "5"), ("timeout", "1"), ("nested.x", "y")])
    assert opts.with_prefix("nested.") == Options([("soTimeout", "5"), ("x", "y")])
    assert opts.without_prefix("nested.") == Options({"timeout": "1"})
    assert Options({"a": "1"}).merged({"b": "2", "a": "3"}) == Options([("a", "3"), ("b", "2")])
    assert Options([("a", "1"), ("b", "2")]) != Options([("b", "2"), ("a", "1")])
    with pytest.raises(ValueError, match="'a' given twice"):
        Options([("a", "1"), ("a", "2")])


def test_percent_escapes_are_decoded_and_written_back() -> None:
    u = parse_uri("failover:(tcp://a:1)?priorityURIs=tcp%3A%2F%2Fa%3A1%2Ctcp%3A%2F%2Fb%3A2")
    assert u.options["priorityURIs"] == "tcp://a:1,tcp://b:2"
    assert parse_uri(format_uri(u)) == u


@pytest.mark.parametrize(("text", "part", "reason"), [
    ("", "", "empty URI"),
    ("localhost:61616", "localhost", "unknown scheme"),
    ("61616", "61616", "missing scheme"),
    ("foo://h:1", "foo", "unknown scheme"),
    ("tcp:h:1", "tcp:h:1", "expected tcp://host"),
    ("tcp://h:99999", "99999", "port must be"),
    ("tcp://h:12ab", "12ab", "port must be"),
    ("tcp://:1", "tcp://:1", "missing host"),
    ("tcp://h$st:1", "h$st", "invalid host"),
    ("tcp://u:p@h:1", "u:p@h:1", "user information"),
    ("tcp://h:1?a", "a", "option 'a' has no value"),
    ("tcp://h:1?a=1&&b=2", "a=1&&b=2", "stray '&'"),
    ("tcp://h:1?a=1&a=2", "a=2", "given twice"),
    ("tcp://h:1?=1", "=1", "option without a name"),
    ("tcp://h:1?a=%ff", "a=%ff", "not UTF-8"),
    ("tcp://h:1#frag", "#frag", "fragments"),
    ("tcp://[::1:1", "[::1:1", "unterminated IPv6"),
    ("failover:(tcp://a:1,tcp://b:2", "(tcp://a:1,tcp://b:2", "no matching ')'"),
    ("failover:(tcp://a:1)x", "x", "unexpected text after ')'"),
    ("failover:(tcp://a:1,,tcp://b:2)", "tcp://a:1,,tcp://b:2", "stray comma"),
    ("failover:()", "failover:()", "needs at least one URI"),
    ("failover:", "failover:", "needs at least one URI"),
    ("failover:(tcp://a:1,bogus://b:2)", "bogus", "unknown scheme"),
    ("static:(failover:(tcp://a:1,tcp://b:x))", "x", "port must be"),
])
def test_errors_name_the_bad_part(text: str, part: str, reason: str) -> None:
    with pytest.raises(URIError) as info:
        parse_uri(text)
    err = info.value
    assert isinstance(err, MeshmqError) and err.code == "invalid-uri"
    assert err.part == part and reason in err.reason
    assert repr(text) in str(err)


# --------------------------------------------------------------------- round trips

_label = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,10}[a-z0-9])?", fullmatch=True)
_hosts = st.one_of(
    st.lists(_label, min_size=1, max_size=3).map(".".join),
    st.sampled_from(["::1", "fe80::1", "2001:db8::2"]),
)
_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
_options = st.lists(st.tuples(_text.filter(bool), _text), max_size=4,
                    unique_by=lambda kv: kv[0]).map(Options)
_paths = st.one_of(st.just(""), st.from_regex(r"/[a-z0-9/._-]{0,10}", fullmatch=True))
_simple = st.builds(SimpleURI, st.sampled_from(sorted(SIMPLE_SCHEMES)), _hosts,
                    st.one_of(st.none(), st.integers(0, 65535)), _paths, _options)


def _composites(children: st.SearchStrategy[URI]) -> st.SearchStrategy[URI]:
    return st.builds(CompositeURI, st.sampled_from(sorted(COMPOSITE_SCHEMES)),
                     st.lists(children, min_size=1, max_size=4).map(tuple), _options)


_uris: st.SearchStrategy[URI] = st.recursive(_simple, _composites, max_leaves=8)


@given(_uris)
def test_parse_format_round_trip(uri: URI) -> None:
    text = format_uri(uri)
    assert parse_uri(text) == uri
    assert format_uri(parse_uri(text)) == text


@given(st.text(max_size=40))
def test_arbitrary_text_parses_or_raises_uri_error(text: str) -> None:
    try:
        uri = parse_uri(text)
    except URIError:
        return
    assert parse_uri(format_uri(uri)) == uri
