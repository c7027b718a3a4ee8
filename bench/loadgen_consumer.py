"""What a load generator consumer spends per STOMP MESSAGE, in one process, no sockets.

    PYTHONPATH=<build or src>:. .venv/bin/python bench/loadgen_consumer.py [--messages N]

Feeds N MESSAGE frames shaped as meshmq sends them (256 B body, 64 KiB reads) to
``loadgen.StompClient.data_received`` (``StompScanner``: timestamps without frames) and,
for comparison, to meshmq's ``StompParser`` taking every frame's timestamp (how the
consumer read them before). Rounds alternate; the best of each is reported.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import struct
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import loadgen as lg

from meshmq.build import describe
from meshmq.protocol.stomp import StompParser

_TS = struct.Struct("<d")
FRAME = (b"MESSAGE\ndestination:/queue/bench.run.3\nmessage-id:ID:host-1234-abcd:1:%d\n"
         b"subscription:s256n0-3\nack:ID:host-1234-abcd:1:%d\ncontent-length:256\n"
         b"expires:0\npriority:4\ntimestamp:1732665600000\n\n%s\0\n")


class _Counter:
    value = 0

    def get_lock(self) -> contextlib.nullcontext[None]:
        return contextlib.nullcontext()


def _reads(n: int) -> list[bytes]:
    body = _TS.pack(time.time()) + b"x" * 248
    data = b"".join(FRAME % (i, i, body) for i in range(n))
    return [data[i:i + 65536] for i in range(0, len(data), 65536)]


def scanner(reads: list[bytes], n: int) -> float:
    async def run() -> float:
        recorder = lg.Recorder(_Counter())
        client = lg.StompClient(recorder)
        t = time.perf_counter()
        for chunk in reads:
            client.data_received(chunk)
        spent = time.perf_counter() - t
        assert recorder.count == n, recorder.count
        return spent
    return asyncio.run(run())


def full_parse(reads: list[bytes], n: int) -> float:
    parser = StompParser(version="1.2", max_frame_size=256 * 1024 * 1024)
    stamps: list[float] = []
    unpack = _TS.unpack_from
    t = time.perf_counter()
    for chunk in reads:
        for frame in parser.feed(chunk):
            if frame.command == "MESSAGE":
                stamps.append(unpack(frame.body)[0])
    spent = time.perf_counter() - t
    assert len(stamps) == n
    return spent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=50_000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    reads = _reads(args.messages)
    best: dict[str, float] = {}
    ways: dict[str, Any] = {"scanner": scanner, "full parse": full_parse}
    for _ in range(args.rounds):
        for name, way in ways.items():
            best[name] = min(best.get(name, 1e9), way(reads, args.messages))
    print(f"meshmq: {describe()}")
    for name, spent in best.items():
        print(f"{name:>10}: {spent / args.messages * 1e6:.2f} µs per MESSAGE")


if __name__ == "__main__":
    main()
