"""The datagram a shard sends with a handed-over connection (transport/handoff.py):
what is encoded is what is decoded, whether the pending bytes ride in the datagram or
in a memory file, with a client id's claim and an MQTT connection's negotiated state
and will, and a malformed head is refused; a head too large for one datagram beside the
pending bytes sends them apart, and one too large alone is not sent."""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshmq.protocol.mqtt import PROTOCOL_LEVEL_5, PROTOCOL_LEVEL_311, Properties, Will
from meshmq.transport.handoff import (
    _MAX_DATAGRAM,
    INLINE_PENDING,
    HandoffOffer,
    _memory_file,
    _read_memory_file,
    datagram,
)
from meshmq.transport.mqtt_server import _decode_will, _encode_will

offers = st.builds(
    HandoffOffer, protocol=st.just("stomp"), listener=st.text(min_size=1, max_size=20),
    version=st.sampled_from(["1.0", "1.1", "1.2"]),
    send_interval=st.floats(0, 3600, allow_nan=False),
    recv_interval=st.floats(0, 3600, allow_nan=False),
    user=st.text(max_size=30), groups=st.lists(st.text(max_size=10), max_size=4).map(tuple),
    anonymous=st.booleans(), pending=st.binary(max_size=2048),
    websocket=st.none() | st.fixed_dictionaries({
        "subprotocol": st.sampled_from(["v12.stomp", "stomp", "mqtt"]),
        "path": st.none() | st.text(max_size=30).map(lambda p: "/" + p),
        "text": st.booleans(), "inner": st.integers(0, 2048)}))


@given(offers, st.text(min_size=1, max_size=40), st.integers(1, 2**40))
def test_an_inline_offer_decodes_to_itself(offer: HandoffOffer, token: str,
                                           offer_id: int) -> None:
    assert HandoffOffer.decode(offer.encode(token, offer_id)) == (offer, token, offer_id,
                                                                  False)


def test_pending_bytes_beyond_a_datagram_travel_in_a_memory_file() -> None:
    pending = os.urandom(INLINE_PENDING * 3 + 7)
    offer = HandoffOffer("stomp", "stomp", "1.2", 10.0, 0.0, "u", ("g",), False, pending)
    data = offer.encode("t", 5, inline=False)
    assert len(data) < 1024  # the head only
    decoded, token, offer_id, in_file = HandoffOffer.decode(data)
    assert (token, offer_id, in_file, decoded.pending) == ("t", 5, True, b"")
    fd = _memory_file(pending)
    assert _read_memory_file(fd) == pending
    with pytest.raises(OSError):
        os.fstat(fd)  # read and closed


def test_a_large_head_sends_the_pending_bytes_apart_and_too_large_a_head_is_not_sent(
        ) -> None:
    def offer(record: int, pending: int) -> HandoffOffer:
        return HandoffOffer("mqtt", "mqtt", "4", 0.0, 0.0, "u", (), False, b"p" * pending,
                            "dev", "claim", 0, {"connect": True, "record": "r" * record})

    small = datagram(offer(100, 100), "t", 1)
    assert small is not None and small[1] and len(small[0]) < 1024
    # Head and pending bytes together would exceed what the owner reads of a datagram.
    apart = datagram(offer(9000, INLINE_PENDING), "t", 2)
    assert apart is not None and not apart[1] and len(apart[0]) <= _MAX_DATAGRAM
    assert HandoffOffer.decode(apart[0])[3]  # in a memory file
    assert datagram(offer(_MAX_DATAGRAM, 10), "t", 3) is None


@pytest.mark.parametrize("data", [b"no head end", b'{"id": 1}\0', b"[1, 2]\0x"])
def test_a_malformed_offer_is_refused(data: bytes) -> None:
    with pytest.raises((ValueError, KeyError, TypeError)):
        HandoffOffer.decode(data)


def test_an_offer_with_a_client_id_and_an_mqtt_session_decodes_to_itself() -> None:
    session = {"keep_alive": 30, "receive_max": 10, "max_packet": 4096, "alias_max": 5,
               "aliases": {"1": "a/b"}, "problem_info": False, "auth_method": None,
               "drop": True, "will": {"topic": "w", "payload": "Z29uZQ==", "qos": 1,
                                      "retain": False, "properties": ""}}
    offer = HandoffOffer("mqtt", "mqtt", "5", 0.0, 0.0, "u", (), True, b"\x30\x00",
                         "dev-1", "boot/7", 1, session)
    assert HandoffOffer.decode(offer.encode("t", 9)) == (offer, "t", 9, False)


def test_an_mqtt_session_that_is_not_an_object_is_refused() -> None:
    data = HandoffOffer("mqtt", "mqtt", "4", 0.0, 0.0, "u", (), True).encode("t", 1)
    with pytest.raises(ValueError, match="session"):
        HandoffOffer.decode(data.replace(b'"session":null', b'"session":[1]'))


def mqtt_text(**kw: int) -> st.SearchStrategy[str]:
    """Text an MQTT string may hold: no U+0000, no surrogates (MQTT 1.5.4; a CONNECT
    with either is refused before any will exists)."""
    return st.text(st.characters(exclude_characters="\x00", exclude_categories=("Cs",)),
                   **kw)


wills = st.builds(
    Will, topic=mqtt_text(min_size=1, max_size=20), payload=st.binary(max_size=64),
    qos=st.integers(0, 2), retain=st.booleans(),
    properties=st.builds(
        Properties, will_delay_interval=st.none() | st.integers(0, 2**32 - 1),
        message_expiry_interval=st.none() | st.integers(0, 2**32 - 1),
        content_type=st.none() | mqtt_text(max_size=10),
        user_properties=st.lists(st.tuples(mqtt_text(max_size=5), mqtt_text(max_size=5)),
                                 max_size=3)))


@given(wills)
def test_an_mqtt_5_will_travels_whole(will: Will) -> None:
    decoded = _decode_will(json.loads(json.dumps(_encode_will(will))), PROTOCOL_LEVEL_5)
    assert decoded == will


def test_a_3_1_1_will_has_no_properties() -> None:
    will = Will("t", b"x", 1, True)
    assert _decode_will(_encode_will(will), PROTOCOL_LEVEL_311) == will
    assert _decode_will(None, PROTOCOL_LEVEL_311) is None


@pytest.mark.parametrize("websocket", [
    ["v12.stomp"], {"path": "/"}, {"subprotocol": 1}, {"subprotocol": "stomp", "path": 5},
    {"subprotocol": "stomp", "text": "yes"}, {"subprotocol": "stomp", "inner": -1},
    {"subprotocol": "stomp", "inner": True}, {"subprotocol": "stomp", "inner": "3"}])
def test_a_malformed_websocket_state_is_refused(websocket: object) -> None:
    head = json.loads(HandoffOffer("stomp", "ws", "1.2", 0.0, 0.0, "u", (), False)
                      .encode("t", 1).partition(b"\0")[0])
    head["websocket"] = websocket
    with pytest.raises(ValueError, match="WebSocket state"):
        HandoffOffer.decode(json.dumps(head).encode() + b"\0")
