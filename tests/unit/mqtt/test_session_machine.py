"""The MQTT server session machine driven by a client machine, no sockets: CONNECT and
its answers, protocol violations and their reason codes, receive maximum, QoS 2
exchanges both ways, packet ids, topic aliases both ways, keep-alive."""

from __future__ import annotations

import pytest

from meshmq.protocol.mqtt import (
    Connack,
    Connect,
    Disconnect,
    MqttProtocolError,
    Pingreq,
    Properties,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    ReasonCode,
)
from meshmq.protocol.mqtt.client import ClientConnection
from meshmq.protocol.mqtt.session import (
    UNSUPPORTED_VERSION_CONNACK,
    ConnectTimeout,
    ConnState,
    KeepAliveTimeout,
    ProtocolViolation,
    ServerConnection,
)

Events = list[object]


def server(**overrides: float) -> ServerConnection[str]:
    opts: dict[str, float] = dict(max_packet_size=65536, receive_maximum=4,
                                  max_inflight=16, connect_timeout_s=5.0,
                                  keepalive_grace=1.5, now=0.0)
    opts.update(overrides)
    return ServerConnection(max_packet_size=int(opts["max_packet_size"]),
                            retain_available=True, receive_maximum=int(opts["receive_maximum"]),
                            max_inflight=int(opts["max_inflight"]),
                            connect_timeout_s=opts["connect_timeout_s"],
                            keepalive_grace=opts["keepalive_grace"], now=opts["now"])


def byte_by_byte(srv: ServerConnection[str], data: bytes, now: float = 0.0) -> Events:
    events: Events = []
    for i in range(len(data)):
        events.extend(srv.receive_data(data[i:i + 1], now))
    return events


def connected(level: int = 5, *, keep_alive: int = 0, alias_max: int = 0,
              client_max_packet: int = 0, **overrides: float,
              ) -> tuple[ServerConnection[str], ClientConnection]:
    srv, cli = server(**overrides), ClientConnection(level)
    events = byte_by_byte(srv, cli.send(Connect(client_id="c", keep_alive=keep_alive,
                                                protocol_level=level)))
    assert [type(e) for e in events] == [Connect]
    assert srv.state is ConnState.CONNECTING and srv.level == level
    srv.accept(keep_alive=keep_alive, receive_maximum=None, alias_max=alias_max,
               client_max_packet=client_max_packet)
    assert cli.receive_data(srv.send(Connack(False, ReasonCode.SUCCESS))) == \
        [Connack(False, ReasonCode.SUCCESS)]
    assert srv.state is ConnState.CONNECTED
    return srv, cli


def violation(events: Events) -> MqttProtocolError:
    assert events and isinstance(events[-1], ProtocolViolation), events
    return events[-1].error


# ---------------------------------------------------------------- CONNECT and violations
@pytest.mark.parametrize("level", [4, 5])
def test_connect_byte_by_byte_then_ping(level: int) -> None:
    srv, cli = connected(level)
    assert byte_by_byte(srv, cli.send(Pingreq())) == [Pingreq()]


def test_packet_before_connect_is_answered_by_closing() -> None:
    srv = server()
    err = violation(srv.receive_data(ClientConnection(4).send(Pingreq()), 0.0))
    assert srv.fail(err) == b""
    assert srv.state is ConnState.CLOSED
    assert srv.receive_data(b"\xc0\x00", 1.0) == []  # nothing after the end


def test_unsupported_protocol_version_gets_the_311_connack() -> None:
    srv = server()
    data = bytearray(ClientConnection(4).send(Connect(client_id="c", protocol_level=4)))
    data[8] = 3  # protocol level byte: MQTT 3.1
    err = violation(srv.receive_data(bytes(data), 0.0))
    assert err.reason_code == ReasonCode.UNSUPPORTED_PROTOCOL_VERSION
    assert srv.fail(err) == UNSUPPORTED_VERSION_CONNACK


def test_second_connect_is_a_protocol_error_disconnect_in_v5() -> None:
    srv, cli = connected(5)
    err = violation(srv.receive_data(cli.send(Connect(client_id="c")), 1.0))
    reply = cli.receive_data(srv.fail(err))
    assert len(reply) == 1 and isinstance(reply[0], Disconnect)
    assert reply[0].reason_code == ReasonCode.PROTOCOL_ERROR
    assert srv.state is ConnState.CLOSED


@pytest.mark.parametrize(("level", "answered"), [(4, False), (5, True)])
def test_malformed_connect_refused_in_v5_closed_in_311(level: int, answered: bool) -> None:
    srv = server()
    data = bytearray(ClientConnection(level).send(Connect(client_id="c",
                                                          protocol_level=level)))
    data[9] |= 1  # the reserved CONNECT flag
    err = violation(srv.receive_data(bytes(data), 0.0))
    reply = srv.fail(err)
    assert srv.state is ConnState.CLOSED
    if not answered:
        assert reply == b""
        return
    (ack,) = ClientConnection(5).receive_data(reply)
    assert isinstance(ack, Connack) and ack.reason_code == ReasonCode.MALFORMED_PACKET


