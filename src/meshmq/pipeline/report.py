"""The audit's Markdown report and PNG charts, rendered from a few small collected rows.

Spark only collects (``collect`` in ``audit_job``); rendering here is plain Python and
matplotlib, so the report can be tested without a JVM and written on the driver's
local disk whatever filesystem the tables went to. The verdict comes first: the
report's first line says whether anything was lost or delivered twice.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import itertools
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from meshmq.core import trace as tr

Row = dict[str, Any]

# The statuses the audit has always had; a status the transforms add later (found in
# the summary) is listed after them.
BASE_STATUSES = ("consumed", "dead_lettered", "expired", "dropped", "retained", "pending",
                 "in_transit", "lost")
CHARTS = ("throughput.png", "latency.png")
_IN = (tr.RECEIVED, tr.FORWARDED)
_CONSUMED = (tr.ACKED, tr.DELIVERED)


@dataclasses.dataclass
class ReportData:
    """What the report shows; rows are plain dicts as ``Row.asDict`` gives them."""

    summary: dict[str, int]
    duplicates_total: int
    lost: list[Row]
    duplicates: list[Row]
    failovers: list[Row]
    paths: list[Row]
    latency: list[Row]
    stuck: list[Row]
    throughput: list[Row]
    bridges: list[Row]
    window_s: float | None
    table_names: Sequence[str] = ()


def verdict(summary: dict[str, int], duplicates: int) -> str:
    """One line: ``no message lost, no duplicate`` or what was found."""
    lost = summary.get("lost", 0)
    found = []
    if lost:
        found.append(f"{lost} message{'s' if lost != 1 else ''} lost")
    if duplicates:
        found.append(f"{duplicates} delivered more than once")
    unknown = summary.get("unknown", 0)
    if unknown:
        found.append(f"{unknown} with unknown outcome")
    if not found:
        return "no message lost, no duplicate"
    return ", ".join(found)


_UNITS = {"microsecond": 1e-6, "millisecond": 1e-3, "second": 1.0, "minute": 60.0,
          "hour": 3600.0, "day": 86400.0, "week": 604800.0}


def window_seconds(text: str) -> float | None:
    """Seconds in a Spark interval such as ``10 seconds`` or ``1 minute 30 seconds``;
    None when it does not parse (the chart then infers the window from the data)."""
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]+?)s?\b", text.strip().lower())
    if not parts or any(unit not in _UNITS for _, unit in parts):
        return None
    total = sum(float(n) * _UNITS[unit] for n, unit in parts)
    return total or None


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.2f}"
    if isinstance(value, list):
        return ", ".join(map(str, value))
    if isinstance(value, dt.datetime):
        return value.strftime("%H:%M:%S")
    return str(value).replace("|", "\\|")


def _table(rows: list[Row], columns: Sequence[str]) -> list[str]:
    if not rows:
        return ["(none)", ""]
    out = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    out += ["| " + " | ".join(_cell(r.get(c)) for c in columns) + " |" for r in rows]
    return [*out, ""]


def _ts(micros: int | None) -> str:
    if micros is None:
        return ""
    return dt.datetime.fromtimestamp(micros / 1e6, dt.UTC).strftime(
        "%Y-%m-%d %H:%M:%S.%f")[:-3]


def _as_utc(t: dt.datetime) -> dt.datetime:
    # Spark hands back naive datetimes in the session time zone (UTC for the audit).
    return t if t.tzinfo else t.replace(tzinfo=dt.UTC)


def e2e_columns(rows: list[Row]) -> dict[str, str]:
    """The end-to-end latency percentile columns of the latency table, when it has
    them: ``{"p50": column, ...}`` for names such as ``e2e_p50_ms``."""
    if not rows:
        return {}
    found = {}
    for key in rows[0]:
        name = key.lower()
        if ("e2e" in name or "end_to_end" in name) and name.endswith("_ms"):
            for q in ("p50", "p95", "p99"):
                if q in name:
                    found[q] = key
    return found


def throughput_series(rows: list[Row], window_s: float | None
                      ) -> tuple[dt.datetime, float, dict[str, list[tuple[float, int]]]]:
    """Per ``broker kind`` series of (seconds since the first window, events), every
    window from the first to the last present, idle windows as zero."""
    merged: dict[str, dict[dt.datetime, int]] = {}
    for r in rows:
        if r["event"] in _IN or r["event"] in _CONSUMED:
            kind = "consumed" if r["event"] in _CONSUMED else r["event"]
            series = merged.setdefault(f"{r['broker']} {kind}", {})
            start = _as_utc(r["window_start"])
            series[start] = series.get(start, 0) + int(r["events"])
    starts = sorted({t for s in merged.values() for t in s})
    if not starts:
        return dt.datetime.fromtimestamp(0, dt.UTC), 0.0, {}
    t0 = starts[0]
    if window_s is None:  # the smallest gap between windows present
        gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(starts)]
        window_s = min((g for g in gaps if g > 0), default=1.0)
    n = round((starts[-1] - t0).total_seconds() / window_s) + 1
    out: dict[str, list[tuple[float, int]]] = {}
    for name, series in sorted(merged.items()):
        by_index = {round((t - t0).total_seconds() / window_s): v
                    for t, v in series.items()}
        out[name] = [(i * window_s, by_index.get(i, 0)) for i in range(n)]
    return t0, window_s, out


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def throughput_chart(data: ReportData, path: Path) -> bool:
    """Messages in and consumed per broker and window, outages shaded; False when
    there is nothing to draw."""
    t0, window_s, series = throughput_series(data.throughput, data.window_s)
    if not series:
        return False
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 3.8))
    for name, points in series.items():
        # A window's count holds from its start to the next window's start.
        ax.step([x for x, _ in points] + [points[-1][0] + window_s],
                [y for _, y in points] + [points[-1][1]], where="post", label=name)
    end = max(p[-1][0] for p in series.values()) + window_s
    labelled = set()
    for f in data.failovers:
        down = (f["down_from_ts"] / 1e6) - t0.timestamp()
        up = (f["up_again_ts"] / 1e6) - t0.timestamp()
        if up < 0 or down > end:
            continue
        label = f"{f['broker']} down ({f['kind']})"
        color = "tab:red" if f["kind"] == "crash" else "tab:gray"
        ax.axvspan(max(down, 0), min(up, end), color=color, alpha=0.2,
                   label=None if label in labelled else label)
        labelled.add(label)
    ax.set_xlim(0, end)
    ax.set_ylim(bottom=0)
    ax.set_xlabel(f"seconds since {t0:%Y-%m-%d %H:%M:%S} UTC "
                  f"(windows of {window_s:g} s; idle windows are 0)")
    ax.set_ylabel("events per window")
    ax.set_title("Messages in and consumed per broker")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True


def latency_chart(data: ReportData, path: Path) -> bool:
    """Broker latency percentiles per destination and path, and end-to-end latency
    beside them when the latency table has it."""
    rows = data.latency[:12]
    if not rows:
        return False
    e2e = e2e_columns(rows)
    panels = [("Broker latency (accepted -> first dispatch)",
               {"p50": "p50_ms", "p95": "p95_ms", "p99": "p99_ms"})]
    if e2e:
        panels.append(("End-to-end latency", e2e))
    plt = _plt()
    fig, axes = plt.subplots(1, len(panels), figsize=(7 * len(panels), 3.8), squeeze=False)
    labels = [f"{r['destination']}\n{r['path_text']}" for r in rows]
    xs = range(len(labels))
    for ax, (title, columns) in zip(axes[0], panels, strict=True):
        for i, (name, column) in enumerate(sorted(columns.items())):
            ax.bar([x + (i - 1) * 0.27 for x in xs], [r.get(column) or 0 for r in rows],
                   width=0.27, label=name)
        ax.set_xticks(list(xs), labels, fontsize=7)
        ax.set_ylabel("ms")
        ax.set_title(title, fontsize=10)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True


def render(data: ReportData, out: Path, *, title: str = "meshmq delivery audit") -> Path:
    """Write ``report.md`` and its charts into the local directory ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    summary = data.summary
    total = sum(summary.values())
    n_lost = summary.get("lost", 0)
    lines = [f"# {title}: {verdict(summary, data.duplicates_total)}", "",
             f"{total} messages traced; **{n_lost} lost**, **{data.duplicates_total} "
             f"delivered more than once**, {len(data.failovers)} failover window(s).", "",
             "## Messages by final status", ""]
    statuses = [*BASE_STATUSES, *sorted(s for s in summary if s not in BASE_STATUSES)]
    lines += _table([{"status": s, "messages": summary.get(s, 0)} for s in statuses],
                    ["status", "messages"])
    lost = [dict(r, last_time=_ts(r.get("last_ts"))) for r in data.lost]
    lines += ["## Lost messages", "",
              "Accepted by a broker, never consumed, dead-lettered, expired or dropped, and "
              "not pending anywhere: the broker that last held them restarted and they did "
              "not come back.", ""]
    lines += _table(lost, ["message_id", "destination", "persistent", "last_event",
                           "last_broker", "last_time"])
    lines += ["## Duplicate deliveries", "",
              "`redelivered`: one message dispatched more than once; `resent`: one dedup-id "
              "sent as several messages, more than one of them delivered.", ""]
    lines += _table(data.duplicates, ["kind", "key", "destination", "deliveries", "acks",
                                      "message_ids"])
    failovers = [dict(r, down_from=_ts(r.get("down_from_ts")), up_again=_ts(
        r.get("up_again_ts"))) for r in data.failovers]
    lines += ["## Failover windows", ""]
    lines += _table(failovers, ["broker", "kind", "down_from", "up_again", "up_on",
                                 "down_ms"])
    lines += ["## Throughput over time", "",
              "Idle windows count as zero; shaded: a broker was down (red: crash, grey: "
              "restart).", ""]
    if throughput_chart(data, out / "throughput.png"):
        lines += ["![throughput](throughput.png)", ""]
    else:
        lines += ["(no traffic)", ""]
    lines += ["## Paths and hops", ""]
    lines += _table(data.paths, ["path_text", "hops", "messages", "consumed"])
    e2e = e2e_columns(data.latency)
    lines += ["## Delivery latency", "",
              "Broker latency: accepted -> first dispatch"
              + ("; end-to-end: the `" + "`, `".join(e2e.values()) + "` columns."
                 if e2e else "."), ""]
    lines += _table(data.latency, ["destination", "path_text", "messages", "p50_ms",
                                   "p95_ms", "p99_ms", "max_ms", *e2e.values()])
    if latency_chart(data, out / "latency.png"):
        lines += ["![latency](latency.png)", ""]
    lines += ["## Stuck messages", "",
              "Pending longer than the threshold; `consumers_elsewhere`: consumers of the "
              "destination were served on another broker meanwhile.", ""]
    lines += _table(data.stuck, ["message_id", "last_broker", "last_destination", "age_ms",
                                 "consumers_elsewhere", "served_by"])
    lines += ["## Throughput per bridge", ""]
    lines += _table(data.bridges, ["window_start", "broker", "peer", "connector",
                                   "messages"])
    if data.table_names:
        lines += ["Tables (Parquet) beside this report: " + ", ".join(
            f"`{name}/`" for name in data.table_names) + ".", ""]
    path = out / "report.md"
    path.write_text("\n".join(lines))
    return path
