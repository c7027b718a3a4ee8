"""The datagram a shard sends with a handed-over connection (transport/handoff.py):
what is encoded is what is decoded, whether the pending bytes ride in the datagram or
in a memory file, and a malformed head is refused."""

from __future__ import annotations

import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshmq.transport.handoff import (
    INLINE_PENDING,
    HandoffOffer,
    _memory_file,
    _read_memory_file,
)

offers = st.builds(
    HandoffOffer, protocol=st.just("stomp"), listener=st.text(min_size=1, max_size=20),
    version=st.sampled_from(["1.0", "1.1", "1.2"]),
    send_interval=st.floats(0, 3600, allow_nan=False),
    recv_interval=st.floats(0, 3600, allow_nan=False),
    user=st.text(max_size=30), groups=st.lists(st.text(max_size=10), max_size=4).map(tuple),
    anonymous=st.booleans(), pending=st.binary(max_size=2048))


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


@pytest.mark.parametrize("data", [b"no head end", b'{"id": 1}\0', b"[1, 2]\0x"])
def test_a_malformed_offer_is_refused(data: bytes) -> None:
    with pytest.raises((ValueError, KeyError, TypeError)):
        HandoffOffer.decode(data)
