"""`meshmq send` and `receive` over TLS: the broker's certificate verified against
--cafile, a client certificate from --cert/--key, and one line when it fails."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.support.brokers import ThreadBroker, make_config
from tests.support.pki import Pki

from meshmq.config.model import ListenerConfig


def meshmq(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "meshmq.cli.main", *args],
                          capture_output=True, text=True, timeout=60, check=False)


@pytest.fixture
def need_broker(tmp_path: Path, pki: Pki) -> Iterator[ThreadBroker]:
    cert, key = pki.broker("a")
    listener = ListenerConfig(name="stomp_ssl", protocol="stomp+ssl", host="127.0.0.1",
                              port=0, ssl_certfile=cert, ssl_keyfile=key, ssl_cafile=pki.ca,
                              client_auth="need")
    b = ThreadBroker(make_config(tmp_path / "data", listeners=(listener,))).start()
    try:
        yield b
    finally:
        b.stop()


def test_send_and_receive_with_a_ca_and_a_client_certificate(need_broker: ThreadBroker,
                                                             pki: Pki) -> None:
    assert need_broker.runtime is not None
    port = need_broker.runtime.addresses["stomp_ssl"][1]
    cert, key = pki.client("app")
    tls = ("--cafile", str(pki.ca), "--cert", str(cert), "--key", str(key))
    sent = meshmq("send", "/queue/cli.tls", "over tls", "--url", f"127.0.0.1:{port}", *tls)
    assert sent.returncode == 0, sent.stderr
    got = meshmq("receive", "/queue/cli.tls", "--url", f"stomp+ssl://127.0.0.1:{port}", *tls)
    assert got.returncode == 0, got.stderr
    assert got.stdout == "over tls\n"


def test_a_broker_certificate_from_another_ca_is_one_line(need_broker: ThreadBroker,
                                                          pki: Pki) -> None:
    assert need_broker.runtime is not None
    port = need_broker.runtime.addresses["stomp_ssl"][1]
    cert, key = pki.client("app")
    for command in ("send", "receive"):
        args = [command, "/queue/cli.tls", "--url", f"stomp+ssl://127.0.0.1:{port}",
                "--cafile", str(pki.untrusted / "ca.pem"), "--cert", str(cert),
                "--key", str(key)]
        if command == "send":
            args.insert(2, "body")
        failed = meshmq(*args)
        assert failed.returncode == 2
        # OpenSSL's cause depends on the chain the broker sends (its CA included here).
        assert re.fullmatch(
            rf"meshmq {command}: 127\.0\.0\.1:{port}: certificate verify failed: (unable "
            "to get local issuer certificate|self-signed certificate in certificate chain); "
            "pass the broker's CA with --cafile FILE\n", failed.stderr)

