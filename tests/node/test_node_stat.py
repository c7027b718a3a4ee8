"""What a node of two shards (real ``meshmq broker --shards 2`` processes) shows of
each shard: ``GET /api/shards`` and ``meshmq stat`` give every shard's owned
destinations, messages in and out with their rates, CPU and journal size, adding up
to the node's totals; a destination's producers and consumers count clients, never
the shard links that carry their sends and deliveries."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from meshmq.core.destinations import Destination
from meshmq.core.shards import owner
from tests.interop.stomp_helpers import RawClient
from tests.node.test_node_routing import owned_by
from tests.support.brokers import poll
from tests.support.nodes import NodeProcess, plain_module_node, shard_api, stomp_on

pytestmark = pytest.mark.slow

SHARDS = (0, 1)


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    yield from plain_module_node(tmp_path_factory.mktemp("node"))


def send(client: RawClient, queue: str, receipt: str) -> None:
    client.send_frame("SEND", [("destination", f"/queue/{queue}"), ("persistent", "true"),
                               ("receipt", receipt)], b"m" * 100)
    client.read_until_receipt(receipt)


def subscribe(client: RawClient, queue: str, sub: str) -> None:
    client.send_frame("SUBSCRIBE", [("destination", f"/queue/{queue}"), ("id", sub),
                                    ("receipt", f"sub-{sub}")], b"")
    client.read_until_receipt(f"sub-{sub}")


def row_of(stat: dict[str, Any], name: str) -> dict[str, Any]:
    (row,) = [d for d in stat["destinations"] if d["name"] == name]
    return row


def stat_lines(node: NodeProcess, *args: str) -> list[list[str]]:
    shown = subprocess.run([sys.executable, "-m", "meshmq.cli.main", "stat", "--url",
                            f"127.0.0.1:{node.ports['management']}", *args],
                           check=False, capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    return [line.split() for line in shown.stdout.splitlines()]


def test_each_shards_figures_add_up_to_the_nodes(node: NodeProcess) -> None:
    queues = {k: owned_by(k, "figures") for k in SHARDS}
    producers = [stomp_on(node, k) for k in SHARDS]
    consumer = stomp_on(node, 0)
    try:
        subscribe(consumer, queues[1], "c")  # shard 1's queue drains to shard 0
        sent = [0]

        def busy() -> list[dict[str, Any]] | None:
            # Keep sending until both shards' rates (a 10 s window sampled every
            # second) and CPU shares are known.
            for k, producer in enumerate(producers):
                for queue in queues.values():
                    sent[0] += 1
                    send(producer, queue, f"r{k}-{sent[0]}")
            rows: list[dict[str, Any]] = node.shards()
            ready = all(r["in_rate"] and r["cpu_percent"] is not None for r in rows)
            return rows if ready and rows[1]["out_rate"] else None

        poll(busy, 30, "rates and CPU shares on both shards")
        node_stat = node.api("/api/stat")

        def settled() -> tuple[dict[str, Any], list[Any]] | None:
            # The queue on shard 1 has drained to the consumer and its counters stand.
            # A journal's size still changes a moment later (its last record is written
            # by the next housekeeping tick), so the node's view of each journal must
            # match the shard's own read right after it (a node that reports the wrong
            # figure never gets there).
            doc: dict[str, Any] = node.api("/api/shards")
            own = [shard_api(node, k, "/api/broker") for k in SHARDS]
            stat = node.api("/api/stat")
            stands = row_of(stat, queues[1])["depth"] == 0 and stat[
                "destinations"] == node_stat["destinations"]
            journals = [r["journal_bytes"] for r in doc["shards"]]
            return (doc, own) if stands and journals == [
                o["store"]["bytes"] for o in own] else None

        node_stat = node.api("/api/stat")
        standing = poll(settled, 20, "the counters and journals to stand still")
        assert standing is not None
        doc, owns = standing
        node_stat = node.api("/api/stat")
        rows, totals = doc["shards"], doc["totals"]
        dests = node_stat["destinations"]
        for k, row in enumerate(rows):
            mine = [d for d in dests if owner(Destination.parse_uri(
                f"{d['type']}://{d['name']}"), 2, node="node") == k]
            assert row["destinations"] == len(mine) >= 1, (row, mine)
            assert row["messages_in"] == sum(d["enqueued"] for d in mine)
            assert row["messages_out"] == sum(d["dequeued"] for d in mine)
            assert row["cpu_seconds"] > 0 and row["cpu_percent"] >= 0
            own = owns[k]
            assert row["journal_bytes"] == own["store"]["bytes"] > 0
            assert row["connections"] == own["connections"]
        assert rows[1]["messages_out"] >= 2 * 2  # each producer's sends to shard 1's queue
        # The node's totals: the columns summed, and the node's own figures.
        for key in ("destinations", "messages_in", "messages_out", "journal_bytes",
                    "connections"):
            assert totals[key] == sum(r[key] for r in rows), key
        assert totals["destinations"] == len(dests)
        assert totals["messages_in"] == sum(d["enqueued"] for d in dests)
        assert totals["messages_out"] == sum(d["dequeued"] for d in dests)
        assert totals["connections"] == node_stat["connections"] == 3
        # meshmq stat: the same columns, one row per shard and the node's sums.

        def shown() -> tuple[list[list[str]], dict[str, Any]] | None:
            # The table, and the node's figures read right after it: the same journal
            # sizes unless one changed in between (see settled()).
            lines = stat_lines(node)
            fresh: dict[str, Any] = node.api("/api/shards")
            journals = {str(r["pid"]): str(r["journal_bytes"]) for r in fresh["shards"]}
            return (lines, fresh) if all(journals.get(ln[1]) == ln[13] for ln in lines
                                         if ln[:1] in (["0"], ["1"]) and len(ln) > 13
                                         ) else None

        table = poll(shown, 20, "meshmq stat to show the journals the node reports")
        assert table is not None
        lines, fresh = table
        head = ["SHARD", "PID", "STATE", "RESTARTS", "UPTIME", "CONNECTIONS", "DESTS",
                "IN", "OUT", "IN/S", "OUT/S", "CPU-S", "CPU%", "JOURNAL"]
        assert head in lines, lines
        for row in fresh["shards"]:
            (line,) = [ln for ln in lines if ln[:2] == [str(row["shard"]), str(row["pid"])]]
            assert line[2:4] == ["running", "0"], line
            assert line[5:9] == [str(row[k]) for k in ("connections", "destinations",
                                                       "messages_in", "messages_out")]
            assert line[13] == str(row["journal_bytes"]), line
        (total_line,) = [ln for ln in lines if ln[:1] == ["node"]]
        assert total_line[1:5] == [str(fresh["totals"][k]) for k in (
            "connections", "destinations", "messages_in", "messages_out")], total_line
    finally:
        for client in (*producers, consumer):
            client.close()


def test_a_destinations_producers_and_consumers_are_clients_not_shard_links(
        node: NodeProcess) -> None:
    queue = owned_by(1, "counted")
    elsewhere = [stomp_on(node, 0) for _ in range(2)]  # their sends cross to shard 1
    at_owner = stomp_on(node, 1)
    consumers = [stomp_on(node, k) for k in SHARDS]
    try:
        for i, client in enumerate((*elsewhere, at_owner)):
            send(client, queue, f"p{i}")
        for k, client in enumerate(consumers):
            subscribe(client, queue, f"s{k}")
        row = row_of(node.api("/api/stat"), queue)
        assert (row["producers"], row["consumers"]) == (3, 2), row
        for client in elsewhere:
            client.close()
        poll(lambda: row_of(node.api("/api/stat"), queue)["producers"] == 1, 20,
             "the closed producers no longer counted")
        # The owner's own view counts its own client only.
        assert row_of(shard_api(node, 1, "/api/stat"), queue)["producers"] == 1
    finally:
        for client in (*elsewhere, at_owner, *consumers):
            client.close()
