"""Multicast discovery, the pure parts: URI parsing, the heartbeat codec and the tracker
that turns datagrams and a clock into up/down events."""

from dataclasses import dataclass

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
from meshmq.network.discovery import (
    MISSED_BEATS_BEFORE_DOWN,
    Beat,
    DiscoveryTracker,
    ServiceDown,
    ServiceUp,
    decode_beat,
    encode_beat,
)

# ---------------------------------------------------------------------------
# URI


def test_default_uri_is_activemqs() -> None:
    assert parse_multicast_uri("multicast://default") == MulticastSettings(
        address="239.255.2.3", port=6155, group="default", keepalive_interval_ms=500,
        time_to_live=1, interface=None)
    assert (DEFAULT_GROUP_ADDRESS, DEFAULT_PORT) == ("239.255.2.3", 6155)
    assert parse_multicast_uri("multicast://default:7000").port == 7000
    assert parse_multicast_uri(" MULTICAST://default/ ").address == "239.255.2.3"


def test_every_option() -> None:
    settings_ = parse_multicast_uri(
        "multicast://239.1.2.3:7000?group=prod&keepAliveInterval=1000&timeToLive=4"
        "&interface=127.0.0.1&initialReconnectDelay=10&maxReconnectDelay=20"
        "&useExponentialBackOff=true&backOffMultiplier=1.5&maxReconnectAttempts=3"
        "&discovered.wireFormat.maxInactivityDuration=0")
    assert settings_ == MulticastSettings(
        address="239.1.2.3", port=7000, group="prod", keepalive_interval_ms=1000,
        time_to_live=4, interface="127.0.0.1", initial_reconnect_delay_ms=10,
        max_reconnect_delay_ms=20, use_exponential_backoff=True, backoff_multiplier=1.5,
        max_reconnect_attempts=3,
        discovered_options={"wireFormat.maxInactivityDuration": "0"})


@pytest.mark.parametrize(("uri", "reason"), [
    ("static:(tcp://a:1)", "not a multicast:// URI"),
    ("multicast:default", "not a multicast:// URI"),
    ("multicast://default/path", "no path or fragment"),
    ("multicast://default:70000", "port out of range"),
    ("multicast://default:0", "port 0 is not a group port"),
    ("multicast://u:p@default", "no user or password"),
    ("multicast://10.0.0.1:6155", "'10.0.0.1' is not an IPv4 multicast address"),
    ("multicast://[ff02::1]:6155", "'ff02::1' is not an IPv4 multicast address"),
    ("multicast://brokers.example", "'brokers.example' is not an IPv4 multicast address"),
    ("multicast://default?grup=x", "unknown multicast URI option 'grup'; did you mean 'group'?"),
    ("multicast://default?zzz=1", "unknown multicast URI option 'zzz' (known: "),
    ("multicast://default?keepAliveInterval=0", "keepAliveInterval must be >= 1, got 0"),
    ("multicast://default?keepAliveInterval=fast", "keepAliveInterval must be an integer"),
    ("multicast://default?timeToLive=256", "timeToLive must be <= 255"),
    ("multicast://default?timeToLive=-1", "timeToLive must be >= 0"),
    ("multicast://default?interface=eth0", "interface must be a local IPv4 address"),
    ("multicast://default?useExponentialBackOff=yes", "must be true or false"),
    ("multicast://default?backOffMultiplier=0.5", "backOffMultiplier must be >= 1.0"),
    ("multicast://default?maxReconnectAttempts=-2", "maxReconnectAttempts must be >= -1"),
    ("multicast://default?group=", "group must be a non-empty name"),
])
def test_bad_uris_name_the_bad_part(uri: str, reason: str) -> None:
    with pytest.raises(DiscoveryUriError) as info:
        parse_multicast_uri(uri)
    assert reason in str(info.value)


# ---------------------------------------------------------------------------
# The heartbeat datagram

names = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=40)
beats = st.builds(Beat, group=names, broker_name=names, service=names, alive=st.booleans(),
                  interval_ms=st.integers(1, 0xFFFFFFFF),
                  instance=st.binary(min_size=8, max_size=8))


