"""Authentication, memory limits and producer flow control."""

from __future__ import annotations

import pytest
from tests.support.raw_stomp import ClosedError, uid

from meshmq.config.model import AuthConfig, UsageConfig, User

_AUTH = AuthConfig(anonymous_access=False, users=(User("system", "manager", ("admins",)),))


@pytest.fixture
def secured(broker_factory):
    return broker_factory(auth=_AUTH)


# ------------------------------------------------------------------ authentication


@pytest.mark.parametrize(("login", "passcode"), [
    ("system", "wrong"), ("nobody", "manager"), ("system", ""), ("", "")])
def test_bad_login_gets_error_then_close_raw(secured, raw, login, passcode):
    r = raw(on=secured)
    r.send_frame("CONNECT", [("accept-version", "1.2"), ("host", "h"), ("login", login),
                             ("passcode", passcode)])
    err = r.expect_error_and_close()
    assert err["message"].endswith("or password is invalid.")


def test_anonymous_refused_when_disabled(secured, raw):
    r = raw(on=secured)
    r.send_frame("CONNECT", [("accept-version", "1.1"), ("host", "h")])
    err = r.expect_error_and_close()
    assert err["message"].endswith("or password is invalid.")
    assert secured.stats()["connections"] == 0






def test_bad_login_does_not_disturb_others(secured, client, raw):
    good = client(on=secured, login="system", passcode="manager")
    q = f"/queue/{uid('auth2')}"
    good.subscribe(q)
    for _ in range(3):
        r = raw(on=secured)
        r.send_frame("CONNECT", [("accept-version", "1.2"), ("host", "h"), ("login", "x"),
                                 ("passcode", "y")])
        r.expect_error_and_close()
    good.send(q, "fine")
    assert good.wait_messages(1)[0].body == "fine"


def test_wrong_login_refused_even_with_anonymous_access(broker_factory, raw):
    b = broker_factory(auth=AuthConfig(anonymous_access=True, users=_AUTH.users))
    r = raw(on=b)
    r.send_frame("CONNECT", [("accept-version", "1.2"), ("host", "h"), ("login", "system"),
                             ("passcode", "typo")])
    assert r.expect_error_and_close()["message"].endswith("or password is invalid.")
    ok = raw(on=b)
    ok.connect("1.2")  # anonymous is still fine


# ------------------------------------------------------------------ memory limit: fail

_BODY = "x" * 1000  # ~1.2 KB of accounted memory per message


def _fill_until_error(producer, q):
    """Send with receipts until the broker answers ERROR; returns how many were confirmed."""
    listener = producer.listener
    for confirmed in range(50):
        rid = uid("fill-")
        producer.conn.send(q, _BODY, headers={"receipt": rid})
        listener.wait(lambda rid=rid: rid in listener.receipts or listener.errors,
                      what="a receipt or an ERROR")
        if listener.errors:
            assert rid not in listener.receipts  # the rejected send is not confirmed
            return confirmed
    raise AssertionError("the memory limit never rejected a send")


def test_memory_limit_fail_mode_rejects_with_error(broker_factory, client):
    b = broker_factory(usage=UsageConfig(memory_limit=5_000, on_limit="fail"))
    producer = client(on=b)
    q = f"/queue/{uid('full')}"
    confirmed = _fill_until_error(producer, q)
    err = producer.listener.errors[0]
    assert "memory limit" in err.headers["message"]
    producer.listener.wait_disconnected()
    assert 1 <= confirmed <= 6
    # the broker is up and every confirmed message is still deliverable
    consumer = client(on=b)
    consumer.subscribe(q)
    consumer.wait_messages(confirmed)
    assert consumer.bodies()[:confirmed] == [_BODY] * confirmed


