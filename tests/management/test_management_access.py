"""The management endpoint off loopback as served: an HTTP Basic login over real HTTP,
HTTPS with real certificates, the listener refusing to open to the network without
users, and `meshmq stat` passing credentials and a CA. Real HTTP requests over loopback.
The access rules themselves (the admin group, loopback reads, malformed headers, users
files, the login backoff) are tested without a socket in
tests/unit/management/test_management_access.py."""

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
from meshmq.management.server import tls_context
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
    ctx = tls_context(ManagementConfig(ssl_certfile=cert, ssl_keyfile=key), None)
    assert ctx is not None and ctx.minimum_version == ssl.TLSVersion.TLSv1_2


def test_unreadable_certificate_is_a_configuration_error(tmp_path: Path) -> None:
    missing = tmp_path / "missing.pem"
    with pytest.raises(ConfigError) as err:
        tls_context(ManagementConfig(ssl_certfile=missing), "meshmq.toml")
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
