"""The management endpoint off loopback: HTTP Basic credentials checked by the broker's
authenticator, the admin group for changes, HTTPS with real certificates, and
`meshmq stat` passing credentials and a CA. Real HTTP requests over loopback."""

from __future__ import annotations

import base64
import http.client
import json
import ssl
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from meshmq.config.model import AuthConfig, ManagementConfig, User
from meshmq.config.toml_loader import loads_toml
from meshmq.errors import ConfigError
from meshmq.management.server import _tls_context
from tests.support.brokers import ThreadBroker, make_config
from tests.support.pki import Pki

USERS = AuthConfig(users=(User("admin", "s3cret", ("admins",)),
                          User("bob", "bobpw", ("users",))))


@pytest.fixture
def start(broker_factory: Callable[..., ThreadBroker]) -> Callable[..., ThreadBroker]:
    def make(host: str = "0.0.0.0", auth: AuthConfig = USERS, **mgmt: Any) -> ThreadBroker:
        # 0.0.0.0 on port 0 is "not loopback"; the tests reach it only via 127.0.0.1.
        return broker_factory(auth=auth, management=ManagementConfig(host=host, port=0,
                                                                     **mgmt))
    return make


def request(port: int, method: str = "GET", path: str = "/api/stat",
            user: str | None = None, password: str = "",
            context: ssl.SSLContext | None = None) -> tuple[int, dict[str, str], Any]:
    conn: http.client.HTTPConnection
    if context is None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    else:
        conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=10, context=context)
    headers = {}
    if user is not None:
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        headers["Authorization"] = f"Basic {token}"
    try:
        conn.request(method, path, headers=headers)
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, json.loads(resp.read())
    finally:
        conn.close()


def test_off_loopback_every_request_needs_valid_credentials(start: Callable[..., ThreadBroker]
                                                            ) -> None:
    port = start().management_port
    for user, password in ((None, ""), ("admin", "wrong"), ("nobody", "s3cret"),
                           ("admin", "")):
        status, headers, body = request(port, user=user, password=password)
        assert status == 401, (user, password)
        assert headers["www-authenticate"] == 'Basic realm="meshmq", charset="UTF-8"'
        assert headers["content-type"].startswith("application/json")
        assert body["error"]
    status, _, body = request(port, user=None)
    assert body["error"].startswith("authentication required")
    status, _, body = request(port, path="/api/health", user="bob", password="bobpw")
    assert (status, body["status"]) == (200, "ok")
    status, _, body = request(port, user="admin", password="s3cret")
    assert status == 200 and "destinations" in body


def test_a_malformed_authorization_header_is_refused(start: Callable[..., ThreadBroker]
                                                     ) -> None:
    port = start().management_port
    for value in ("Bearer abc", "Basic !!!not-base64", "Basic " + base64.b64encode(
            b"no-colon").decode()):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("GET", "/api/stat", headers={"Authorization": value})
        resp = conn.getresponse()
        assert resp.status == 401, value
        assert "malformed Authorization header" in json.loads(resp.read())["error"]
        conn.close()


def test_changes_need_the_admin_group(start: Callable[..., ThreadBroker]) -> None:
    port = start().management_port
    status, _, body = request(port, "POST", user="bob", password="bobpw")
    assert status == 403
    assert body["error"] == ("user 'bob' is not in group 'admins' "
                             "(management.admin_group), which POST requests need")
    assert request(port, "DELETE", user=None)[0] == 401
    # An admin passes the check; no operation changes the broker yet.
    assert request(port, "POST", user="admin", password="s3cret")[0] == 405


def test_admin_group_is_configurable(start: Callable[..., ThreadBroker]) -> None:
    port = start(admin_group="users").management_port
    assert request(port, "POST", user="bob", password="bobpw")[0] == 405
    assert request(port, "POST", user="admin", password="s3cret")[0] == 403


def test_on_loopback_reading_needs_no_login_but_sent_credentials_are_checked(
        start: Callable[..., ThreadBroker]) -> None:
    port = start(host="127.0.0.1").management_port
    assert request(port)[0] == 200
    assert request(port, user="admin", password="wrong")[0] == 401
    assert request(port, user="bob", password="bobpw")[0] == 200
    # With users configured, changes need an admin even on loopback.
    assert request(port, "POST")[0] == 401
    assert request(port, "POST", user="bob", password="bobpw")[0] == 403


def test_loopback_without_users_stays_open(start: Callable[..., ThreadBroker]) -> None:
    port = start(host="127.0.0.1", auth=AuthConfig()).management_port
    assert request(port)[0] == 200
    assert request(port, user="whoever", password="x")[0] == 200


def test_off_loopback_without_users_is_a_configuration_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        loads_toml('[management]\nhost = "0.0.0.0"\n', file="meshmq.toml")
    text = str(err.value)
    assert text.startswith("meshmq.toml:2, option 'management.host': ")
    assert "open to the network" in text and "[[auth.users]]" in text
    assert 'management.host = "127.0.0.1"' in text
    for host in ("127.0.0.1", "::1", "localhost", "127.0.0.5"):
        loads_toml(f'[management]\nhost = "{host}"\n')
    loads_toml('[management]\nhost = "0.0.0.0"\n[[auth.users]]\nname = "a"\n'
               'password = "b"\n')
    # A host given on the command line (not through the loader) is refused at start.
    config = make_config(tmp_path, management=ManagementConfig(host="0.0.0.0", port=0))
    b = ThreadBroker(config)
    try:
        with pytest.raises(ConfigError, match="open to the network") as err:
            b.start()
        assert err.value.option == "management.host"
    finally:
        b.stop()