def test_memory_limit_fail_mode_lets_consumers_connect_and_drain(broker_factory, client, raw):
    b = broker_factory(usage=UsageConfig(memory_limit=5_000, on_limit="fail"))
    q = f"/queue/{uid('full2')}"
    confirmed = _fill_until_error(client(on=b), q)
    assert b.stats()["memory"]["used"] >= 5_000
    # a consumer sends no messages: ActiveMQ never rejects it for a full memory
    r = raw(on=b)
    try:
        r.connect("1.2")
        r.send_frame("SUBSCRIBE", [("destination", q), ("id", "1"), ("receipt", "sub")])
        msgs = [f for f in r.read_until_receipt("sub") if f.command == "MESSAGE"]
        while len(msgs) < confirmed:
            msgs.append(r.read_frame())
    except ClosedError:
        pytest.fail("a consumer was sent ERROR and closed because memory was full")
    assert [f.command for f in msgs] == ["MESSAGE"] * confirmed


# ------------------------------------------------------------------ memory limit: block


def _fill(b, producer, q):
    sent = 0
    while b.stats()["memory"]["used"] < 5_000:
        producer.send(q, f"{sent}:{_BODY}")
        sent += 1
        assert sent < 20, "memory never filled"
    return sent


def test_producer_flow_control_blocks_until_consumer_drains(broker_factory, client, raw):
    b = broker_factory(usage=UsageConfig(memory_limit=5_000, on_limit="block"))
    producer = client(on=b)
    consumer = client(on=b)  # connected before memory fills
    bystander = raw(on=b)
    bystander.connect("1.2")
    q = f"/queue/{uid('pfc')}"
    sent = _fill(b, producer, q)
    # memory is full: the next send is held and its receipt does not come
    rid = uid("held-")
    producer.conn.send(q, f"{sent}:{_BODY}", headers={"receipt": rid})
    sent += 1
    # barrier: the broker answers another connection meanwhile (one frame, one receipt)
    bystander.send_frame("BEGIN", [("transaction", "t"), ("receipt", "b1")])
    bystander.read_until_receipt("b1")
    assert rid not in producer.listener.receipts
    assert b.destination_stats(q.removeprefix("/queue/"))["depth"] == sent - 1
    # a consumer drains: the held send completes and nothing was lost or reordered
    consumer.subscribe(q)
    producer.listener.wait_receipt(rid)
    for _ in range(5):
        producer.send(q, f"{sent}:{_BODY}")
        sent += 1
    msgs = consumer.wait_messages(sent)
    assert [int(m.body.split(":")[0]) for m in msgs] == list(range(sent))
    assert not producer.listener.errors


def test_producer_flow_control_blocks_only_producers(broker_factory, client, raw):
    b = broker_factory(usage=UsageConfig(memory_limit=5_000, on_limit="block"))
    producer = client(on=b)
    early = raw(on=b)
    early.connect("1.2")
    q = f"/queue/{uid('pfc2')}"
    sent = _fill(b, producer, q)
    producer.conn.send(q, _BODY, headers={"receipt": "held"})
    # a connection that only does BEGIN/ABORT/SUBSCRIBE must keep being served
    for i in range(3):
        early.send_frame("BEGIN", [("transaction", f"t{i}"), ("receipt", f"b{i}")])
        try:
            early.read_until_receipt(f"b{i}", timeout=5)
        except TimeoutError:
            pytest.fail(f"a connection that sends no messages stopped being read after "
                        f"{i} frame(s) while memory was full")
    # so must a consumer that connects while memory is full
    late = raw(on=b)
    late.connect("1.2")
    late.send_frame("SUBSCRIBE", [("destination", q), ("id", "1"), ("receipt", "s")])
    try:
        msgs = [f for f in late.read_until_receipt("s", timeout=5) if f.command == "MESSAGE"]
    except TimeoutError:
        pytest.fail("a consumer connecting while memory was full was never served")
    while len(msgs) < sent + 1:
        msgs.append(late.read_frame(timeout=5))
    assert len(msgs) == sent + 1
    producer.listener.wait_receipt("held")
