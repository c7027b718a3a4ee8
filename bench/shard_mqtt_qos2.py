"""Time and CPU per MQTT QoS 2 exchange of a persistent session on a node of 2 shards,
the client on shard 1 and its client id owned by shard 0 (so every exchange's session
record goes to shard 0, whose stored answer the PUBREC and PUBCOMP wait for).

Runs the shards in this process (tests/support/shard_pair.py: real runtimes on their
own threads and loops, journal stores without fsync, linked over Unix sockets) and one
raw MQTT 5 client on a real TCP socket publishing to a topic shard 1 owns, ``--window``
exchanges in flight at once. Prints wall time per exchange and the process's CPU time
per exchange (both shards and the client).

    PYTHONPATH=src:. .venv/bin/python bench/shard_mqtt_qos2.py [--messages 3000]
        [--window 1]
"""

from __future__ import annotations

import argparse
import itertools
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.interop.mqtt_helpers import RawMqtt
from tests.support.brokers import poll
from tests.support.shard_pair import ShardPair

from meshmq.core.shards import client_owner
from meshmq.protocol.mqtt import Properties, Pubcomp, Publish, Pubrec, Pubrel


def run(n: int, window: int) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as tmp:
        pair = ShardPair(Path(tmp), mqtt=True).start()
        try:
            pair.wait_linked()
            client_id = next(c for c in (f"bench-{i}" for i in itertools.count())
                             if client_owner(c, 2) == 0)
            topic = pair.owned_by(1, "bench", "topic").replace(".", "/")
            client = RawMqtt(pair[1].mqtt_port, level=5)
            client.connect(client_id, clean=True,
                           properties=Properties(session_expiry_interval=600))
            pids = itertools.cycle(range(1, 60000))
            wall, cpu = time.perf_counter(), time.process_time()
            done = 0
            while done < n:
                batch = [next(pids) for _ in range(min(window, n - done))]
                for pid in batch:
                    client.send(Publish(topic, b"x" * 100, qos=2, packet_id=pid))
                for pid in batch:
                    client._expect_ack(Pubrec, pid)
                    client.send(Pubrel(pid))
                for pid in batch:
                    client._expect_ack(Pubcomp, pid)
                done += len(batch)
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            client.disconnect()
            client.close()
            poll(lambda: pair[1].links_up() == 1, what="links")
        finally:
            pair.stop()
    return wall / n * 1e6, cpu / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=3000)
    parser.add_argument("--window", type=int, default=1)
    args = parser.parse_args()
    wall, cpu = run(args.messages, args.window)
    print(f"window {args.window}: {wall:.0f} us wall, {cpu:.0f} us CPU per QoS 2 exchange "
          f"({args.messages} exchanges)")


if __name__ == "__main__":
    main()
