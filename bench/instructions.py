"""Instructions per message of an in-process benchmark, counted by valgrind.

On a shared machine the CPU time of the same code moves by 30 % and more between runs
(other virtual machines on the host, not only other processes here); the number of
instructions executed does not. This runs ``bench/hotpath.py`` (one case) or
``bench/bridge_hotpath.py`` (``single`` or ``bridge``) under ``valgrind --tool=callgrind``
twice, with a small and a large message count, and divides the difference of the two
totals by the difference of the counts: start-up, imports and set-up cancel out.

    .venv/bin/python bench/instructions.py --lib build/compiled-lib hotpath stomp-q1x1
    .venv/bin/python bench/instructions.py --lib build/compiled-lib bridge bridge
    .venv/bin/python bench/instructions.py --lib /tmp/old/compiled-lib --lib build/compiled-lib \
        bridge single bridge

Each ``--lib`` is put in front of PYTHONPATH (a compiled build, or a tree's ``src``);
several are measured one after the other. Needs ``valgrind`` (``apt-get install valgrind``); a run
under it is ~50x slower, so the counts are kept small. Instructions are not time (a cache miss
costs more than an add), but a change that removes work shows in them at once.
Writes nothing.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
TOTAL = re.compile(rb"Collected : (\d+)")


def instructions(lib: str, script: str, args: list[str]) -> int:
    """Instructions the whole run of ``script`` executed (valgrind's total)."""
    # A fixed hash seed: string hashes decide dict and set probe sequences, which
    # otherwise move the count by a few percent between identical runs.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([lib, str(REPO)]), PYTHONHASHSEED="0")
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp}/out",
             sys.executable, str(BENCH / script), *args],
            env=env, capture_output=True, check=False)
    found = TOTAL.search(done.stderr)
    if done.returncode != 0 or found is None:
        tail = done.stderr.decode(errors="replace")[-2000:]
        raise SystemExit(f"{script} {' '.join(args)} failed under valgrind:\n{tail}")
    return int(found.group(1))


def per_message(lib: str, bench: str, case: str, small: int, large: int) -> float:
    if bench == "hotpath":
        def run(n: int) -> int:
            return instructions(lib, "hotpath.py", ["--only", case, "--messages", str(n),
                                                    "--rounds", "1", "--no-write"])
    else:
        def run(n: int) -> int:
            return instructions(lib, "bridge_hotpath.py", ["--only", case, "--messages",
                                                           str(n), "--rounds", "1"])
    return (run(large) - run(small)) / (large - small)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lib", action="append", required=True,
                    help="put in front of PYTHONPATH (repeat to compare builds)")
    ap.add_argument("--small", type=int, default=5_000, help="messages in the small run")
    ap.add_argument("--large", type=int, default=15_000, help="messages in the large run")
    ap.add_argument("bench", choices=("hotpath", "bridge"))
    ap.add_argument("cases", nargs="+",
                    help="hotpath.py case names, or single / bridge for bridge_hotpath.py")
    a = ap.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed: apt-get install valgrind")
    if a.large <= a.small:
        raise SystemExit("--large must be more messages than --small")
    for case in a.cases:
        for lib in a.lib:
            n = per_message(lib, a.bench, case, a.small, a.large)
            print(f"{a.bench} {case:<12} {lib}: {n:,.0f} instructions/message", flush=True)


if __name__ == "__main__":
    main()
