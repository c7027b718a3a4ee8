"""CPU per message of one-hop bridge forwarding, in one process, without sockets.

Two real ``BrokerRuntime``s (memory store) on one event loop, A bridged to B by a static
connector over in-memory pipes (tests/support/memory_network.py: the handshake, the wire
codec's bytes in 16 KiB reads, keep-alive and back-pressure are all real). A STOMP
producer on A is fed pre-encoded non-persistent SENDs to one queue in 64 KiB reads, one
read per loop turn; an auto-ack subscriber on B counts the MESSAGE frames B writes. The
clock runs from the first read until the subscriber has every message and A's bridge has
every acknowledgement back (so A's settling is counted), and reads the process's CPU
time: **both brokers together**. ``single`` is the same load on one broker of the same
configuration (producer and subscriber on it), so

    bridge / single = what forwarding costs the two brokers, summed, per message;

with a core per broker (a 16-core machine) the busier broker sets the pace instead:
``network_bench.py`` measures each broker's share end to end over real sockets.

    .venv/bin/python bench/bridge_hotpath.py [--messages 50000] [--rounds 5]

Interleaves the cases round by round so load from other work hits both alike; prints
the minimum and median of CPU µs per delivered message. Writes nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hotpath import BODY, SinkTransport, chunks, stomp_frame
from tests.support.memory_network import MemoryNetwork, NetworkBroker, connector

from meshmq.transport.runtime import BrokerRuntime, tune_gc
from meshmq.transport.stomp_server import StompProtocol

QUEUE = "/queue/hot"


def _subscriber(runtime: BrokerRuntime) -> SinkTransport:
    sink = SinkTransport(b"MESSAGE\n")
    proto = StompProtocol(runtime)
    proto.connection_made(sink)  # type: ignore[arg-type]
    proto.data_received(stomp_frame("CONNECT", {"accept-version": "1.2", "host": "/"}))
    proto.data_received(stomp_frame("SUBSCRIBE", {"id": "0", "destination": QUEUE,
                                                  "ack": "auto"}))
    return sink


def _producer(runtime: BrokerRuntime) -> Callable[[bytes], None]:
    proto = StompProtocol(runtime)
    proto.connection_made(SinkTransport(b""))  # type: ignore[arg-type]
    proto.data_received(stomp_frame("CONNECT", {"accept-version": "1.2", "host": "/"}))
    return proto.data_received


def _load(messages: int) -> list[bytes]:
    one = stomp_frame("SEND", {"destination": QUEUE, "content-type": "text/plain",
                               "content-length": str(BODY)}, b"x" * BODY)
    return chunks(one * messages)


async def _timed(feed: Callable[[bytes], None], data: list[bytes],
                 done: Callable[[], bool]) -> float:
    gc.collect()
    t0 = time.process_time()
    for chunk in data:
        feed(chunk)
        await asyncio.sleep(0)  # one read per loop turn, as from a socket
    end = time.monotonic() + 120
    while not done():
        if time.monotonic() > end:
            raise TimeoutError("the brokers did not finish in time")
        await asyncio.sleep(0)
    return time.process_time() - t0


def _in_loop(broker: NetworkBroker, fn: Callable[[], object]) -> object:
    return broker.call(fn)


def run_case(case: str, messages: int) -> float:
    """CPU seconds for ``messages`` through ``case`` (``single`` or ``bridge``)."""
    net = MemoryNetwork()
    try:
        if case == "single":
            a = b = net.add("A")
            net.start()
        else:
            b = net.add("B")
            # A long keep-alive: under valgrind (bench/instructions.py) a loop turn can
            # take longer than three of the default beats, and a link that drops and
            # comes back mid-run would be counted as forwarding work.
            a = net.add("A", connector("B", heartbeat_ms=600_000))
            net.start()
            a.wait_forwarding()
        sink = _in_loop(b, lambda: _subscriber(b.runtime))
        assert isinstance(sink, SinkTransport)
        feed = _in_loop(a, lambda: _producer(a.runtime))
        if case == "bridge":
            # The subscriber's interest reaches A as demand on the queue.
            a.wait_for(lambda: a.consumers_on("hot") >= 1, what="demand for the queue on A")

        def done() -> bool:
            if sink.frames < messages:
                return False
            return case == "single" or all(x["inflight"] == 0 for x in a.outbound())

        spent = net.loop.run_until_complete(_timed(feed, _load(messages), done))  # type: ignore[arg-type]
        if case == "bridge":
            connects = [x["connects"] for x in a.outbound()]
            if connects != [1]:
                raise SystemExit(f"A's bridge connected {connects} times during the run "
                                 "(its link dropped): the figure would count reconnecting")
        return spent
    finally:
        for broker in reversed(net.brokers.values()):  # A's bridge first
            broker.close()
        net.loop.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=50_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--only", choices=("single", "bridge"), default=None,
                    help="one case (for a profiler)")
    args = ap.parse_args()
    tune_gc()  # as `meshmq broker` does
    times: dict[str, list[float]] = {c: [] for c in ("single", "bridge")
                                     if args.only in (None, c)}
    for _ in range(args.rounds):
        for case, values in times.items():
            values.append(run_case(case, args.messages) / args.messages * 1e6)
    for case, values in times.items():
        print(f"{case:7s} {min(values):6.2f} CPU µs/message (min of {args.rounds}), median "
              f"{statistics.median(values):6.2f}", flush=True)
    if len(times) < 2:
        return
    print(f"bridge / single: {min(times['bridge']) / min(times['single']):.2f} (min), "
          f"{statistics.median(times['bridge']) / statistics.median(times['single']):.2f} "
          "(median)")


if __name__ == "__main__":
    main()
