"""Kill-to-resumed-traffic time of the failover client.

Two brokers A and B (subprocesses on free loopback ports); a producer (confirmed
sends, back to back) and a consumer, both on ``failover:(A,B)?randomize=false``.
Mid-stream A is stopped, and the script measures, from that instant:

* ``send``: until the first send *started after the failure* is confirmed (normally
  by B; a stopped broker may still have answered one already in its socket buffer);
* ``recv``: until the consumer receives the first message sent after the failure
  (i.e. it has re-subscribed on B).

Failure modes: ``kill`` (SIGKILL: the kernel resets the sockets, so the client sees
the loss at once) and ``hang`` (SIGSTOP: the sockets stay open and only the
heart-beats / keep-alive notice; the client asks for beats every ``--beat`` ms).

    .venv/bin/python bench/failover_kill.py                    # meshmq, STOMP + MQTT
    .venv/bin/python bench/failover_kill.py --broker activemq  # Debian's ActiveMQ 5.17

Results go to stdout and to ``bench/results/<date>-failover.md`` / ``.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import os
import signal
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from brokers import ActiveMQ, Broker, Meshmq

from meshmq.client import FailoverClient, Message

RESULTS = Path(__file__).resolve().parent / "results"


async def one_run(kind: type[Broker], protocol: str, mode: str, beat_ms: int,
                  warmup: int, reply_timeout: int = -1) -> dict[str, float]:
    a, b = kind(), kind()
    try:
        a.start()
        b.start()
        scheme = "stomp" if protocol == "stomp" else "mqtt"
        uri = (f"failover:({scheme}://127.0.0.1:{a.ports[protocol]},"
               f"{scheme}://127.0.0.1:{b.ports[protocol]})?randomize=false&timeout=60000"
               f"&initialReconnectDelay=10&replyTimeout={reply_timeout}")
        kw: dict[str, object] = {"heartbeat_ms": (beat_ms, beat_ms),
                                 "keep_alive": max(1, beat_ms // 1000)}
        if protocol == "mqtt":
            kw["mqtt_version"] = 4 if kind is ActiveMQ else 5
        loop = asyncio.get_running_loop()
        failed_at: float | None = None
        first_after: float | None = None
        after_ids: set[str] = set()

        def on_message(msg: Message) -> None:
            nonlocal first_after
            if first_after is None and msg.body.startswith(b"after"):
                first_after = loop.time()

        dest = "/queue/failover.bench" if protocol == "stomp" else "failover/bench"
        consumer = FailoverClient(uri, client_id="bench-c", **kw)  # type: ignore[arg-type]
        producer = FailoverClient(uri, client_id="bench-p", **kw)  # type: ignore[arg-type]
        await consumer.connect()
        await producer.connect()
        await consumer.subscribe(dest, callback=on_message, qos=1)
        for i in range(warmup):
            await producer.send(dest, f"before {i}")
        assert a.proc is not None
        if mode == "kill":
            os.killpg(a.proc.pid, signal.SIGKILL)
        else:
            os.killpg(a.proc.pid, signal.SIGSTOP)
        failed_at = loop.time()
        sent_at = None
        i = 0
        while first_after is None:
            after_ids.add(await producer.send(dest, f"after {i}"))
            if sent_at is None:
                sent_at = loop.time()
            i += 1
            if loop.time() - failed_at > 120:
                raise RuntimeError("traffic did not resume within 120 s")
        result = {"send_s": round(sent_at - failed_at, 4),
                  "recv_s": round(first_after - failed_at, 4)}
        await producer.close()
        await consumer.close()
        return result
    finally:
        for broker in (a, b):
            if broker.proc is not None and broker.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(broker.proc.pid, signal.SIGCONT)
            broker.stop(kill=True)
            broker.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--broker", choices=["meshmq", "activemq"], default="meshmq")
    ap.add_argument("--protocol", choices=["stomp", "mqtt", "both"], default="both")
    ap.add_argument("--mode", choices=["kill", "hang", "both"], default="both")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--beat", type=int, default=2000, help="heart-beat / keep-alive, ms")
    ap.add_argument("--warmup", type=int, default=200, help="messages before the failure")
    ap.add_argument("--reply-timeout", type=int, default=-1,
                    help="the client's replyTimeout option, ms (-1: off)")
    ap.add_argument("--no-save", action="store_true")
    args = ap.parse_args()
    kind: type[Broker] = Meshmq if args.broker == "meshmq" else ActiveMQ
    missing = kind().missing()
    if missing:
        sys.exit(f"cannot run {args.broker}: {missing}")
    protocols = ["stomp", "mqtt"] if args.protocol == "both" else [args.protocol]
    modes = ["kill", "hang"] if args.mode == "both" else [args.mode]
    rows = []
    for protocol in protocols:
        for mode in modes:
            runs = [asyncio.run(one_run(kind, protocol, mode, args.beat, args.warmup,
                                        args.reply_timeout))
                    for _ in range(args.runs)]
            row = {"broker": args.broker, "protocol": protocol, "mode": mode,
                   "beat_ms": args.beat, "reply_timeout_ms": args.reply_timeout,
                   "runs": runs,
                   "send_median_s": statistics.median(r["send_s"] for r in runs),
                   "recv_median_s": statistics.median(r["recv_s"] for r in runs)}
            rows.append(row)
            print(f"{args.broker:8} {protocol:5} {mode:4}  failure -> confirmed send "
                  f"{row['send_median_s'] * 1000:8.1f} ms   failure -> received "
                  f"{row['recv_median_s'] * 1000:8.1f} ms   (median of {args.runs}; "
                  f"beat {args.beat} ms, replyTimeout {args.reply_timeout})", flush=True)
    if args.no_save:
        return
    RESULTS.mkdir(exist_ok=True)
    stamp = dt.date.today().isoformat()
    suffix = "" if args.reply_timeout < 0 else f"-reply{args.reply_timeout}"
    base = RESULTS / f"{stamp}-failover-{args.broker}{suffix}"
    base.with_suffix(".json").write_text(json.dumps(rows, indent=2) + "\n")
    lines = [f"# Failover: failure to resumed traffic ({args.broker}, {stamp})", "",
             f"`{' '.join(['bench/failover_kill.py', *sys.argv[1:]])}` on "
             f"{os.cpu_count()} CPUs; medians of {args.runs} runs.", "",
             "| protocol | failure | beat ms | replyTimeout ms | to confirmed send | "
             "to received |", "|---|---|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {row['protocol']} | {row['mode']} | {row['beat_ms']} | "
                     f"{row['reply_timeout_ms']} | "
                     f"{row['send_median_s'] * 1000:.1f} ms | "
                     f"{row['recv_median_s'] * 1000:.1f} ms |")
    base.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print(f"written {base}.md / .json ({time.strftime('%H:%M:%S')})")


if __name__ == "__main__":
    main()
