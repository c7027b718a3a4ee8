"""The node's ``GET /metrics``: its shards' metrics, fetched at once, as one broker's.

Each shard serves its own metrics (management/metrics.py) on its management socket; the
node asks them all in OpenMetrics (which keeps every family's type), parses the answers
with prometheus-client's parser and serves the result through a registry, so the scraper
gets the text format or OpenMetrics as it asks. :func:`merge` is pure:

* node totals are summed over the shards that answered: messages, destinations (each
  has one owner), the store's counters and its sync histogram, bridges (shard 0 alone
  runs them), trace events, logins and refusals;
* where a total would hide one shard (``PER_SHARD``: connections, memory, a shard's
  store limit and refusal, each shard link's ``meshmq_shard_link_*{peer}``), every
  shard keeps its series, with a ``shard`` label;
* the HA series are the front shard's (the whole node has one role), and
  ``meshmq_uptime_seconds`` is the node's own.

The node adds ``meshmq_shard_up{shard}`` (0 for a shard that did not answer: its
series are missing from the sums until it answers again, as after a restart, which a
counter's ``rate()`` takes as a reset), ``meshmq_shard_restarts_total`` and, from each
shard process's ``/proc`` entry (:func:`process_figures`), its CPU seconds and resident
memory.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from prometheus_client import ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.openmetrics.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from meshmq.node.aggregate import ShardRow

__all__ = ["ACCEPT", "PER_SHARD", "FixedCollector", "ShardMetrics", "merge", "node_figures",
           "process_figures"]

# What the node asks each shard for: OpenMetrics keeps info and unit metadata that the
# older text format loses.
ACCEPT = "application/openmetrics-text; version=1.0.0; charset=utf-8"
PER_SHARD = frozenset({"meshmq_connections", "meshmq_memory_used_bytes",
                       "meshmq_memory_limit_bytes", "meshmq_store_limit_bytes",
                       "meshmq_store_refusing_persistent"})
_PER_SHARD_PREFIX = "meshmq_shard_link_"
_FRONT = frozenset({"meshmq_ha_role", "meshmq_ha_epoch"})
_NODE_OWN = frozenset({"meshmq_uptime_seconds"})
# Families whose samples say "this is so" (value 1): merged, never added up.
_FLAGS = frozenset({"info", "stateset"})

_Key = tuple[str, tuple[tuple[str, str], ...]]


@dataclass(frozen=True, slots=True)
class ShardMetrics:
    """One shard's metrics text (OpenMetrics), or why there is none."""

    shard: int
    text: str | None = None
    error: str = ""


def _parse(answer: ShardMetrics) -> list[Metric] | None:
    if answer.text is None:
        return None
    try:
        return list(text_string_to_metric_families(answer.text))  # type: ignore[no-untyped-call]
    except ValueError:
        return None


def merge(answers: Sequence[ShardMetrics]) -> tuple[list[Metric], dict[int, bool]]:
    """The node's families from its shards' answers, and which shards answered."""
    parsed = {a.shard: _parse(a) for a in answers}
    up = {shard: families is not None for shard, families in parsed.items()}
    front = min((k for k, ok in up.items() if ok), default=None)
    out: dict[str, Metric] = {}
    values: dict[str, dict[_Key, float]] = {}
    for shard in sorted(parsed):
        for family in parsed[shard] or ():
            name = family.name
            if name in _NODE_OWN or (name in _FRONT and shard != front):
                continue
            per_shard = name in PER_SHARD or name.startswith(_PER_SHARD_PREFIX)
            if name not in out:
                out[name] = Metric(name, family.documentation, family.type, family.unit)
            sums = values.setdefault(name, {})
            for sample in family.samples:
                labels = {**sample.labels, "shard": str(shard)} if per_shard \
                    else sample.labels
                key = (sample.name, tuple(labels.items()))
                seen = sums.get(key)
                if seen is None:
                    sums[key] = sample.value
                elif sample.name.endswith("_created"):
                    sums[key] = min(seen, sample.value)  # the earliest start stands
                elif family.type in _FLAGS:
                    sums[key] = max(seen, sample.value)
                else:
                    sums[key] = seen + sample.value
    for name, family in out.items():
        for (sample_name, pairs), value in values[name].items():
            family.add_sample(sample_name, dict(pairs), value)
    return list(out.values()), up


def node_figures(rows: Sequence[ShardRow], up: dict[int, bool], uptime_s: float
                 ) -> list[Metric]:
    """The node's own families: its uptime and, per shard, answering and restarts."""
    shard_up = GaugeMetricFamily("meshmq_shard_up",
                                 "1 when the shard answered this scrape, else 0",
                                 labels=("shard",))
    restarts = CounterMetricFamily("meshmq_shard_restarts",
                                   "Times the node restarted the shard's process",
                                   labels=("shard",))
    for row in sorted(rows, key=lambda r: r.shard):
        shard_up.add_metric((str(row.shard),), 1 if up.get(row.shard) else 0)
        restarts.add_metric((str(row.shard),), row.restarts)
    return [GaugeMetricFamily("meshmq_uptime_seconds", "Seconds since the node started",
                              value=uptime_s), shard_up, restarts]


# Figures of a process (prometheus-client's ProcessCollector) kept per shard, renamed.
_PROCESS = {"process_cpu_seconds": ("meshmq_shard_cpu_seconds",
                                    "CPU seconds (user and system) the shard's process used"),
            "process_resident_memory_bytes": ("meshmq_shard_resident_memory_bytes",
                                              "Resident memory of the shard's process")}


def _constant(pid: int) -> Callable[[], int]:
    return lambda: pid


def process_figures(rows: Sequence[ShardRow], proc: str = "/proc") -> list[Metric]:
    """Each running shard's CPU seconds and resident memory, read from ``proc`` (Linux;
    elsewhere, or for a process that is gone, there are none)."""
    families = {name: Metric(new, doc, "counter" if name.endswith("_seconds") else "gauge")
                for name, (new, doc) in _PROCESS.items()}
    for row in sorted(rows, key=lambda r: r.shard):
        if row.pid is None:
            continue
        reader = ProcessCollector(pid=_constant(row.pid), proc=proc, registry=None)
        for family in reader.collect():
            target = families.get(family.name)
            if target is None:
                continue
            for sample in family.samples:
                suffix = sample.name[len(family.name):]
                target.add_sample(target.name + suffix, {"shard": str(row.shard)},
                                  sample.value)
    return list(families.values())


class FixedCollector(Collector):
    """Families already gathered, for one registry's one exposition."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self.families = list(families)

    def collect(self) -> Iterable[Metric]:
        return self.families
