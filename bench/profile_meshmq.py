"""Profile a meshmq broker under a benchmark load with py-spy; summarise by function.

    .venv/bin/python bench/profile_meshmq.py                 # queue 1/1 non-persistent
    .venv/bin/python bench/profile_meshmq.py --persistent    # persistent, window 100
    .venv/bin/python bench/profile_meshmq.py --mqtt 0        # MQTT QoS 0, 1/1
    .venv/bin/python bench/profile_meshmq.py --producers 4 --consumers 4
    .venv/bin/python bench/profile_meshmq.py --svg /tmp/flame.svg

Starts meshmq as run_matrix.py does (journal store, fsync on), samples it with
``py-spy record`` (``pip install py-spy``; it may need root for ptrace) while the
load generator drives it, then prints the functions with the most self and
inclusive time. Samples of the broker only: the generator runs in other processes.
"""

from __future__ import annotations

import argparse
import collections
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import brokers as bk
from loadgen import LoadSpec, run_load


def summarise(raw: Path, top: int) -> str:
    self_t: collections.Counter[str] = collections.Counter()
    incl: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not n.isdigit():
            continue
        count = int(n)
        total += count
        frames = [re.sub(r":\d+\)$", ")", f) for f in stack.split(";")]
        self_t[frames[-1]] += count
        for f in set(frames):
            incl[f] += count
    if not total:
        return "no samples (is py-spy allowed to attach? try as root)\n"
    out = [f"{total} samples", "", "self time by function:"]
    out += [f"{100 * n / total:5.1f}%  {f}" for f, n in self_t.most_common(top)]
    out += ["", "inclusive time by function:"]
    out += [f"{100 * n / total:5.1f}%  {f}" for f, n in incl.most_common(top + 8)
            if 100 * n / total < 95]
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--persistent", action="store_true", help="persistent, window 100")
    ap.add_argument("--mqtt", type=int, choices=(0, 1), help="MQTT at this QoS (window 100 at 1)")
    ap.add_argument("--producers", type=int, default=1)
    ap.add_argument("--consumers", type=int, default=1)
    ap.add_argument("--seconds", type=float, default=10.0, help="sampling time")
    ap.add_argument("--svg", help="also write a flame graph here")
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(spy).exists():
        sys.exit("py-spy not found: pip install py-spy")
    broker = bk.Meshmq()
    tmp = Path(tempfile.mkdtemp(prefix="meshmq-prof-"))
    try:
        broker.start()
        shape = dict(producers=args.producers, consumers=args.consumers,
                     duration=args.seconds + 2)
        if args.mqtt is not None:
            spec = LoadSpec(protocol="mqtt", port=broker.ports["mqtt"], count=400_000,
                            qos=args.mqtt, window=100 if args.mqtt else 0, **shape)
        elif args.persistent:
            spec = LoadSpec(port=broker.ports["stomp"], count=200_000, persistent=True,
                            window=100, **shape)
        else:
            spec = LoadSpec(port=broker.ports["stomp"], count=400_000, **shape)
        raw = tmp / "profile.txt"
        cmd = [spy, "record", "--pid", str(broker.pid()), "--duration", str(int(args.seconds)),
               "--rate", "200", "--nonblocking"]
        procs = [subprocess.Popen([*cmd, "--format", "raw", "-o", str(raw)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
        if args.svg:
            procs.append(subprocess.Popen([*cmd, "-o", args.svg], stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL))
        res = run_load(spec)
        for p in procs:
            p.wait(120)
        print(f"load: e2e {res.e2e_rate:,.0f} msg/s, send {res.send_rate:,.0f} msg/s, "
              f"p99 {res.p99_ms} ms")
        print(summarise(raw, args.top) if raw.exists() else "py-spy wrote nothing")
    finally:
        broker.close()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
