"""Per-message CPU cost of the message trace inside the broker core (no sockets).

Routes messages through ``Broker`` with an auto-ack consumer (received + delivered:
2 events per message) and a client-ack consumer (received + stored + dispatched +
acked: 4 events), with tracing off, to JSON lines, and to Parquet, writing the
trace files to a temporary directory as the runtime does (one sink write per pump of
20 messages). Less sensitive to machine noise than the end-to-end run
(``trace_overhead.py``), since one process does all the work. Appends to
``bench/results/<date>-trace-core-cost.md``.

    python bench/trace_core_cost.py [--messages 100000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import datetime as dt
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from meshmq.config.model import BrokerConfig
from meshmq.core import destinations as dst
from meshmq.core import trace as tr
from meshmq.core.broker import Broker
from meshmq.core.consumer import AckMode, ConsumerSpec
from meshmq.core.message import Message
from meshmq.store.memory import MemoryStore
from meshmq.transport import trace_files as tf

RESULTS = Path(__file__).resolve().parent / "results"


def run(mode: str, ack: AckMode, n: int) -> float:
    """Microseconds per message."""
    store = MemoryStore()
    broker = Broker(BrokerConfig(broker_name="bench"), store)
    broker.recover(store.open())
    sink = None
    tmp = Path(tempfile.mkdtemp(prefix="meshmq-trace-cost-"))
    if mode != "off":
        broker.tracer = tr.Tracer("bench")
        sink = tf.open_sink(tmp, "bench", "b", fmt=mode, max_file_bytes=1 << 30,
                            roll_interval_ms=0, max_files=0)
    conn = broker.open_connection(broker.authenticate(None, None))
    q = dst.queue("bench")
    consumer = broker.subscribe(conn, "s", ConsumerSpec(destinations=(q,), ack_mode=ack,
                                                        prefetch=1000))
    persistent = ack is not AckMode.AUTO
    t0 = time.perf_counter()
    for i in range(n):
        msg = Message(broker.new_message_id(conn.id), q, b"x" * 256, producer_id=conn.id,
                      timestamp=1, persistent=persistent)
        broker.send(conn, (q,), msg)
        if i % 20 == 19:
            broker.dispatch_dirty()
            store.write(broker.take_ops())
            for outcome in broker.take_outcomes():
                if persistent:
                    broker.ack(conn, consumer, outcome.tag, cumulative=False)  # type: ignore[union-attr]
            if sink is not None and broker.tracer is not None:
                sink.write(broker.tracer.take())
    if sink is not None:
        sink.close()
    elapsed = time.perf_counter() - t0
    shutil.rmtree(tmp, ignore_errors=True)
    return elapsed / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    cases = [("auto-ack, non-persistent", AckMode.AUTO),
             ("client-ack, persistent", AckMode.CLIENT_INDIVIDUAL)]
    modes = ("off", "jsonl", "parquet")
    rows = []
    for label, ack in cases:
        samples: dict[str, list[float]] = {m: [] for m in modes}
        for _ in range(args.rounds):
            for mode in modes:
                samples[mode].append(run(mode, ack, args.messages))
        med = {m: statistics.median(v) for m, v in samples.items()}
        rows.append((label, med))
        print(label, {m: f"{v:.2f} us" for m, v in med.items()})
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, check=False).stdout.strip()
    lines = [f"# Trace cost in the broker core, {dt.date.today()} (meshmq {commit})", "",
             f"`python bench/trace_core_cost.py --messages {args.messages} --rounds "
             f"{args.rounds}`: median microseconds of core work per message (send, "
             "dispatch, ack, store batch, trace sink write; no sockets).", "",
             "| case | off | jsonl | parquet |", "|---|---|---|---|"]
    for label, med in rows:
        base = med["off"]
        lines.append(f"| {label} | {base:.2f} | {med['jsonl']:.2f} "
                     f"(+{med['jsonl'] - base:.2f}) | {med['parquet']:.2f} "
                     f"(+{med['parquet'] - base:.2f}) |")
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.no_write:
        path = RESULTS / f"{dt.date.today()}-trace-core-cost.md"
        path.write_text(text)
        print(f"written {path}")


if __name__ == "__main__":
    main()