@given(beats)
def test_beats_round_trip(beat: Beat) -> None:
    assert decode_beat(encode_beat(beat)) == beat


@given(beats, st.data())
def test_truncated_or_padded_beats_are_dropped(beat: Beat, data: st.DataObject) -> None:
    wire = encode_beat(beat)
    cut = data.draw(st.integers(0, len(wire) - 1))
    assert decode_beat(wire[:cut]) is None
    assert decode_beat(wire + data.draw(st.binary(min_size=1, max_size=4))) is None


@given(st.binary(max_size=200))
def test_arbitrary_bytes_never_raise(data: bytes) -> None:
    beat = decode_beat(data)
    assert beat is None or encode_beat(beat) == data


def test_layout_is_as_documented() -> None:
    wire = encode_beat(Beat("g", "b1", "tcp://h:1", True, 500, b"12345678"))
    assert wire == (b"MMQD" + bytes([1, 1]) + (500).to_bytes(4, "big") + b"12345678"
                    + b"\x00\x01g" + b"\x00\x02b1" + b"\x00\x09tcp://h:1")
    for broken in (b"XMQD" + wire[4:],  # other magic
                   wire[:4] + b"\x02" + wire[5:],  # a later version
                   wire[:5] + b"\x02" + wire[6:],  # an unknown status
                   wire[:6] + b"\x00\x00\x00\x00" + wire[10:]):  # a zero interval
        assert decode_beat(broken) is None
    assert decode_beat(wire.replace(b"\x00\x02b1", b"\x00\x02\xff\xfe")) is None  # bad UTF-8
    assert decode_beat(wire.replace(b"\x00\x01g", b"\x00\x00")) is None  # empty name


def test_encode_refuses_what_decode_would_drop() -> None:
    for bad in (Beat("", "b", "s"), Beat("g", "b", "s", interval_ms=0),
                Beat("g", "b", "s", instance=b"short"), Beat("g", "b" * 70000, "s")):
        with pytest.raises(ValueError):
            encode_beat(bad)


# ---------------------------------------------------------------------------
# The tracker

ME = b"\x01" * 8
A, B = b"\x0a" * 8, b"\x0b" * 8


def beat(service: str = "tcp://a:1", *, alive: bool = True, instance: bytes = A,
         broker: str = "a", group: str = "g", interval_ms: int = 100) -> bytes:
    return encode_beat(Beat(group, broker, service, alive, interval_ms, instance))


def test_a_service_is_up_once_then_expires_after_ten_of_its_intervals() -> None:
    t = DiscoveryTracker("g", ME)
    assert t.receive(beat(), 0.0) == [ServiceUp("tcp://a:1", "a")]
    assert t.receive(beat(), 0.1) == []
    assert t.receive(beat(), 0.2) == []
    assert t.services == {"tcp://a:1": "a"}
    assert t.next_expiry() == pytest.approx(0.2 + MISSED_BEATS_BEFORE_DOWN * 0.1)
    assert t.expire(1.19) == []
    assert t.expire(1.2) == [ServiceDown("tcp://a:1", "expired")]
    assert t.services == {}
    assert t.next_expiry() is None
    assert t.receive(beat(), 1.3) == [ServiceUp("tcp://a:1", "a")]  # back again


def test_dead_takes_a_service_down_at_once() -> None:
    t = DiscoveryTracker("g", ME)
    t.receive(beat(), 0.0)
    assert t.receive(beat(alive=False), 0.01) == [ServiceDown("tcp://a:1", "dead")]
    assert t.receive(beat(alive=False), 0.02) == []  # already gone
    assert t.stale == 1


def test_late_dead_of_an_earlier_run_is_ignored() -> None:
    t = DiscoveryTracker("g", ME)
    t.receive(beat(instance=A), 0.0)
    assert t.receive(beat(instance=B), 0.1) == []  # restarted quickly: still the same service
    assert t.receive(beat(alive=False, instance=A), 0.2) == []
    assert t.services == {"tcp://a:1": "a"}
    assert t.receive(beat(alive=False, instance=B), 0.3) == [ServiceDown("tcp://a:1", "dead")]


