"""What connection handoff saves a STOMP client over WebSocket on a node of two shards.

Two real shard processes (``meshmq.network.shards_main``, each with a plain ``ws://``
listener on its own port, linked as a node's supervisor would link them). A queue
owned by shard 0; a WebSocket STOMP consumer of it on shard 0 (auto-ack); a WebSocket
STOMP producer connected to shard 1, the wrong one, sending ``--count`` 256 B
non-persistent messages, one STOMP frame per WebSocket message, the last with a
receipt. With handoff off every message crosses from shard 1 to shard 0; with it on,
shard 1 hands the producer's connection to shard 0 at its first SEND. Reports, per
case, the CPU seconds of both shard processes per delivered message (the figure that
does not depend on how fast the Python client is) and msg/s; rounds interleave the
cases.

    PYTHONPATH=src:. .venv/bin/python bench/shard_handoff_ws.py [--count 20000] [--rounds 3]

Writes nothing: results are recorded by hand in bench/results/.
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import brokers as bk
from tests.node.test_node_routing import owned_by
from tests.support.brokers import ProcessBroker, poll
from tests.support.shard_pair import NODE
from tests.support.ws_stomp import WsStomp

from meshmq.core.shards import ShardIdentity
from meshmq.protocol.stomp import encode_frame

BODY = b"x" * 256


class WsShard(ProcessBroker):
    """One shard process with a STOMP and a WebSocket listener."""

    module = "meshmq.network.shards_main"

    def __init__(self, base: Path, identity: ShardIdentity, handoff: bool) -> None:
        k = identity.index
        config = base / f"shard-{k}.toml"
        config.write_text(
            f'[broker]\nname = "{identity.node}"\ndata_directory = "{base / f"shard-{k}"}"\n\n'
            '[[listeners]]\nname = "stomp"\nurl = "stomp://127.0.0.1:0"\n\n'
            '[[listeners]]\nname = "ws"\nurl = "ws://127.0.0.1:0"\n\n'
            "[management]\nenabled = false\n\n"
            f"[shards]\nhandoff = {'true' if handoff else 'false'}\n")
        super().__init__(config, base / f"shard-{k}.log", (
            "--index", str(k), "--count", str(identity.count), "--node", identity.node,
            "--run-dir", identity.run_dir, "--token", identity.token))


def run_one(handoff: bool, count: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        run_dir = base / "run"
        run_dir.mkdir(mode=0o700)
        token = secrets.token_hex(16)
        shards = [WsShard(base, ShardIdentity(index=k, count=2, node=NODE,
                                              run_dir=str(run_dir), token=token), handoff)
                  for k in (0, 1)]
        for shard in shards:
            shard.start()
        try:
            for shard in shards:
                poll(lambda s=shard: "linked to shard" in s.log_path.read_text(), 30,
                     "the shard link")
            queue = owned_by(0, "wsbench")
            consumer = WsStomp(shards[0].ports["ws"])
            consumer.connect()
            consumer.receipt("SUBSCRIBE", [("destination", f"/queue/{queue}"), ("id", "s")])
            producer = WsStomp(shards[1].ports["ws"])
            producer.connect()
            frames = [encode_frame("SEND", [("destination", f"/queue/{queue}")], BODY)
                      .decode()] * (count - 1)
            last = encode_frame("SEND", [("destination", f"/queue/{queue}"),
                                         ("receipt", "end")], BODY).decode()
            got = [0]

            def consume() -> None:
                while got[0] < count:
                    consumer.next("MESSAGE", timeout=60)
                    got[0] += 1

            pids = [shard.proc.pid if shard.proc else None for shard in shards]
            before = bk.tree_cpu(pids)
            t0 = time.perf_counter()
            reader = threading.Thread(target=consume)
            reader.start()
            for frame in frames:
                producer.ws.send(frame)
            producer.ws.send(last)
            producer.next("RECEIPT", timeout=60)
            reader.join(120)
            elapsed = time.perf_counter() - t0
            after = bk.tree_cpu(pids)
            assert got[0] == count, f"{got[0]} of {count} delivered"
            per_shard = []
            for pid in pids:
                used = sum(v - before.get(key, 0.0) for key, v in after.items()
                           if key[0] == pid)
                per_shard.append(used)
            producer.close()
            consumer.close()
            return {"rate": count / elapsed,
                    "cpu0_us": per_shard[0] / count * 1e6,
                    "cpu1_us": per_shard[1] / count * 1e6,
                    "cpu_us": sum(per_shard) / count * 1e6}
        finally:
            for shard in shards:
                shard.terminate()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    rows: dict[bool, list[dict[str, float]]] = {False: [], True: []}
    for _ in range(args.rounds):
        for handoff in (False, True):
            rows[handoff].append(run_one(handoff, args.count))
    print(f"{args.count} messages, {args.rounds} rounds; median (every round)")
    print("handoff | msg/s | CPU µs/msg shard 0 | shard 1 | both")
    for handoff, runs in rows.items():
        cols = []
        for key in ("rate", "cpu0_us", "cpu1_us", "cpu_us"):
            values = [r[key] for r in runs]
            cols.append(f"{statistics.median(values):,.1f} "
                        f"({', '.join(f'{v:,.1f}' for v in values)})")
        print(f"{'on' if handoff else 'off'} | " + " | ".join(cols))


if __name__ == "__main__":
    main()
