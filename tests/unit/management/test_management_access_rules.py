"""Who may use the management endpoint, decided without HTTP: the Basic credentials a
request carries (``parse_basic``), which hosts count as loopback, and ``decide`` for each
kind of caller (anonymous, a user outside the admin group, an admin, a login the
authenticator maps to the anonymous principal)."""

from __future__ import annotations

import asyncio
import base64

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshmq.config.model import AuthConfig, BrokerConfig, ManagementConfig, User
from meshmq.core.auth import Principal
from meshmq.errors import AuthenticationError
from meshmq.management.access import Decision, decide, parse_basic

USERS = AuthConfig(users=(User("admin", "pw", ("admins",)), User("bob", "pw", ("users",))))


def basic(text: str | bytes) -> str:
    raw = text.encode() if isinstance(text, str) else text
    return "Basic " + base64.b64encode(raw).decode()


@pytest.mark.parametrize(("header", "expected"), [
    pytest.param(basic("bob:secret"), ("bob", "secret"), id="plain"),
    pytest.param("basic " + basic("bob:secret")[6:], ("bob", "secret"), id="scheme-any-case"),
    pytest.param("  " + basic("bob:secret") + "  ", ("bob", "secret"), id="surrounding-space"),
    pytest.param(basic("bob:a:b"), ("bob", "a:b"), id="colon-in-password"),
    pytest.param(basic("bob:"), ("bob", ""), id="empty-password"),
    pytest.param(basic("jörg:pässword"), ("jörg", "pässword"), id="utf8"),
])
def test_basic_credentials_are_read(header: str, expected: tuple[str, str]) -> None:
    assert parse_basic(header) == expected


@pytest.mark.parametrize("header", [
    pytest.param("Bearer abc.def", id="other-scheme"),
    pytest.param("Basic", id="no-token"),
    pytest.param("Basic    ", id="blank-token"),
    pytest.param("Basic not*base64", id="not-base64"),
    pytest.param(basic("no-colon"), id="no-colon"),
    pytest.param(basic(":secret"), id="empty-user"),
    pytest.param(basic(b"\xff\xfe:x"), id="not-utf8"),
])
def test_malformed_basic_credentials_are_none(header: str) -> None:
    assert parse_basic(header) is None


@given(user=st.text(min_size=1).filter(lambda u: ":" not in u), password=st.text())
def test_any_user_and_password_survive_the_basic_encoding(user: str, password: str) -> None:
    assert parse_basic(basic(f"{user}:{password}")) == (user, password)


@pytest.mark.parametrize(("host", "loopback"), [
    ("127.0.0.1", True), ("127.8.9.10", True), ("::1", True), ("[::1]", True),
    ("localhost", True), ("0.0.0.0", False), ("::", False), ("10.1.2.3", False),
    ("broker.example.com", False),
])
def test_which_management_hosts_are_loopback(host: str, loopback: bool) -> None:
    assert ManagementConfig(host=host).loopback is loopback


async def _authenticate(user: str, password: str) -> Principal:
    if password != "pw":
        raise AuthenticationError("bad password")
    groups = {u.name: u.groups for u in USERS.users}.get(user)
    if groups is None:  # an unknown user logs in as the anonymous principal
        return Principal("anonymous", frozenset({"anonymous"}), anonymous=True)
    return Principal(user, frozenset(groups))


def run_decide(method: str, header: str | None, host: str = "0.0.0.0",
               admin_group: str = "admins") -> Decision:
    config = BrokerConfig(auth=USERS,
                          management=ManagementConfig(host=host, admin_group=admin_group))
    return asyncio.run(decide(config, method, header, _authenticate))


@pytest.mark.parametrize(("method", "header", "host", "status", "words"), [
    pytest.param("GET", None, "0.0.0.0", 401, "authentication required", id="anonymous-off-lo"),
    pytest.param("GET", basic("bob:nope"), "127.0.0.1", 401, "invalid user name or password",
                 id="wrong-password-on-lo"),
    pytest.param("GET", basic("stranger:pw"), "0.0.0.0", 401,
                 "invalid user name or password", id="maps-to-anonymous"),
    pytest.param("GET", "Digest x", "127.0.0.1", 401, "malformed Authorization header",
                 id="malformed-on-lo"),
    pytest.param("PUT", None, "127.0.0.1", 401, "PUT changes the broker: log in",
                 id="anonymous-change-on-lo"),
    pytest.param("DELETE", basic("bob:pw"), "0.0.0.0", 403,
                 "user 'bob' is not in group 'admins'", id="not-admin"),
])
def test_refusals_say_why(method: str, header: str | None, host: str, status: int,
                          words: str) -> None:
    decision = run_decide(method, header, host)
    assert not decision.allowed
    assert decision.status == status and words in decision.error


@pytest.mark.parametrize(("method", "header", "host", "user"), [
    pytest.param("GET", None, "127.0.0.1", None, id="anonymous-read-on-lo"),
    pytest.param("HEAD", basic("bob:pw"), "0.0.0.0", "bob", id="head-is-a-read"),
    pytest.param("GET", basic("bob:pw"), "0.0.0.0", "bob", id="user-read"),
    pytest.param("POST", basic("admin:pw"), "0.0.0.0", "admin", id="admin-change"),
])
def test_allowed_requests_carry_who_made_them(method: str, header: str | None, host: str,
                                              user: str | None) -> None:
    decision = run_decide(method, header, host)
    assert decision.allowed and decision.status == 0
    assert (decision.principal.user if decision.principal else None) == user


def test_the_admin_group_is_the_configured_one() -> None:
    assert run_decide("POST", basic("bob:pw"), admin_group="users").allowed
    refused = run_decide("POST", basic("admin:pw"), admin_group="users")
    assert refused.status == 403 and "group 'users'" in refused.error


@pytest.mark.parametrize(("header", "host", "status"), [
    pytest.param(basic("bob:pw"), "0.0.0.0", 0, id="any-user"),
    pytest.param(None, "127.0.0.1", 0, id="anonymous-on-lo"),
    pytest.param(None, "0.0.0.0", 401, id="anonymous-off-lo"),
])
def test_a_jolokia_post_is_a_read(header: str | None, host: str, status: int) -> None:
    # Monitoring tools send Jolokia reads as POST (bulk requests); the endpoint only
    # reads, so it needs what a GET needs, not the admin group.
    config = BrokerConfig(auth=USERS, management=ManagementConfig(host=host))
    decision = asyncio.run(decide(config, "POST", header, _authenticate, "/api/jolokia"))
    assert decision.status == status
    other = asyncio.run(decide(config, "POST", header, _authenticate, "/api/queues/x/purge"))
    assert not other.allowed  # any other POST still changes the broker