def test_disconnect_never_carries_a_connack_only_code() -> None:
    srv, cli = connected(5)
    (pkt,) = cli.receive_data(srv.disconnect(ReasonCode.BAD_AUTHENTICATION_METHOD, "x"))
    assert isinstance(pkt, Disconnect) and pkt.reason_code == ReasonCode.UNSPECIFIED_ERROR


def test_311_disconnect_is_a_plain_close() -> None:
    srv, _ = connected(4)
    assert srv.disconnect(ReasonCode.KEEP_ALIVE_TIMEOUT, "silent") == b""
    assert srv.state is ConnState.CLOSED


# ---------------------------------------------------------------- inbound PUBLISH
def test_receive_maximum_counts_unacknowledged_publishes() -> None:
    srv, cli = connected(5, receive_maximum=2)
    for pid in (1, 2):
        (pub,) = srv.receive_data(cli.send(Publish("t", b"x", qos=1, packet_id=pid)), 0.0)
        assert isinstance(pub, Publish) and srv.publish_received(pub) == "t"
    assert srv.inbound_pending == 2
    cli.receive_data(srv.send(Puback(1)))  # frees one place
    (pub,) = srv.receive_data(cli.send(Publish("t", b"x", qos=1, packet_id=3)), 0.0)
    assert isinstance(pub, Publish) and srv.publish_received(pub) == "t"
    (pub,) = srv.receive_data(cli.send(Publish("t", b"x", qos=1, packet_id=4)), 0.0)
    assert isinstance(pub, Publish)
    with pytest.raises(MqttProtocolError) as info:
        srv.publish_received(pub)
    assert info.value.reason_code == ReasonCode.RECEIVE_MAXIMUM_EXCEEDED


def test_qos0_publishes_do_not_count() -> None:
    srv, cli = connected(5, receive_maximum=1)
    for _ in range(5):
        (pub,) = srv.receive_data(cli.send(Publish("t", b"x")), 0.0)
        assert isinstance(pub, Publish) and srv.publish_received(pub) == "t"
    assert srv.inbound_pending == 0


def test_inbound_qos2_exchange_and_retransmissions() -> None:
    srv, cli = connected(5)
    pub = Publish("t", b"once", qos=2, packet_id=7)
    assert srv.publish_received(pub) == "t"
    srv.qos2_received(7, "t", b"once")
    assert cli.receive_data(srv.send(Pubrec(7))) == [Pubrec(7)]
    assert srv.publish_received(Publish("t", b"once", qos=2, packet_id=7, dup=True)) is None
    assert srv.inbound_pending == 1  # a retransmission does not count again
    assert srv.pubrel_received(7) == (ReasonCode.SUCCESS, True)
    assert srv.inbound_pending == 0
    # Released, PUBCOMP not yet sent: the same message again is a retransmission.
    assert srv.publish_received(Publish("t", b"once", qos=2, packet_id=7, dup=True)) is None
    assert srv.pubrel_received(7) == (ReasonCode.SUCCESS, True)
    assert cli.receive_data(srv.send(Pubcomp(7))) == [Pubcomp(7)]
    assert srv.pubrel_received(7) == (ReasonCode.PACKET_IDENTIFIER_NOT_FOUND, False)


def test_released_id_reused_for_a_new_message_is_new() -> None:
    srv, _ = connected(5)
    srv.publish_received(Publish("t", b"a", qos=2, packet_id=3))
    srv.qos2_received(3, "t", b"a")
    srv.pubrel_received(3)
    assert srv.publish_received(Publish("t", b"other", qos=2, packet_id=3)) == "t"


def test_pubrel_of_an_id_released_before_a_restart_completes() -> None:
    srv, _ = connected(5)
    srv.inflight.released[9] = 1234  # restored from the session record
    assert srv.pubrel_received(9) == (ReasonCode.SUCCESS, False)
    assert 9 not in srv.inflight.released


def test_refusing_pubrec_frees_receive_maximum_room() -> None:
    srv, _ = connected(5, receive_maximum=1)
    srv.publish_received(Publish("t", b"a", qos=2, packet_id=1))
    srv.send(Pubrec(1, ReasonCode.NOT_AUTHORIZED))
    assert srv.inbound_pending == 0


