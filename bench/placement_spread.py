"""How evenly a node's shards share a set of equally busy queues, by placement.

    .venv/bin/python bench/placement_spread.py [--names 1000] [--out NAME]

A node's throughput on equally busy queues is bounded by its busiest shard: each
producer sends as many messages, so the shard that owns the most queues finishes last
while the others idle, and the run's msg/s is about ``shards / busiest_x_mean`` one-
shard rates. This computes, with the broker's own owner function (core/shards.py, no
broker runs), the busiest shard's queue count over the mean for the queues
``bench/scaling.py`` uses (``bench.<stem>.0`` ... ``.<n-1>``, a numbered family) under
``[shards] placement = "hash"`` and ``"numbered"``, over ``--names`` random stems
(``bench/scaling.py`` draws a new stem each run), and for names without a number
(``bench.<stem>.q<n>x``, which both placements hash). Pure computation: the same on
any machine. Writes ``bench/results/<date>-placement-spread.md`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import random
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from meshmq.core.destinations import queue
from meshmq.core.shards import PLACEMENTS, owner

RESULTS = Path(__file__).resolve().parent / "results"
CASES = [(2, 64), (4, 64), (8, 64), (16, 64), (16, 256), (32, 256)]


def busiest_x_mean(names: list[str], shards: int, scheme: str) -> float:
    per = [0] * shards
    for name in names:
        per[owner(queue(name), shards, placement=PLACEMENTS[scheme])] += 1
    return max(per) * shards / len(names)


def spread(shards: int, queues: int, stems: list[str], scheme: str,
           name: Callable[[str, int], str]) -> list[float]:
    return [busiest_x_mean([name(stem, n) for n in range(queues)], shards, scheme)
            for stem in stems]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--names", type=int, default=1000, help="random name stems per case")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default=f"{dt.date.today().isoformat()}-placement-spread")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    stems = [f"r{rng.randrange(10**6)}x{rng.randrange(10**9)}" for _ in range(args.names)]
    rows = []
    for shards, queues in CASES:
        cells = []
        for scheme, name in (("hash", lambda s, n: f"bench.{s}.{n}"),
                             ("numbered", lambda s, n: f"bench.{s}.{n}"),
                             ("numbered", lambda s, n: f"bench.{s}.q{n}x")):
            xs = sorted(spread(shards, queues, stems, scheme, name))
            cells.append(f"{statistics.median(xs):.2f} ({xs[0]:.2f}-{xs[-1]:.2f})")
        ideal = -(-queues // shards) * shards / queues
        rows.append(f"| {shards} | {queues} | {ideal:.2f} | " + " | ".join(cells) + " |")
        print(rows[-1], flush=True)
    lines = [
        f"# Placement: the busiest shard's share of equally busy queues ({dt.date.today()})",
        "",
        f"Command: `python bench/placement_spread.py --names {args.names} --seed "
        f"{args.seed}`. The broker's owner function over {args.names} random name stems "
        "per case, no broker running (the same on any machine). Each cell: the busiest "
        "shard's queue count over the mean, median (min-max) over the stems; a node on "
        "equally busy queues runs at about shards / that figure one-shard rates.",
        "",
        "| shards | queues | even split | hash, `bench.<stem>.<n>` "
        "| numbered, `bench.<stem>.<n>` | numbered, `bench.<stem>.q<n>x` (no number) |",
        "|---|---|---|---|---|---|",
        *rows, ""]
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{args.out}.md"
    path.write_text("\n".join(lines))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
