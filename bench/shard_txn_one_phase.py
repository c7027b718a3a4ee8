"""CPU and store batches per COMMIT of a transaction that belongs to one other shard,
committed in one phase against the two-phase protocol, in the cores alone.

Shard 1 of 2 (the coordinator) commits a transaction that sends one persistent message
to a queue shard 0 owns and acknowledges one message of another queue shard 0 owns
(the consume-and-send pattern; the acknowledgement is handed to shard 0's consumer as
its links would hand it over for a relayed consumer). Each side's decisions are passed
to the other by hand, and every store batch is written to a memory store: what the two
cores spend per transaction, and how many batches (each one a sync a confirmation
waits for, but ``forget``'s) it takes. The links' framing is left out: one phase also
saves the frames of a round trip (``prepare``/``prepared``/``commit``/``committed``
against ``commit-one``/``committed-one``/``forget``).

    PYTHONPATH=src:. .venv/bin/python bench/shard_txn_one_phase.py [--phases 2]
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
from meshmq.core import shard_txn
from meshmq.core.broker import Broker
from meshmq.core.consumer import AckMode, ConsumerSpec
from meshmq.core.destinations import Destination
from meshmq.core.message import Message
from meshmq.core.queue import Delivery
from meshmq.core.shard_txn import Outcome, TxnDecide, TxnForget, TxnPrepare
from meshmq.core.shards import ShardIdentity, owner
from meshmq.store.memory import MemoryStore


def _owned(k: int, prefix: str) -> Destination:
    for n in itertools.count():
        d = dst.queue(f"{prefix}.{n}")
        if owner(d, 2, node="n") == k:
            return d
    raise AssertionError("unreachable")


def _shard(index: int) -> tuple[Broker, MemoryStore]:
    store = MemoryStore()
    broker = Broker(BrokerConfig(broker_name="bench"), store)
    broker.use_shard(ShardIdentity(index=index, count=2, node="n", run_dir="/nowhere",
                                   token="t"))
    broker.recover(store.open())
    return broker, store


def run(count: int, batch: int = 200) -> tuple[float, float]:
    """(CPU seconds, store batches) per transaction."""
    coord, cstore = _shard(1)
    own, ostore = _shard(0)
    cconn = coord.open_connection(coord.authenticate(None, None))
    oconn = own.open_connection(own.authenticate(None, None))
    source, out = _owned(0, "in"), _owned(0, "out")
    consumer = own.subscribe(oconn, "relay", ConsumerSpec(
        destinations=(source,), ack_mode=AckMode.CLIENT_INDIVIDUAL, prefetch=batch))
    ctx, otx = coord.shard_transactions, own.shard_transactions
    spent = 0.0
    batches = 0
    n = 0

    def write(broker: Broker, store: MemoryStore) -> None:
        nonlocal batches
        ops = broker.take_ops()
        if ops:
            batches += 1
            store.write(ops)

    while n < count:
        for i in range(batch):
            own.send(oconn, (source,), Message(message_id=f"ID:s{n + i}", destination=source,
                                               body=b"x" * 100, persistent=True))
        own.dispatch_dirty()
        ostore.write(own.take_ops())
        tags = [o.tag for o in own.take_outcomes() if isinstance(o, Delivery)]
        assert len(tags) == batch, len(tags)
        start = time.process_time()
        for tag in tags:
            txn = f"t{n}"
            n += 1
            coord.begin(cconn, txn)
            coord.send(cconn, (out,), Message(message_id=f"ID:o{n}", destination=out,
                                              body=b"y" * 100, persistent=True), txn)
            coord.commit(cconn, txn)
            [prepare] = ctx.take()
            assert isinstance(prepare, TxnPrepare)
            txn_id = prepare.txn
            ctx.started(cconn)
            acks = [(consumer, tag)]
            if prepare.one_phase:
                otx.commit_one(1, txn_id, list(prepare.sends), acks)
                write(own, ostore)  # the owner's one sync
                assert ctx.committed_one(txn_id, 0) is Outcome.COMMITTED
                [forget] = ctx.take()
                assert isinstance(forget, TxnForget)
                otx.forget(txn_id)
                write(own, ostore)  # the record's drop, not waited for
            else:
                otx.prepare(1, txn_id, list(prepare.sends), acks)
                write(own, ostore)  # the participant's sync
                assert ctx.voted(txn_id, 0, True) is Outcome.COMMIT
                write(coord, cstore)  # the decision's sync
                assert ctx.take() == []
                decide = TxnDecide(0, txn_id, True)
                otx.finish(decide.txn, True)
                write(own, ostore)  # the participant's commit, synced before it answers
                ctx.confirmed(txn_id, 0)
                write(coord, cstore)  # the decision record's drop
            own.dispatch_dirty()
            write(own, ostore)
            own.take_outcomes()
        spent += time.process_time() - start
    return spent / n, batches / n


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--transactions", type=int, default=20000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--phases", type=int, choices=(1, 2), default=1,
                        help="2: always the two-phase protocol (as before one phase)")
    args = parser.parse_args()
    if args.phases == 2:
        shard_txn.one_phase = lambda *_: False  # type: ignore[assignment]
    runs = [run(args.transactions) for _ in range(args.runs)]
    cpu = [r[0] * 1e6 for r in runs]
    print(f"{args.phases} phase(s): median {statistics.median(cpu):.2f} µs CPU per "
          f"transaction, {runs[0][1]:.2f} store batches "
          f"(runs: {', '.join(f'{r:.2f}' for r in cpu)})")


if __name__ == "__main__":
    main()
