#!/usr/bin/env bash
# The many-core benchmarks, as one prepared run on a lent machine (16 cores and more):
# that machine starts bare, cannot reach a package index and has another Python than
# the development machine, so dev/device-prepare builds .device/ here first (the
# compiled build for its Python, the packages its image lacks, the revision), and
# the run carries it. Results go to bench/results/ as on any machine (their names say
# the core count) and, packed, to $OUT when the device tool sets it.
#
#   bash bench/device-run.sh check      # the build imports, brokers run; under a minute
#   bash bench/device-run.sh scaling    # bench/scaling.py 1..16 shards (hash placement,
#                                       # then numbered) + bridge one hop
#   bash bench/device-run.sh links      # bench/shard_links.py, STOMP and MQTT
#   bash bench/device-run.sh pinned     # bridge one hop with each broker and load worker
#                                       # on a CPU of its own (bench/cpu_siblings.py)
#   bash bench/device-run.sh bridge-many  # bridge one hop, 40 interleaved repetitions:
#                                       # the ratio with a 90 % interval (~5 min)
#   bash bench/device-run.sh bridge-ab  # bridge one hop, this build against an earlier
#                                       # one in .device/base (dev/device-prepare --keep-base)
#
# Each part keeps to about 8 minutes on 16 cores, inside the tool's 10 minutes a call.
set -uo pipefail
cd "$(dirname "$0")/.."
part=${1:-check}
PY=${PYTHON:-python3}
[ -d .device/lib/meshmq ] || { echo "no .device/lib: run dev/device-prepare here and carry .device" >&2; exit 2; }
export PYTHONPATH="$PWD/.device/lib:$PWD" MESHMQ_COMPILED_LIB="$PWD/.device/lib"
MESHMQ_GIT_REV="$(tr '\n' ' ' < .device/REV | sed 's/ $//')"
export MESHMQ_GIT_REV PYTHONUNBUFFERED=1 MESHMQ_BENCH_BUILD=compiled
out=${OUT:-/tmp/meshmq-device-out}
mkdir -p "$out"
log="$out/log-$part.txt"
stamp=$(mktemp)
echo "== $part on $(nproc) CPUs, $("$PY" --version), meshmq $MESHMQ_GIT_REV" | tee "$log"
"$PY" -c 'import meshmq.build as b, meshmq.cli.main, wsproto, pythonjsonlogger, psutil, uvloop, aiohttp; assert b.compiled(), b.describe(); print("build:", b.describe())' 2>&1 | tee -a "$log" \
    || { echo "the carried build does not import here" | tee -a "$log"; exit 3; }
run() {  # one benchmark, bounded: a hung one must leave time for the rest
    local limit=$1; shift
    echo "== $* (at most ${limit}s)" | tee -a "$log"
    timeout --kill-after=10 "$limit" "$PY" "$@" 2>&1 | tee -a "$log"
    echo "-- exit ${PIPESTATUS[0]}" | tee -a "$log"
}
case $part in
    check)  # also starts brokers of 1 and 2 shards from the carried build, briefly
        run 90 bench/scaling.py --quick --shards 1 2 ;;
    scaling)
        run 200 bench/scaling.py --shards 1 2 4 8 16 --count 2000000
        run 120 bench/scaling.py --shards 1 16 --count 3000000 --placement numbered
        run 150 bench/network_bench.py --only single-np 1hop-np --repeat 3 --rev worktree \
            --out "$(date +%F)-network-$(nproc)cores" ;;
    links)
        run 170 bench/shard_links.py --shards 1 2 4 8 16 --handoff both --count 1000000
        run 170 bench/shard_links.py --shards 1 2 4 8 16 --handoff on --count 1000000 \
            --protocol mqtt ;;
    pinned)
        run 60 bench/cpu_siblings.py
        for r in 1 2; do
            run 130 bench/network_bench.py --only single-np 1hop-np --repeat 6 --rev worktree \
                --cpus auto --out "$(date +%F)-network-$(nproc)cores-pinned-r$r"
        done ;;
    bridge-many)  # one run's ratio moves with the host's load: many pairs narrow it
        run 420 bench/network_bench.py --only single-np 1hop-np --repeat 40 --rev worktree \
            --out "$(date +%F)-network-$(nproc)cores-x40" ;;
    bridge-ab)  # alternating builds on one machine: the host's load hits both alike
        [ -d .device/base/lib/meshmq ] || { echo "no .device/base: dev/device-prepare --keep-base" | tee -a "$log"; exit 2; }
        base_rev="$(tr '\n' ' ' < .device/base/REV | sed 's/ $//')"
        for r in 1 2; do
            PYTHONPATH="$PWD/.device/base/lib:$PWD" MESHMQ_COMPILED_LIB="$PWD/.device/base/lib" \
                MESHMQ_GIT_REV="$base_rev" run 100 bench/network_bench.py --only single-np 1hop-np \
                --repeat 4 --rev worktree --out "$(date +%F)-network-$(nproc)cores-ab-base-r$r"
            run 100 bench/network_bench.py --only single-np 1hop-np --repeat 4 --rev worktree \
                --out "$(date +%F)-network-$(nproc)cores-ab-new-r$r"
        done ;;
    *) echo "unknown part $part: check, scaling, links, pinned, bridge-many or bridge-ab" >&2; exit 2 ;;
esac
# What this run wrote, packed (the tool brings back a few files, not folders).
find bench/results -type f -newer "$stamp" -print0 | tar -czf "$out/results-$part.tgz" --null -T -
tar -tzf "$out/results-$part.tgz" | tee -a "$log"
rm -f "$stamp"
