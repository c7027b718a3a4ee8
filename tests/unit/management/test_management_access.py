"""Who may use the management API, through the real application (its login middleware
and the broker's authenticator) without a socket: off loopback every request needs a
valid HTTP Basic login, changes need the admin group, on loopback reading needs none;
refusals are JSON with a Basic challenge, and failed logins are held back like the
client listeners'. Over real HTTP (and HTTPS): tests/management/test_management_access.py."""

from __future__ import annotations

import base64
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.management.http import basic
from tests.support.memory_broker import memory_config
from tests.support.memory_management import MemoryManagement, Reply, memory_management

from meshmq.config.model import AuthConfig, ManagementConfig, User
from meshmq.core.passwords import hash_password

USERS = AuthConfig(users=(User("admin", "s3cret", ("admins",)),
                          User("bob", "bobpw", ("users",))))

Start = Callable[..., MemoryManagement]


@pytest.fixture
def start() -> Iterator[Start]:
    with_apis: list[Any] = []

    def make(host: str = "0.0.0.0", auth: AuthConfig = USERS, **mgmt: Any
             ) -> MemoryManagement:
        cm = memory_management(memory_config(
            auth=auth, management=ManagementConfig(enabled=False, host=host, **mgmt)))
        with_apis.append(cm)
        return cm.__enter__()

    try:
        yield make
    finally:
        for cm in reversed(with_apis):
            cm.__exit__(None, None, None)


def request(api: MemoryManagement, method: str = "GET", path: str = "/api/stat",
            user: str | None = None, password: str = "",
            headers: dict[str, str] | None = None) -> Reply:
    return api.request(method, path, headers={
        **(basic(user, password) if user is not None else {}), **(headers or {})})


def status(api: MemoryManagement, method: str = "GET", user: str | None = None,
           password: str = "") -> int:
    return request(api, method, user=user, password=password).status


def test_off_loopback_every_request_needs_valid_credentials(start: Start) -> None:
    api = start()
    for user, password in ((None, ""), ("admin", "wrong"), ("nobody", "s3cret"),
                           ("admin", "")):
        reply = request(api, user=user, password=password)
        assert reply.status == 401, (user, password)
        assert reply.headers["WWW-Authenticate"] == 'Basic realm="meshmq", charset="UTF-8"'
        assert reply.content_type == "application/json"
        assert reply.json()["error"]
    assert request(api).json()["error"].startswith("authentication required")
    assert request(api, user="admin", password="wrong").json()["error"].startswith(
        "invalid user name or password")
    reply = request(api, path="/api/health", user="bob", password="bobpw")
    assert (reply.status, reply.json()["status"]) == (200, "ok")
    reply = request(api, user="admin", password="s3cret")
    assert reply.status == 200 and "destinations" in reply.json()


def test_a_malformed_authorization_header_is_refused(start: Start) -> None:
    api = start()
    for value in ("Bearer abc", "Basic !!!not-base64", "Basic " + base64.b64encode(
            b"no-colon").decode()):
        reply = request(api, headers={"Authorization": value})
        assert reply.status == 401, value
        assert "malformed Authorization header" in reply.json()["error"]


def test_changes_need_the_admin_group(start: Start) -> None:
    api = start()
    reply = request(api, "POST", user="bob", password="bobpw")
    assert reply.status == 403
    assert reply.json()["error"] == ("user 'bob' is not in group 'admins' "
                                     "(management.admin_group), which POST requests need")
    assert status(api, "DELETE") == 401
    # An admin passes the check; no operation changes /api/stat.
    assert status(api, "POST", user="admin", password="s3cret") == 405


def test_admin_group_is_configurable(start: Start) -> None:
    api = start(admin_group="users")
    assert status(api, "POST", user="bob", password="bobpw") == 405
    assert status(api, "POST", user="admin", password="s3cret") == 403


def test_on_loopback_reading_needs_no_login_but_sent_credentials_are_checked(
        start: Start) -> None:
    api = start(host="127.0.0.1")
    assert status(api) == 200
    assert status(api, user="admin", password="wrong") == 401
    assert status(api, user="bob", password="bobpw") == 200
    # With users configured, changes need an admin even on loopback.
    reply = request(api, "POST")
    assert reply.status == 401
    assert reply.json()["error"] == ("POST changes the broker: log in as a user of "
                                     "group 'admins'")
    assert status(api, "POST", user="bob", password="bobpw") == 403


def test_loopback_without_users_stays_open(start: Start) -> None:
    api = start(host="127.0.0.1", auth=AuthConfig())
    assert status(api) == 200
    assert status(api, user="whoever", password="x") == 200
    assert status(api, "POST") == 405  # nobody to check against: passes to the route


def test_users_from_a_users_file_with_hashed_passwords_guard_it(
        start: Start, tmp_path: Path) -> None:
    """A users file (ActiveMQ's users.properties) counts as configured users, and a
    hashed password is checked (off the event loop) like an inline one."""
    users = tmp_path / "users.properties"
    users.write_text(f"ops={hash_password('0ps-pw')}\n")
    groups = tmp_path / "groups.properties"
    groups.write_text("admins=ops\n")
    api = start(auth=AuthConfig(users_file=users, groups_file=groups))
    assert status(api) == 401
    assert status(api, user="ops", password="wrong") == 401
    reply = request(api, user="ops", password="0ps-pw")
    assert reply.status == 200 and "destinations" in reply.json()
    assert status(api, "POST", user="ops", password="0ps-pw") == 405  # an admin


def test_failed_logins_are_counted_and_held_back_like_the_listeners(start: Start) -> None:
    """The endpoint shares the client listeners' login backoff: after
    ``login_backoff_after`` failures from one address, each refusal waits."""
    api = start()
    took = []
    for _ in range(4):
        began = time.monotonic()
        assert status(api, user="admin", password="guess") == 401
        took.append(time.monotonic() - began)
    assert max(took[:3]) < 0.45  # the first three are answered at once
    assert took[3] >= 0.45  # the fourth failure from 127.0.0.1 waits 0.5 s
    stats = api.broker.runtime.broker.statistics()
    assert (stats["failed_logins"], stats["login_slowed_addresses"]) == (4, 1)
    assert status(api, user="admin", password="s3cret") == 200
