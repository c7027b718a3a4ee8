"""Which of this machine's CPUs run at full speed side by side, found by measuring.

    python bench/cpu_siblings.py            # prints the CPUs chosen and every probe
    python bench/cpu_siblings.py --want 4   # stop once 4 independent CPUs are found

A virtual machine's CPUs are often hyperthreads of the host: the guest sees 16 cores
with one thread each (``lscpu``), but two of them may share one physical core, and a
process on either runs at roughly 60% of its speed while the other is busy. Benchmarks
that compare one broker with two (a bridge) then measure where the scheduler happened
to put the processes. This probe finds CPUs that do not slow each other: it keeps a set
of chosen CPUs, and for each candidate runs a busy loop on every chosen CPU and on the
candidate at once; the candidate joins when no loop runs slower than
``--slowdown`` times its speed alone. Other tenants' load moves the numbers too, which
is why the probe reports every measurement beside its choice.

Written by hand because the guest's own topology files (``/sys/devices/system/cpu``)
describe the virtual machine, not the host cores behind it.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import time
from typing import Any

Probe = dict[str, Any]


def _spin(cpu: int, start: Any, seconds: float, out: Any) -> None:
    os.sched_setaffinity(0, {cpu})
    start.wait()  # every loop starts together, once all are pinned
    n = 0
    end = time.perf_counter() + seconds
    while True:
        for _ in range(20_000):
            n += 1
        if time.perf_counter() >= end:
            break
    out.put((cpu, n / seconds))


def rates(cpus: list[int], seconds: float) -> dict[int, float]:
    """Busy-loop iterations per second on each of ``cpus``, all running at once."""
    ctx = mp.get_context("fork")
    start, out = ctx.Barrier(len(cpus)), ctx.Queue()
    procs = [ctx.Process(target=_spin, args=(c, start, seconds, out)) for c in cpus]
    for p in procs:
        p.start()
    got = dict(out.get(timeout=seconds + 30) for _ in procs)
    for p in procs:
        p.join()
    return got


def independent(cpus: list[int], want: int, seconds: float, slowdown: float
                ) -> tuple[list[int], list[Probe]]:
    """Greedily choose CPUs of ``cpus`` that keep their speed when all run at once."""
    # Each speed is the better of two probes: a probe that another tenant's burst
    # slowed would otherwise leave a good CPU out.
    alone = {c: max(rates([c], seconds)[c], rates([c], seconds)[c]) for c in cpus}
    chosen: list[int] = []
    probes: list[Probe] = []
    for c in cpus:
        if len(chosen) >= want:
            break
        worst = 1.0
        if chosen:
            worst = 0.0
            for _ in range(2):
                together = rates([*chosen, c], seconds)
                worst = max(worst, min(together[x] / alone[x] for x in together))
        ok = worst >= 1 / slowdown
        probes.append({"cpu": c, "with": list(chosen), "worst_speed": round(worst, 2),
                       "alone": round(alone[c]), "joined": ok})
        if ok:
            chosen.append(c)
    return chosen, probes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--want", type=int, default=0, help="stop after this many (default all)")
    ap.add_argument("--seconds", type=float, default=0.3, help="length of each probe")
    ap.add_argument("--slowdown", type=float, default=1.25,
                    help="largest slowdown a chosen CPU may show (default 1.25)")
    a = ap.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    chosen, probes = independent(cpus, a.want or len(cpus), a.seconds, a.slowdown)
    for p in probes:
        print(f"cpu {p['cpu']:>3}: alone {p['alone']:>12,}/s, slowest of {len(p['with']) + 1} "
              f"together at {p['worst_speed']:.2f}x -> {'joined' if p['joined'] else 'left out'}")
    print("independent:", ",".join(map(str, chosen)))


if __name__ == "__main__":
    main()
