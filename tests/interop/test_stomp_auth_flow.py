"""Authentication, memory limits and producer flow control."""

from __future__ import annotations

import pytest
import stomp.exception

from meshmq.config.model import AuthConfig, User
from tests.interop.stomp_helpers import uid

_AUTH = AuthConfig(anonymous_access=False, users=(User("system", "manager", ("admins",)),))
# The node variant's users, as _AUTH; anonymous access stays on for the connections
# that find which shard a client's source port reaches (every test here gives a login).
NODE_TOML = ('\n[[auth.users]]\nname = "system"\npassword = "manager"\n'
             'groups = ["admins"]\n')


@pytest.fixture
def secured(broker_with):
    return broker_with(auth=_AUTH)


# ------------------------------------------------------------------ authentication






@pytest.mark.parametrize("version", ["1.0", "1.1", "1.2"])
def test_bad_login_stomppy(secured, client, version):
    c = client(version, on=secured, login="system", passcode="nope", connect=False)
    with pytest.raises(stomp.exception.ConnectFailedException):
        c.connect()
    err = c.listener.wait_error()
    assert err.headers["message"].endswith("or password is invalid.")
    c.listener.wait_disconnected()


@pytest.mark.parametrize("version", ["1.0", "1.1", "1.2"])
def test_good_login_works(secured, client, version):
    c = client(version, on=secured, login="system", passcode="manager")
    q = f"/queue/{uid('auth')}"
    c.subscribe(q)
    c.send(q, "authenticated")
    assert c.wait_messages(1)[0].body == "authenticated"






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






# ------------------------------------------------------------------ memory limit: block


def _fill(b, producer, q):
    sent = 0
    while b.stats()["memory"]["used"] < 5_000:
        producer.send(q, f"{sent}:{_BODY}")
        sent += 1
        assert sent < 20, "memory never filled"
    return sent




