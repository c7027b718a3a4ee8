"""`meshmq queue|dlq|connection|bridge`: admin commands over the management API, run as
real subprocesses against a real broker; every failure is one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tests.support.brokers import ThreadBroker, poll
from tests.support.ports import free_port

from meshmq.cli.admin import table

pytestmark = pytest.mark.slow


def meshmq(*args: str, timeout: float = 60, password: str | None = None
           ) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if password is not None:
        env["MESHMQ_PASSWORD"] = password
    return subprocess.run([sys.executable, "-m", "meshmq.cli.main", *args], env=env,
                          capture_output=True, text=True, timeout=timeout, check=False)


def one_line(done: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in done.stdout + done.stderr, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


def test_table_aligns_columns_and_names_missing_values() -> None:
    text = table([{"name": "orders", "depth": 12, "rate": 1.25, "ok": True},
                  {"name": "q", "depth": None, "rate": 0.0, "ok": False}],
                 (("name", "QUEUE"), ("depth", "DEPTH"), ("rate", "IN/S"), ("ok", "OK")))
    assert text.splitlines() == ["QUEUE   DEPTH  IN/S  OK",
                                 "orders  12     1.2   yes",
                                 "q       -      0.0   no"]


@pytest.mark.parametrize("args", [("queue", "list"), ("queue", "purge", "orders"),
                                  ("connection", "list"), ("bridge", "stop", "nc")])
def test_a_broker_that_is_not_running_is_one_line(args: tuple[str, ...]) -> None:
    port = free_port()
    done = meshmq(*args, "--url", f"127.0.0.1:{port}")
    assert done.returncode == 2
    line = one_line(done)
    assert line.startswith(f"meshmq {args[0]}: cannot reach the management endpoint at "
                           f"127.0.0.1:{port}")


def test_a_stomp_port_given_as_the_url_is_one_line(broker: ThreadBroker) -> None:
    done = meshmq("queue", "list", "--url", f"127.0.0.1:{broker.port}")
    assert done.returncode == 2
    assert "is not a meshmq management endpoint" in one_line(done)


def test_a_missing_queue_is_the_brokers_own_one_line(broker: ThreadBroker) -> None:
    done = meshmq("queue", "browse", "no-such-queue", "--url",
                  f"127.0.0.1:{broker.management_port}")
    assert done.returncode == 1
    line = one_line(done)
    assert line.startswith("meshmq queue: ") and "(404)" in line


def test_queue_list_json_is_the_apis_answer(broker: ThreadBroker) -> None:
    done = meshmq("queue", "list", "--json", "--url", f"127.0.0.1:{broker.management_port}")
    assert done.returncode == 0, done.stderr
    assert isinstance(json.loads(done.stdout)["destinations"], list)


def test_bridge_list_stop_and_start(tmp_path: Path) -> None:
    from tests.network.helpers import LINK_USER, connector, net_config, tcp_uri

    from meshmq.config.model import AuthConfig, User

    b = ThreadBroker(net_config(tmp_path / "b", "B")).start()
    a = ThreadBroker(net_config(tmp_path / "a", "A", connector(
        f"static:({tcp_uri(b)})", name="to-b", auto_start=False), auth=AuthConfig(
            users=(LINK_USER, User("ops", "ops-pw", ("admins",)))))).start()
    url = f"127.0.0.1:{a.management_port}"
    ops = ("--user", "ops")
    try:
        listed = meshmq("bridge", "list", "--url", url)
        assert listed.returncode == 0, listed.stderr
        head, row = listed.stdout.splitlines()
        assert head.split()[:3] == ["CONNECTOR", "CONNECTOR", "STATE"]
        assert row.split()[:2] == ["to-b", "stopped"]

        refused = meshmq("bridge", "start", "to-b", "--url", url)
        assert refused.returncode == 2 and "--user" in one_line(refused)
        started = meshmq("bridge", "start", "to-b", "--url", url, *ops, password="ops-pw")
        assert (started.returncode, started.stdout.strip()) == (0, "connector to-b: started")

        def forwarding() -> bool:
            done = meshmq("bridge", "list", "--json", "--url", url)
            (conn,) = json.loads(done.stdout)["connectors"]
            return [x["state"] for x in conn["bridges"]] == ["forwarding"]
        poll(forwarding, what="the bridge forwarding")
        table_text = meshmq("bridge", "list", "--url", url).stdout
        assert "B" in table_text and "forwarding" in table_text

        stopped = meshmq("bridge", "stop", "to-b", "--url", url, *ops, password="ops-pw")
        assert stopped.stdout.strip() == "connector to-b: stopped"
        unknown = meshmq("bridge", "stop", "nope", "--url", url, *ops, password="ops-pw")
        assert unknown.returncode == 1 and "(404)" in one_line(unknown)
    finally:
        a.stop()
        b.stop()


def test_connection_list_and_close(broker: ThreadBroker) -> None:
    from meshmq.client.simple_stomp import SimpleStompClient

    url = f"127.0.0.1:{broker.management_port}"
    client = SimpleStompClient("127.0.0.1", broker.port, client_id="cli-test")
    try:
        listed = meshmq("connection", "list", "--json", "--url", url)
        (conn,) = [c for c in json.loads(listed.stdout)["connections"]
                   if c["client_id"] == "cli-test"]
        human = meshmq("connection", "list", "--url", url).stdout
        assert conn["id"] in human and "cli-test" in human
        closed = meshmq("connection", "close", conn["id"], "--url", url)
        assert (closed.returncode, closed.stdout.strip()) == (0, f"closed connection "
                                                               f"{conn['id']}")
        again = meshmq("connection", "close", conn["id"], "--url", url)
        assert again.returncode == 1 and "(404)" in one_line(again)
    finally:
        client.close()


def test_queue_browse_purge_move_with_progress_and_dlq_retry(broker: ThreadBroker) -> None:
    from meshmq.client.simple_stomp import SimpleStompClient

    url = ("--url", f"127.0.0.1:{broker.management_port}")
    with SimpleStompClient("127.0.0.1", broker.port) as client:
        for i in range(2500):
            client.send("/queue/orders", f"order {i}".encode(),
                        {"kind": "big" if i % 2 else "small"}, confirm=i == 2499)
        for i in range(3):
            client.send("/queue/junk", b"x", confirm=i == 2)
        # Persistent messages that expire at once are dead-lettered to ActiveMQ.DLQ.
        expires = str(int(time.time() * 1000) + 50)
        for i in range(2):
            client.send("/queue/jobs", f"job {i}".encode(),
                        {"persistent": "true", "expires": expires})

    browsed = meshmq("queue", "browse", "orders", "--limit", "3", "--selector",
                     "kind = 'big'", *url)
    lines = browsed.stdout.splitlines()
    assert lines[0] == ("1250 message(s) in orders matching the selector; showing 3 "
                        "from 0")
    assert lines[1].split()[:2] == ["MESSAGE", "ID"] and "order 1" in lines[2]

    moved = meshmq("queue", "move", "orders", "--to", "big", "--selector", "kind = 'big'",
                   *url)
    assert moved.returncode == 0, moved.stderr
    assert moved.stdout.strip() == "moved 1250 message(s) from orders to queue://big"
    # Not a terminal: one progress line per batch of 1000 ids.
    assert moved.stderr.splitlines() == ["moved 1000 of 1250", "moved 1250 of 1250"]
    listed = json.loads(meshmq("queue", "list", "--json", *url).stdout)
    depth = {d["name"]: d["depth"] for d in listed["destinations"]}
    assert (depth["orders"], depth["big"]) == (1250, 1250)

    copied = meshmq("queue", "move", "big", "--to", "queue://copy", "--copy", "--json", *url)
    assert json.loads(copied.stdout) == {"copied": 1250}

    purged = meshmq("queue", "purge", "junk", *url)
    assert purged.stdout.strip() == "purged 3 message(s) from junk"
    def dead_lettered() -> bool:
        answer = json.loads(meshmq("queue", "list", "--json", "--filter", "DLQ", *url).stdout)
        return [d["depth"] for d in answer["destinations"]] == [2]
    poll(dead_lettered, what="two expired messages in ActiveMQ.DLQ")
    retried = meshmq("dlq", "retry", *url)
    assert retried.stdout.strip() == ("retried 2 message(s) from ActiveMQ.DLQ to their "
                                      "original destinations")
    assert broker.destination_stats("jobs")["depth"] == 2
