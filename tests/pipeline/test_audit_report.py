"""The audit report from plain rows (no Spark): verdict first, idle windows drawn as
zero, outages shaded, end-to-end latency charted when the latency table has it."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("matplotlib")

from meshmq.pipeline import report

T0 = dt.datetime(2026, 1, 1, 12, 0, 0)


def window(seconds: int, broker: str, event: str, events: int) -> dict[str, Any]:
    return {"window_start": T0 + dt.timedelta(seconds=seconds), "broker": broker,
            "event": event, "events": events, "bytes": events * 10}


def data(**changes: Any) -> report.ReportData:
    base: dict[str, Any] = {
        "summary": {"consumed": 10, "lost": 0}, "duplicates_total": 0, "lost": [],
        "duplicates": [], "failovers": [], "paths": [], "latency": [], "stuck": [],
        "throughput": [], "bridges": [], "window_s": 10.0}
    base.update(changes)
    return report.ReportData(**base)


def test_the_verdict_is_the_first_line() -> None:
    assert report.verdict({"consumed": 3, "lost": 0}, 0) == "no message lost, no duplicate"
    assert report.verdict({"lost": 5}, 3) == "5 messages lost, 3 delivered more than once"
    assert report.verdict({"lost": 1, "unknown": 2}, 0) == \
        "1 message lost, 2 with unknown outcome"


def test_report_opens_with_the_verdict_and_lists_new_statuses(tmp_path: Path) -> None:
    path = report.render(data(summary={"consumed": 7, "lost": 2, "unknown": 1},
                              duplicates_total=1), tmp_path)
    lines = path.read_text().splitlines()
    assert lines[0] == ("# meshmq delivery audit: 2 messages lost, 1 delivered more than "
                        "once, 1 with unknown outcome")
    assert "| unknown | 1 |" in lines


def test_idle_windows_are_zero_filled() -> None:
    rows = [window(0, "a", "received", 5), window(0, "a", "acked", 4),
            window(0, "a", "delivered", 1), window(40, "a", "received", 2),
            window(10, "a", "dispatched", 9)]  # dispatched is not charted
    t0, step, series = report.throughput_series(rows, 10.0)
    assert t0 == T0.replace(tzinfo=dt.UTC) and step == 10.0
    assert series == {"a consumed": [(0.0, 5), (10.0, 0), (20.0, 0), (30.0, 0), (40.0, 0)],
                      "a received": [(0.0, 5), (10.0, 0), (20.0, 0), (30.0, 0), (40.0, 2)]}
    # Without a parsable window the smallest gap present is the window.
    _, step, series = report.throughput_series(
        [window(0, "a", "received", 1), window(20, "a", "received", 1),
         window(30, "a", "received", 1)], None)
    assert step == 10.0 and [y for _, y in series["a received"]] == [1, 0, 1, 1]


def test_window_seconds_parses_spark_intervals() -> None:
    assert report.window_seconds("10 seconds") == 10.0
    assert report.window_seconds("100 milliseconds") == 0.1
    assert report.window_seconds("1 minute 30 seconds") == 90.0
    assert report.window_seconds("fortnight") is None


def _pixel_columns_shaded(png: Path) -> int:
    """Columns of the chart where the outage's red shade shows (light red pixels)."""
    import matplotlib.image as mpimg

    image = mpimg.imread(png)
    red = ((image[..., 0] > 0.95) & (image[..., 1] > 0.75) & (image[..., 1] < 0.9)
           & (image[..., 2] > 0.75) & (image[..., 2] < 0.9))
    return int(red.any(axis=0).sum())


def test_outages_are_shaded_on_the_throughput_chart(tmp_path: Path) -> None:
    rows = [window(s, "a", "received", 10) for s in range(0, 120, 10)]
    start = T0.replace(tzinfo=dt.UTC).timestamp()
    crash = {"broker": "a", "kind": "crash", "down_from_ts": int((start + 30) * 1e6),
             "up_again_ts": int((start + 70) * 1e6), "down_ms": 40_000.0}
    calm, shaded = tmp_path / "calm", tmp_path / "shaded"
    report.render(data(throughput=rows), calm)
    text = report.render(data(throughput=rows, failovers=[crash]), shaded).read_text()
    assert "![throughput](throughput.png)" in text
    assert _pixel_columns_shaded(calm / "throughput.png") == 0
    assert _pixel_columns_shaded(shaded / "throughput.png") > 50


def test_end_to_end_latency_is_charted_when_present(tmp_path: Path) -> None:
    broker_only = [{"destination": "queue://q", "path_text": "a", "messages": 3,
                    "p50_ms": 1.0, "p95_ms": 2.0, "p99_ms": 3.0, "max_ms": 4.0}]
    with_e2e = [dict(broker_only[0], e2e_p50_ms=5.0, e2e_p95_ms=6.0, e2e_p99_ms=7.0)]
    assert report.e2e_columns(broker_only) == {}
    assert report.e2e_columns(with_e2e) == {"p50": "e2e_p50_ms", "p95": "e2e_p95_ms",
                                            "p99": "e2e_p99_ms"}
    import matplotlib.image as mpimg

    one, two = tmp_path / "one", tmp_path / "two"
    report.render(data(latency=broker_only), one)
    text = report.render(data(latency=with_e2e), two).read_text()
    assert "| max_ms | e2e_p50_ms | e2e_p95_ms | e2e_p99_ms |" in text
    # Two panels side by side: the chart is twice as wide.
    assert mpimg.imread(two / "latency.png").shape[1] == 2 * mpimg.imread(
        one / "latency.png").shape[1]
