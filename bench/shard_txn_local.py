"""CPU per COMMIT of a transaction that stays on its shard, in the core alone.

A transaction on one shard of a node (shard 1 of 2) that sends one message to a queue
the shard owns and acknowledges one message of another queue it owns, committed, then
the pump's work (dispatch, the store batch into a memory store): what the core spends
per transaction. Run it with main's sources and with a branch's, in the same
conditions, to see what the check for other owners at COMMIT costs
(docs/design.md, "Transactions across shards": a local one must cost what it did).

    PYTHONPATH=src:. .venv/bin/python bench/shard_txn_local.py [--transactions 20000]
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from meshmq.config.model import BrokerConfig
from meshmq.core import destinations as dst
from meshmq.core.broker import Broker
from meshmq.core.consumer import AckMode, ConsumerSpec
from meshmq.core.destinations import Destination
from meshmq.core.message import Message
from meshmq.core.queue import Delivery
from meshmq.core.shards import ShardIdentity, owner
from meshmq.store.memory import MemoryStore


def _owned(k: int, prefix: str) -> Destination:
    for n in itertools.count():
        d = dst.queue(f"{prefix}.{n}")
        if owner(d, 2, node="n") == k:
            return d
    raise AssertionError("unreachable")


def run(count: int, batch: int = 200) -> float:
    """CPU seconds per transaction (messages delivered ``batch`` at a time, within a
    queue's in-memory page, outside the measured time)."""
    store = MemoryStore()
    broker = Broker(BrokerConfig(broker_name="bench"), store)
    broker.use_shard(ShardIdentity(index=1, count=2, node="n", run_dir="/nowhere",
                                   token="t"))
    broker.recover(store.open())
    conn = broker.open_connection(broker.authenticate(None, None))
    source, out = _owned(1, "in"), _owned(1, "out")
    consumer = broker.subscribe(conn, "s", ConsumerSpec(
        destinations=(source,), ack_mode=AckMode.CLIENT_INDIVIDUAL, prefetch=batch))
    spent = 0.0
    n = 0
    while n < count:
        for i in range(batch):
            broker.send(conn, (source,), Message(message_id=f"ID:s{n + i}",
                                                 destination=source, body=b"x" * 100,
                                                 persistent=True))
        broker.dispatch_dirty()
        store.write(broker.take_ops())
        tags = [o.tag for o in broker.take_outcomes() if isinstance(o, Delivery)]
        assert len(tags) == batch, len(tags)
        start = time.process_time()
        for tag in tags:
            txn = f"t{n}"
            n += 1
            broker.begin(conn, txn)
            broker.send(conn, (out,), Message(message_id=f"ID:o{n}", destination=out,
                                              body=b"y" * 100, persistent=True), txn)
            broker.ack(conn, consumer, tag, cumulative=False, txn=txn)
            broker.commit(conn, txn)
            broker.dispatch_dirty()
            store.write(broker.take_ops())
            broker.take_outcomes()
        spent += time.process_time() - start
    return spent / n


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--transactions", type=int, default=20000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    runs = [run(args.transactions) * 1e6 for _ in range(args.runs)]
    print(f"local transaction: median {statistics.median(runs):.2f} µs CPU "
          f"(runs: {', '.join(f'{r:.2f}' for r in runs)})")


if __name__ == "__main__":
    main()
