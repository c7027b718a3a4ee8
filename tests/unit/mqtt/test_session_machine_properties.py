"""Hypothesis over the MQTT server session machine: every (state, input) pair is either
in the transition table or refused; any split of the client's bytes gives the same
events; arbitrary bytes only ever give packets and one ProtocolViolation; QoS 1/2
exchanges keep the receive-maximum count equal to the unsettled messages."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from meshmq.protocol.mqtt import (
    Connect,
    MqttProtocolError,
    Pingreq,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    ReasonCode,
    Subscribe,
    SubscriptionOptions,
)
from meshmq.protocol.mqtt.client import ClientConnection
from meshmq.protocol.mqtt.session import (
    TRANSITIONS,
    ConnInput,
    ConnState,
    InflightState,
    InvalidTransitionError,
    ProtocolViolation,
    ServerConnection,
    transition,
)


def server(receive_maximum: int = 8) -> ServerConnection[int]:
    return ServerConnection(max_packet_size=4096, retain_available=True,
                            receive_maximum=receive_maximum, max_inflight=8,
                            connect_timeout_s=5.0, keepalive_grace=1.5, now=0.0)


@given(st.sampled_from(ConnState), st.sampled_from(ConnInput))
def test_every_state_and_input_is_in_the_table_or_refused(state: ConnState,
                                                          event: ConnInput) -> None:
    if (state, event) in TRANSITIONS:
        assert transition(state, event) is TRANSITIONS[(state, event)]
    else:
        try:
            transition(state, event)
        except InvalidTransitionError:
            return
        raise AssertionError("a transition outside the table")


@given(st.lists(st.sampled_from(ConnInput), max_size=12))
def test_closed_is_final_and_failing_always_closes(events: list[ConnInput]) -> None:
    state = ConnState.AWAIT_CONNECT
    for event in events:
        try:
            nxt = transition(state, event)
        except InvalidTransitionError:
            continue
        if state is ConnState.CLOSED or event in (ConnInput.FAIL,
                                                  ConnInput.SERVER_DISCONNECT):
            assert nxt is ConnState.CLOSED
        state = nxt


client_packets = st.lists(st.one_of(
    st.builds(Publish, topic=st.sampled_from(["a", "a/b", "x/y/z"]),
              payload=st.binary(max_size=40), qos=st.just(0)),
    st.builds(lambda pid, q: Publish("t", b"p", qos=q, packet_id=pid),
              st.integers(1, 65535), st.integers(1, 2)),
    st.builds(Puback, st.integers(1, 65535)),
    st.builds(Pubcomp, st.integers(1, 65535)),
    st.just(Pingreq()),
    st.builds(lambda pid, flt: Subscribe(pid, [(flt, SubscriptionOptions(qos=1))]),
              st.integers(1, 65535), st.sampled_from(["a/#", "+/b", "c"])),
), max_size=8)


@settings(max_examples=60)
@given(st.sampled_from([4, 5]), client_packets, st.data())
def test_any_split_of_the_bytes_gives_the_same_events(level: int, packets: list[object],
                                                      data: st.DataObject) -> None:
    cli = ClientConnection(level)
    wire = cli.send(Connect(client_id="c", protocol_level=level)) + \
        b"".join(cli.send(p) for p in packets)  # type: ignore[arg-type]
    whole = server().receive_data(wire, 0.0)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(wire)), max_size=6)))
    srv = server()
    pieces: list[object] = []
    for a, b in zip([0, *cuts], [*cuts, len(wire)], strict=True):
        pieces.extend(srv.receive_data(wire[a:b], 0.0))
    assert pieces == whole == [Connect(client_id="c", protocol_level=level), *packets]
    assert srv.state is ConnState.CONNECTING


@settings(max_examples=200)
@given(st.binary(max_size=64))
def test_arbitrary_bytes_give_packets_then_at_most_one_violation(data: bytes) -> None:
    srv = server()
    events = srv.receive_data(data, 0.0)
    violations = [e for e in events if isinstance(e, ProtocolViolation)]
    assert len(violations) <= 1
    if violations:
        assert events[-1] is violations[0]
        reply = srv.fail(violations[0].error)
        assert isinstance(reply, bytes)
        assert srv.state is ConnState.CLOSED
        assert srv.receive_data(data, 1.0) == []


@settings(max_examples=100)
@given(st.lists(st.tuples(st.sampled_from(["publish1", "publish2", "ack", "rel"]),
                          st.integers(1, 6)), max_size=30))
def test_receive_maximum_counts_exactly_the_unsettled(steps: list[tuple[str, int]]) -> None:
    """A well-behaved client (never over the maximum); the server's count follows."""
    limit = 4
    srv = server(receive_maximum=limit)
    srv.accept(keep_alive=0, receive_maximum=None, alias_max=0, client_max_packet=0)
    unacked_q1: set[int] = set()
    owned_q2: set[int] = set()  # PUBREC sent, PUBREL not yet
    for step, pid in steps:
        busy = unacked_q1 | owned_q2
        if step.startswith("publish") and pid not in busy and len(busy) < limit:
            qos = 1 if step == "publish1" else 2
            assert srv.publish_received(Publish("t", b"m", qos=qos, packet_id=pid)) == "t"
            if qos == 1:
                unacked_q1.add(pid)
            else:
                srv.qos2_received(pid, "t", b"m")
                srv.send(Pubrec(pid))
                owned_q2.add(pid)
        elif step == "ack" and pid in unacked_q1:
            srv.send(Puback(pid))
            unacked_q1.discard(pid)
        elif step == "rel":
            code, _ = srv.pubrel_received(pid)
            assert (code == ReasonCode.SUCCESS) == (pid in owned_q2)
            owned_q2.discard(pid)
            srv.send(Pubcomp(pid, reason_code=code))
        assert srv.inbound_pending == len(unacked_q1) + len(owned_q2)
        assert srv.inflight.inbound_qos2 == owned_q2


@settings(max_examples=50)
@given(st.sets(st.integers(1, 65535), max_size=20), st.data())
def test_outbound_ids_are_unique_and_reusable_once_settled(held: set[int],
                                                           data: st.DataObject) -> None:
    srv = server()
    srv.inflight.outbound_pubrel = set(held)
    pids = [srv.allocate_pid(i) for i in range(40)]
    assert len(set(pids)) == 40 and not set(pids) & held
    settle = data.draw(st.lists(st.sampled_from(pids), unique=True))
    for pid in settle:
        assert srv.puback_received(pid) == pids.index(pid)
    assert srv.inflight_count == 40 - len(settle)


@given(st.builds(InflightState, st.sets(st.integers(1, 65535)),
                 st.dictionaries(st.integers(1, 65535), st.integers(0, 2**32)),
                 st.dictionaries(st.integers(1, 65535), st.integers(0, 2**32)),
                 st.sets(st.integers(1, 65535))))
def test_inflight_state_survives_its_session_record(state: InflightState) -> None:
    assert InflightState.from_record(json.loads(json.dumps(state.to_record()))) == state


def test_a_second_connect_and_garbage_are_violations_not_exceptions() -> None:
    srv = server()
    cli = ClientConnection(5)
    events = srv.receive_data(cli.send(Connect(client_id="c")) * 2, 0.0)
    assert isinstance(events[-1], ProtocolViolation)
    assert isinstance(events[-1].error, MqttProtocolError)