def test_https_with_a_verified_certificate(start: Callable[..., ThreadBroker], pki: Pki
                                          ) -> None:
    cert, key = pki.broker("a")
    port = start(ssl_certfile=cert, ssl_keyfile=key).management_port
    trusting = ssl.create_default_context(cafile=str(pki.ca))
    status, _, body = request(port, user="bob", password="bobpw", context=trusting)
    assert status == 200 and "destinations" in body
    assert request(port, context=trusting)[0] == 401
    with pytest.raises(ssl.SSLCertVerificationError):
        request(port, user="bob", password="bobpw", context=ssl.create_default_context(
            cafile=str(pki.untrusted / "ca.pem")))
    # Plain HTTP to the HTTPS port gets no answer, and the endpoint keeps serving.
    with pytest.raises((http.client.HTTPException, ConnectionError)):
        request(port, user="bob", password="bobpw")
    assert request(port, user="bob", password="bobpw", context=trusting)[0] == 200


def test_tls_context_refuses_below_tls_1_2(pki: Pki) -> None:
    cert, key = pki.broker("a")
    ctx = _tls_context(ManagementConfig(ssl_certfile=cert, ssl_keyfile=key), None)
    assert ctx is not None and ctx.minimum_version == ssl.TLSVersion.TLSv1_2


def test_unreadable_certificate_is_a_configuration_error(tmp_path: Path) -> None:
    missing = tmp_path / "missing.pem"
    with pytest.raises(ConfigError) as err:
        _tls_context(ManagementConfig(ssl_certfile=missing), "meshmq.toml")
    assert str(err.value).startswith("meshmq.toml, option 'management.ssl_certfile': "
                                     f"cannot load {missing}")
    with pytest.raises(ConfigError, match="ssl_keyfile needs ssl_certfile"):
        loads_toml('[management]\nssl_keyfile = "k.pem"\n')


# ------------------------------------------------------------------ meshmq stat

def meshmq(*args: str, password: str | None = None) -> subprocess.CompletedProcess[str]:
    import os

    env = {k: v for k, v in os.environ.items() if k != "MESHMQ_PASSWORD"}
    if password is not None:
        env["MESHMQ_PASSWORD"] = password
    return subprocess.run([sys.executable, "-m", "meshmq.cli.main", *args], env=env,
                          capture_output=True, text=True, timeout=60, check=False,
                          stdin=subprocess.DEVNULL)


def test_stat_passes_credentials_and_a_ca(start: Callable[..., ThreadBroker], pki: Pki
                                          ) -> None:
    cert, key = pki.broker("a")
    port = start(ssl_certfile=cert, ssl_keyfile=key).management_port
    url = f"https://127.0.0.1:{port}"
    ok = meshmq("stat", "--url", url, "--user", "bob", "--cafile", str(pki.ca), "--json",
                password="bobpw")
    assert ok.returncode == 0, ok.stderr
    assert "destinations" in json.loads(ok.stdout)

    anonymous = meshmq("stat", "--url", url, "--cafile", str(pki.ca))
    assert anonymous.returncode == 2
    assert anonymous.stderr.strip().splitlines() == [
        f"meshmq stat: the management endpoint at {url} refused: 401 authentication "
        "required: send HTTP Basic credentials of a configured user; pass --user NAME (the "
        "password from MESHMQ_PASSWORD, or asked for)"]

    wrong = meshmq("stat", "--url", url, "--user", "bob", "--cafile", str(pki.ca),
                   password="nope")
    assert wrong.returncode == 2
    assert "401 invalid user name or password (user 'bob')" in wrong.stderr
    assert len(wrong.stderr.strip().splitlines()) == 1

    untrusted = meshmq("stat", "--url", url, "--user", "bob", "--cafile",
                       str(pki.untrusted / "ca.pem"), password="bobpw")
    assert untrusted.returncode == 2
    assert untrusted.stderr.strip().splitlines() == [
        f"meshmq stat: cannot verify the certificate of the management endpoint at {url}: "
        "unable to get local issuer certificate; pass the CA that signed it with "
        "--cafile FILE"]


def test_users_from_a_users_file_with_hashed_passwords_guard_it(
        start: Callable[..., ThreadBroker], tmp_path: Path) -> None:
    """A users file (ActiveMQ's users.properties) counts as configured users, and a
    hashed password is checked (off the event loop) like an inline one."""
    from meshmq.core.passwords import hash_password

    users = tmp_path / "users.properties"
    users.write_text(f"ops={hash_password('0ps-pw')}\n")
    groups = tmp_path / "groups.properties"
    groups.write_text("admins=ops\n")
    port = start(auth=AuthConfig(users_file=users, groups_file=groups)).management_port
    assert request(port)[0] == 401
    assert request(port, user="ops", password="wrong")[0] == 401
    status, _, body = request(port, user="ops", password="0ps-pw")
    assert status == 200 and "destinations" in body
    assert request(port, method="POST", user="ops", password="0ps-pw")[0] == 405  # admin


def test_failed_logins_are_counted_and_held_back_like_the_listeners(
        start: Callable[..., ThreadBroker]) -> None:
    """The endpoint shares the client listeners' login backoff: after
    ``login_backoff_after`` failures from one address, each refusal waits."""
    import time

    broker = start()
    port = broker.management_port
    took = []
    for _ in range(4):
        began = time.monotonic()
        assert request(port, user="admin", password="guess")[0] == 401
        took.append(time.monotonic() - began)
    assert took[3] >= 0.45  # the fourth failure from 127.0.0.1 waits 0.5 s
    assert broker.stats()["failed_logins"] >= 4
    status, _, _ = request(port, user="admin", password="s3cret")
    assert status == 200