def test_another_broker_at_the_same_address_is_a_new_service() -> None:
    t = DiscoveryTracker("g", ME)
    t.receive(beat(broker="a"), 0.0)
    assert t.receive(beat(broker="a2", instance=B), 0.1) == [
        ServiceDown("tcp://a:1", "replaced"), ServiceUp("tcp://a:1", "a2")]


def test_own_beats_other_groups_and_garbage_are_ignored() -> None:
    t = DiscoveryTracker("g", ME)
    assert t.receive(beat(instance=ME), 0.0) == []
    assert t.receive(beat(group="other"), 0.0) == []
    assert t.receive(b"alive.%localhost%tcp://x:1", 0.0) == []  # ActiveMQ's own format
    assert (t.own, t.other_groups, t.dropped, t.services) == (1, 1, 1, {})


def test_the_senders_interval_sets_the_deadline() -> None:
    t = DiscoveryTracker("g", ME)
    t.receive(beat("tcp://slow:1", interval_ms=1000), 0.0)
    t.receive(beat("tcp://fast:1", interval_ms=10, instance=B), 0.0)
    assert t.expire(0.5) == [ServiceDown("tcp://fast:1", "expired")]
    assert t.expire(9.99) == []
    assert t.expire(10.0) == [ServiceDown("tcp://slow:1", "expired")]


@dataclass(frozen=True)
class Step:
    advance: float  # seconds since the previous step
    service: int
    kind: str  # "alive", "dead", "own", "other-group", "garbage", "expire"
    instance: int
    interval_ms: int


steps = st.lists(st.builds(
    Step, advance=st.floats(0, 3, allow_nan=False), service=st.integers(0, 2),
    kind=st.sampled_from(["alive", "alive", "alive", "dead", "own", "other-group",
                          "garbage", "expire"]),
    instance=st.integers(0, 1), interval_ms=st.sampled_from([10, 100, 250])), max_size=60)


@settings(max_examples=300)
@given(steps)
def test_tracker_properties(schedule: list[Step]) -> None:
    """Whatever arrives and whenever: events alternate up/down per service starting with
    up; only beats of the group from others cause events; "expired" only after ten of the
    sender's intervals of silence; after expire() nothing silent that long is still up."""
    t = DiscoveryTracker("g", ME)
    now = 0.0
    up: dict[str, bool] = {}
    last_alive: dict[str, tuple[float, float]] = {}  # service -> (time, interval s)
    for step in schedule:
        now += step.advance
        service = f"tcp://s{step.service}:1"
        instance = bytes([step.instance + 2]) * 8
        before = t.services
        if step.kind == "expire":
            events = t.expire(now)
        elif step.kind == "garbage":
            events = t.receive(b"MMQD\x01", now)
        else:
            events = t.receive(beat(
                service, alive=step.kind != "dead",
                instance=ME if step.kind == "own" else instance,
                group="h" if step.kind == "other-group" else "g",
                interval_ms=step.interval_ms), now)
        if step.kind in ("own", "other-group", "garbage"):
            assert events == []
            assert t.services == before
        for event in events:
            assert event.service == service or step.kind == "expire"
            if isinstance(event, ServiceUp):
                assert not up.get(event.service)
                up[event.service] = True
            else:
                assert up.get(event.service)
                up[event.service] = False
                if event.reason == "expired":
                    seen, interval = last_alive[event.service]
                    assert now - seen >= MISSED_BEATS_BEFORE_DOWN * interval - 1e-9
        if step.kind == "alive":
            last_alive[service] = (now, step.interval_ms / 1000)
        assert set(t.services) == {s for s, is_up in up.items() if is_up}
        if step.kind == "expire":
            for s in t.services:
                seen, interval = last_alive[s]
                assert now - seen < MISSED_BEATS_BEFORE_DOWN * interval
