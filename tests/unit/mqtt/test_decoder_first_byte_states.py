"""The decoder's table of acceptable first bytes depends on its state (server or client
side, before or after CONNECT, protocol level) and is shared by every decoder in the
same state: each state must still get its own answers, whichever decoder built the
table first."""

from __future__ import annotations

import pytest

from meshmq.protocol.mqtt import (
    Auth,
    Connack,
    Connect,
    MqttDecoder,
    MqttProtocolError,
    Publish,
    encode,
)

AUTH = encode(Auth(), 5)
PUBLISH = encode(Publish("a/b", b"x"), 4)


def connected(level: int) -> MqttDecoder:
    decoder = MqttDecoder()
    assert decoder.feed(encode(Connect(client_id="c", protocol_level=level), level))
    return decoder


@pytest.mark.parametrize("first", [4, 5])
def test_each_level_keeps_its_own_rules_whichever_connected_first(first: int) -> None:
    decoders = {level: connected(level) for level in (first, 9 - first)}
    assert [type(p) for p in decoders[5].feed(AUTH)] == [Auth]
    with pytest.raises(MqttProtocolError, match="AUTH does not exist"):
        decoders[4].feed(AUTH)


def test_a_new_decoder_wants_connect_after_others_connected() -> None:
    connected(4)
    connected(5)
    with pytest.raises(MqttProtocolError, match="before CONNECT"):
        MqttDecoder().feed(PUBLISH)


def test_client_and_server_sides_keep_their_own_rules() -> None:
    connack = b"\x20\x02\x00\x00"
    client = MqttDecoder(protocol_level=4, server_side=False)
    assert [type(p) for p in client.feed(connack + PUBLISH)] == [Connack, Publish]
    with pytest.raises(MqttProtocolError, match="CONNACK sent by a client"):
        connected(4).feed(connack)
