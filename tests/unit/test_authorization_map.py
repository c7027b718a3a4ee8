"""The authorization map's rules (core/authorization.py), without a broker."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from meshmq.config.model import AuthorizationConfig, AuthorizationEntry, AuthorizationRights
from meshmq.core import destinations as dst
from meshmq.core.authorization import (
    LOG_INTERVAL_MS,
    AuthorizationMap,
    DenialRecord,
    Right,
    covers,
    denial_text,
    overlaps,
)
from meshmq.core.destinations import Destination, DestKind, name_matches

R, W, A = Right.READ, Right.WRITE, Right.ADMIN


def amap(*entries: AuthorizationEntry, default: AuthorizationRights | None = None,
         temp: AuthorizationRights | None = None) -> AuthorizationMap:
    return AuthorizationMap(AuthorizationConfig(entries=entries, default=default, temp=temp))


def g(*names: str) -> frozenset[str]:
    return frozenset(names)


def test_rights_add_up_over_every_matching_entry_and_the_default() -> None:
    m = amap(AuthorizationEntry(queue="orders.>", read=("clerks",)),
             AuthorizationEntry(queue="orders.eu", read=("eu",)),
             AuthorizationEntry(queue="*.eu", write=("eu",)),
             default=AuthorizationRights(read=("auditors",)))
    q = dst.queue("orders.eu")
    # Not "most specific wins": the broader entry still grants clerks.
    assert m.granted(R, q) == g("clerks", "eu", "auditors")
    assert m.allowed(g("clerks"), R, q) and m.allowed(g("auditors"), R, q)
    assert m.allowed(g("eu"), W, q) and not m.allowed(g("clerks"), W, q)
    assert m.granted(R, dst.queue("orders.us")) == g("clerks", "auditors")


def test_what_no_entry_grants_is_denied() -> None:
    m = amap(AuthorizationEntry(queue="orders.>", read=("clerks",)))
    assert not m.allowed(g("clerks"), R, dst.queue("payments"))
    assert not m.allowed(g("clerks"), W, dst.queue("orders.a"))  # no write listed
    assert not m.allowed(frozenset(), R, dst.queue("orders.a"))


def test_queue_and_topic_entries_apply_to_their_own_family() -> None:
    m = amap(AuthorizationEntry(topic="prices.>", read=("*",)))
    assert m.allowed(g("anyone"), R, dst.topic("prices.eur"))
    assert not m.allowed(g("anyone"), R, dst.queue("prices.eur"))


def test_an_entry_ending_in_descendants_covers_its_parent_too() -> None:
    m = amap(AuthorizationEntry(queue="orders.>", write=("clerks",)))
    assert m.allowed(g("clerks"), W, dst.queue("orders"))
    assert m.allowed(g("clerks"), W, dst.queue("orders.a.b.c"))
    assert not m.allowed(g("clerks"), W, dst.queue("ordersx"))


def test_the_everybody_group() -> None:
    m = amap(default=AuthorizationRights(read=("*",)))
    assert m.allowed(frozenset(), R, dst.topic("anything"))
    assert not m.allowed(g("x"), W, dst.topic("anything"))


def test_temporary_destinations_are_open_without_a_temp_entry() -> None:
    temp = Destination(DestKind.TEMP_QUEUE, "ID:b-1-c1:1")
    no_temp = amap(AuthorizationEntry(queue=">", read=("admins",)))
    assert no_temp.allowed(frozenset(), A, temp) and no_temp.allowed(frozenset(), W, temp)
    with_temp = amap(AuthorizationEntry(queue=">", read=("*",)),
                     temp=AuthorizationRights(read=("users",), admin=("users",)))
    assert with_temp.allowed(g("users"), A, temp)
    assert not with_temp.allowed(g("admins"), R, temp)  # the entries do not apply
    assert not with_temp.allowed(g("users"), W, temp)


def test_a_wildcard_is_readable_when_some_destination_under_it_is() -> None:
    m = amap(AuthorizationEntry(topic="prices.eu.*", read=("eu",)))
    assert m.allowed(g("eu"), R, dst.topic("prices.>"))
    assert m.allowed(g("eu"), R, dst.topic(">"))
    assert m.allowed(g("eu"), R, dst.topic("*.eu.*"))
    assert not m.allowed(g("eu"), R, dst.topic("prices.us.*"))
    assert not m.allowed(g("eu"), R, dst.topic("prices.eu"))  # one segment short
    assert not m.allowed(g("eu"), R, dst.topic("news.>"))


def test_denial_texts_are_activemqs() -> None:
    assert denial_text("bob", W, dst.queue("Y")) == \
        "User bob is not authorized to write to: queue://Y"
    assert denial_text("bob", R, dst.topic("T")) == \
        "User bob is not authorized to read from: topic://T"
    assert denial_text("bob", A, dst.queue("Y")).startswith(
        "User bob is not authorized to create: queue://Y")


def test_denials_are_counted_and_logged_once_a_minute_per_key() -> None:
    rec = DenialRecord()
    q = dst.queue("secret")
    assert rec.note("bob", W, q, 0) == 0
    assert rec.note("bob", W, q, 10) is None
    assert rec.note("bob", R, q, 20) == 0  # another right: its own key
    assert rec.note("bob", W, q, LOG_INTERVAL_MS - 1) is None
    assert rec.note("bob", W, q, LOG_INTERVAL_MS) == 2  # with the two left unlogged
    assert rec.note("eve", W, q, LOG_INTERVAL_MS) == 0
    assert rec.total == 6 and rec.by_user == {"bob": 5, "eve": 1}


# Overlap of an entry pattern and a (wildcard) destination pattern, against brute force
# over every concrete name of up to 5 segments from a small alphabet.
SEGMENT = st.sampled_from(["a", "b", "*"])
PATTERN = st.lists(SEGMENT, min_size=0, max_size=3).flatmap(
    lambda segs: st.sampled_from([tuple(segs), (*segs, ">")]).filter(bool))
NAMES = [n for k in range(1, 6) for n in itertools.product("abc", repeat=k)]


@given(PATTERN, PATTERN)
def test_overlaps_agrees_with_brute_force(entry: tuple[str, ...],
                                          dest: tuple[str, ...]) -> None:
    expected = any(covers(entry, name) and name_matches(".".join(dest), ".".join(name))
                   for name in NAMES)
    assert overlaps(entry, dest) == expected, (entry, dest)


@given(PATTERN, st.sampled_from(NAMES))
def test_covers_is_activemqs_match(entry: tuple[str, ...], name: tuple[str, ...]) -> None:
    # ActiveMQ's DestinationMapNode: a trailing ">" also matches no segment at all, so
    # "orders.>" covers "orders" and "*.>" covers "a".
    text = ".".join(entry)
    parent = text.endswith(".>") and name_matches(text[:-2], ".".join(name))
    assert covers(entry, name) == (name_matches(text, ".".join(name)) or parent)
