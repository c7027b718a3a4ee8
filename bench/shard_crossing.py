"""CPU per delivered message when a message crosses between the shards of a node.

Runs the shards in this process (as tests/support/shard_pair.py does: each a real
``BrokerRuntime`` on its own thread and loop, journal store without fsync, linked over
Unix sockets) with one STOMP producer and one STOMP consumer on real TCP sockets
(auto-ack, or with ``--ack client-individual`` acknowledging each message), and
counts the CPU time of the brokers' threads (their loops and journal writers: the
process's CPU time less the two client threads'). Cases:

* ``whole``: one broker (no shards), producer and consumer on it;
* ``owner``: 2 shards, producer on shard 1, queue and consumer on shard 0 (one hop);
* ``relay``: 2 shards, producer and consumer on shard 1, queue on shard 0 (the full
  crossing: send to the owner, STORED back, DELIVER out, SETTLE back unless the
  consumer is auto-ack, which its owner settles).

    PYTHONPATH=src:. .venv/bin/python bench/shard_crossing.py [--messages 20000]
        [--ack auto|client-individual]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.interop.stomp_helpers import RawClient
from tests.support.shard_pair import ShardPair

BODY = b"x" * 100


def run(case: str, n: int, persistent: bool, ack: str = "auto") -> float:
    with tempfile.TemporaryDirectory() as tmp:
        pair = ShardPair(Path(tmp), count=1 if case == "whole" else 2).start()
        try:
            if case != "whole":
                pair.wait_linked()
            queue = pair.owned_by(0, "bench")
            producer_shard = pair[0] if case == "whole" else pair[1]
            consumer_shard = pair[1] if case == "relay" else pair[0]
            consumer = RawClient(consumer_shard, timeout=60)
            consumer.connect()
            consumer.send_frame("SUBSCRIBE", [("destination", f"/queue/{queue}"),
                                              ("id", "s"), ("ack", ack)])
            consumer.receipt_roundtrip()
            time.sleep(0.2)  # the relayed consumer reaches the owner (a benchmark)
            before = time.process_time() - time.thread_time()
            got = 0
            reader_cpu = 0.0

            def consume() -> None:
                nonlocal got, reader_cpu
                start = time.thread_time()
                while got < n:
                    frame, _ = consumer.read_until("MESSAGE", timeout=60)
                    if ack != "auto":
                        consumer.send_frame("ACK", [("id", frame["ack"])])
                    got += 1
                reader_cpu = time.thread_time() - start

            reader = threading.Thread(target=consume)
            reader.start()
            producer = RawClient(producer_shard, timeout=60)
            producer.connect()
            headers = [("destination", f"/queue/{queue}"),
                       ("persistent", "true" if persistent else "false")]
            frame = b"SEND\n" + b"".join(f"{k}:{v}\n".encode() for k, v in headers) + \
                b"content-length:100\n\n" + BODY + b"\0"
            for start in range(0, n, 500):
                producer.send_bytes(frame * min(500, n - start))
            reader.join(120)
            after = time.process_time() - time.thread_time() - reader_cpu
            assert got == n, f"{got} of {n} delivered"
            producer.close()
            consumer.close()
            return (after - before) / n * 1e6
        finally:
            pair.stop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ack", choices=("auto", "client-individual"), default="auto")
    args = ap.parse_args()
    for persistent in (False, True):
        for case in ("whole", "owner", "relay"):
            runs = [run(case, args.messages, persistent, args.ack)
                    for _ in range(args.rounds)]
            print(f"{case:6} persistent={persistent!s:5} {min(runs):7.1f} CPU µs/message "
                  f"(min of {args.rounds}; all: {', '.join(f'{r:.1f}' for r in runs)})",
                  flush=True)


if __name__ == "__main__":
    main()
