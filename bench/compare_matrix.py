"""Compare two benchmark matrix runs (``bench/run_matrix.py``'s JSON) row by row.

    .venv/bin/python bench/compare_matrix.py bench/results/2026-11-22.json \
        bench/results/2026-11-26-matrix-after.json

Prints a Markdown table per scenario: meshmq's end-to-end msg/s and broker CPU per
delivery in each run, and its ratio to every peer that ran the scenario in each run
(a ratio compares brokers measured in the same run, so it is the figure that carries
across runs on a shared machine; the absolute rates move with the machine's load).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

PEERS = ("activemq", "rabbitmq", "mosquitto", "coilmq", "amqtt", "nullsink")


def _row(run: dict[str, Any], broker: str, key: str) -> dict[str, Any] | None:
    row = run["brokers"].get(broker, {}).get("scenarios", {}).get(key)
    if not row or row.get("status") != "ok":
        return None
    return dict(row)


def _fmt(value: float | None, digits: int = 0) -> str:
    if value is None:
        return "—"
    return f"{value:,.{digits}f}"


def _ratio(run: dict[str, Any], peer: str, key: str) -> float | None:
    mine, theirs = _row(run, "meshmq", key), _row(run, peer, key)
    if not mine or not theirs or not theirs.get("e2e_rate"):
        return None
    return float(mine["e2e_rate"]) / float(theirs["e2e_rate"])


def compare(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    lines = ["| scenario | meshmq e2e msg/s before → after | broker CPU µs/delivery "
             "before → after | p50 ms before → after | ratios to peers before → after |",
             "|---|---|---|---|---|"]
    titles = {s["key"]: s["title"] for s in after["scenarios"]}
    for key, title in titles.items():
        b, a = _row(before, "meshmq", key), _row(after, "meshmq", key)
        if a is None:
            continue
        ratios = []
        for peer in PEERS:
            rb, ra = _ratio(before, peer, key), _ratio(after, peer, key)
            if ra is not None:
                ratios.append(f"{peer} {_fmt(rb, 2)}x → **{_fmt(ra, 2)}x**")

        def get(row: dict[str, Any] | None, field: str) -> float | None:
            return None if row is None or row.get(field) is None else float(row[field])

        lines.append(
            f"| {title} (`{key}`) | {_fmt(get(b, 'e2e_rate'))} → {_fmt(get(a, 'e2e_rate'))} "
            f"| {_fmt(get(b, 'broker_cpu_us_per_delivery'), 1)} → "
            f"{_fmt(get(a, 'broker_cpu_us_per_delivery'), 1)} "
            f"| {_fmt(get(b, 'p50_ms'), 1)} → {_fmt(get(a, 'p50_ms'), 1)} "
            f"| {'; '.join(ratios)} |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    args = ap.parse_args()
    before = json.loads(args.before.read_text())
    after = json.loads(args.after.read_text())
    print("\n".join(compare(before, after)))


if __name__ == "__main__":
    main()