def test_inbound_topic_aliases() -> None:
    srv, cli = connected(5)
    (first,) = srv.receive_data(cli.send(Publish("a/b", b"", properties=Properties(
        topic_alias=3))), 0.0)
    assert isinstance(first, Publish) and srv.publish_received(first) == "a/b"
    (again,) = srv.receive_data(cli.send(Publish("", b"", properties=Properties(
        topic_alias=3))), 0.0)
    assert isinstance(again, Publish) and srv.publish_received(again) == "a/b"
    with pytest.raises(MqttProtocolError) as unknown:
        srv.publish_received(Publish("", b"", properties=Properties(topic_alias=4)))
    assert unknown.value.reason_code == ReasonCode.PROTOCOL_ERROR
    with pytest.raises(MqttProtocolError) as too_big:
        srv.publish_received(Publish("x", b"", properties=Properties(topic_alias=65)))
    assert too_big.value.reason_code == ReasonCode.TOPIC_ALIAS_INVALID


# ---------------------------------------------------------------- outbound PUBLISH
def test_outbound_qos2_exchange_holds_the_id_until_pubcomp() -> None:
    srv, cli = connected(5)
    pid = srv.allocate_pid("delivery-1")
    data = srv.publish("t", None, b"m", 2, pid, retain=False, dup=False, props=None)
    assert data is not None
    (pub,) = cli.receive_data(data)
    assert isinstance(pub, Publish) and pub.packet_id == pid and pub.qos == 2
    assert srv.pubrec_received(pid, False) == ("delivery-1", True)
    assert cli.receive_data(srv.send(Pubrel(pid))) == [Pubrel(pid)]
    assert pid in srv.inflight.outbound_pubrel
    assert srv.pubcomp_received(pid) is True
    assert srv.inflight_count == 0


def test_outbound_failed_pubrec_ends_the_exchange() -> None:
    srv, _ = connected(5)
    pid = srv.allocate_pid("d")
    assert srv.pubrec_received(pid, True) == ("d", False)
    assert srv.inflight_count == 0 and not srv.inflight.outbound_pubrel


def test_packet_ids_skip_those_in_use_and_run_out() -> None:
    srv, _ = connected(5)
    srv.inflight.outbound_pubrel.add(2)
    assert [srv.allocate_pid("x") for _ in range(3)] == [1, 3, 4]
    assert srv.puback_received(3) == "x"
    for _ in range(65535 - 4):
        srv.allocate_pid("x")
    assert srv.allocate_pid("x") == 3  # the only one left
    with pytest.raises(MqttProtocolError):
        srv.allocate_pid("x")


def test_forget_outbound_frees_the_ids_of_one_holder() -> None:
    srv, _ = connected(5)
    a, b = srv.allocate_pid("a"), srv.allocate_pid("b")
    srv.forget_outbound(lambda held: held == "a")
    assert srv.puback_received(a) is None and srv.puback_received(b) == "b"


def test_outbound_topic_aliases_least_recently_used() -> None:
    srv, cli = connected(5, alias_max=1)

    def out(topic: str) -> Publish:
        data = srv.publish(topic, None, b"m", 0, None, retain=False, dup=False, props=None)
        assert data is not None
        (pub,) = cli.receive_data(data)
        assert isinstance(pub, Publish)
        return pub

    first, second, third = out("a"), out("a"), out("b")
    assert (first.topic, first.properties.topic_alias) == ("a", 1)
    assert (second.topic, second.properties.topic_alias) == ("", 1)  # known: topic left out
    assert (third.topic, third.properties.topic_alias) == ("b", 1)  # "a" evicted


def test_oversized_publish_is_dropped_and_its_alias_not_taken() -> None:
    srv, cli = connected(5, alias_max=1, client_max_packet=40)
    srv.publish("a", None, b"m", 0, None, retain=False, dup=False, props=None)
    assert srv.publish("b", None, b"x" * 100, 0, None, retain=False, dup=False,
                       props=None) is None
    data = srv.publish("a", None, b"m", 0, None, retain=False, dup=False, props=None)
    assert data is not None
    (pub,) = cli.receive_data(data)
    assert isinstance(pub, Publish) and pub.topic == ""  # "a" still holds alias 1


# ---------------------------------------------------------------- timeouts
def test_connect_timeout() -> None:
    srv = server(connect_timeout_s=5.0)
    assert srv.timeouts(5.0) is None
    assert isinstance(srv.timeouts(5.1), ConnectTimeout)


def test_keep_alive_timeout_after_grace_and_reset_by_any_bytes() -> None:
    srv, cli = connected(5, keep_alive=10)
    assert srv.timeouts(15.0) is None
    srv.receive_data(cli.send(Pingreq())[:1], 14.0)  # part of a packet is traffic too
    assert srv.timeouts(29.0) is None
    overdue = srv.timeouts(29.5)
    assert isinstance(overdue, KeepAliveTimeout) and overdue.silent_s == pytest.approx(15.5)


def test_no_keep_alive_means_no_timeout() -> None:
    srv, _ = connected(4, keep_alive=0)
    assert srv.timeouts(1e9) is None
