"""`meshmq send`, `receive` and `stat` as a shell user runs them, against a live broker."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.support.brokers import ThreadBroker


def meshmq(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "meshmq.cli.main", *args], input=stdin,
                          capture_output=True, text=True, timeout=60, check=False)


def test_send_receive_and_stat_round_trip(broker: ThreadBroker) -> None:
    url = f"127.0.0.1:{broker.port}"
    sent = meshmq("send", "/queue/cli.orders", "--url", url, "--persistent",
                  "--header", "kind=test", stdin="one\ntwo\nthree\n")
    assert sent.returncode == 0, sent.stderr
    assert "sent 3 message(s)" in sent.stderr

    stat = meshmq("stat", "--url", f"127.0.0.1:{broker.management_port}", "--json")
    assert stat.returncode == 0, stat.stderr
    dests = {d["name"]: d for d in json.loads(stat.stdout)["destinations"]}
    assert dests["cli.orders"]["depth"] == 3
    assert dests["cli.orders"]["enqueued"] == 3

    table = meshmq("stat", "--url", f"127.0.0.1:{broker.management_port}")
    assert table.returncode == 0
    assert any(line.split()[:3] == ["queue", "cli.orders", "3"]
               for line in table.stdout.splitlines())

    got = meshmq("receive", "/queue/cli.orders", "--url", url, "--count", "3", "--json")
    assert got.returncode == 0, got.stderr
    frames = [json.loads(line) for line in got.stdout.splitlines()]
    assert [f["body"] for f in frames] == ["one", "two", "three"]
    assert all(f["headers"]["kind"] == "test" for f in frames)
    assert broker.destination_stats("cli.orders")["depth"] == 0


def test_receive_times_out_with_nonzero_exit_when_short(broker: ThreadBroker) -> None:
    got = meshmq("receive", "/queue/cli.empty", "--url", f"127.0.0.1:{broker.port}",
                 "--count", "1", "--timeout", "0.5")
    assert got.returncode == 1
    assert "received 0 message(s)" in got.stderr


def test_stat_reports_an_unreachable_broker_clearly() -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    got = meshmq("stat", "--url", f"127.0.0.1:{port}")
    assert got.returncode == 2
    assert "cannot reach the management endpoint" in got.stderr


def test_stat_shows_authorization_refusals(broker_factory: object) -> None:
    from tests.interop.stomp_helpers import Client

    from meshmq.config.model import AuthConfig, AuthorizationConfig, AuthorizationEntry

    authz = AuthorizationConfig(entries=(AuthorizationEntry(queue="open", write=("*",),
                                                            admin=("*",)),))
    broker = broker_factory(auth=AuthConfig(authorization=authz))  # type: ignore[operator]
    client = Client(broker)
    for _ in range(2):
        client.conn.send("/queue/closed", "x")
        client.listener.wait(lambda: client.listener.errors, what="an ERROR")
        client.listener.errors.clear()
    client.close()
    table = meshmq("stat", "--url", f"127.0.0.1:{broker.management_port}")
    assert "denied 2 (not authorized; by user: anonymous 2)" in table.stdout, table.stdout
