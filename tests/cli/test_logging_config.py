"""``[logging]`` applied by a real ``meshmq broker`` subprocess: JSON lines in a rotating
file, per-logger levels, ``--log-level`` winning over the file, and one-line errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.support.brokers import poll

MAX_BYTES = 600


def broker_toml(tmp_path: Path, logging_section: str) -> Path:
    path = tmp_path / "meshmq.toml"
    path.write_text(f'[broker]\nname = "logged"\ndata_directory = "{tmp_path / "data"}"\n\n'
                    '[[listeners]]\nname = "stomp"\nurl = "stomp://127.0.0.1:0"\n\n'
                    '[management]\nhost = "127.0.0.1"\nport = 0\n\n'
                    f"{logging_section}\n")
    return path


def meshmq(*args: str) -> list[str]:
    return [sys.executable, "-m", "meshmq.cli.main", *args]


@pytest.fixture
def run_broker(tmp_path: Path) -> Iterator[Any]:
    procs: list[subprocess.Popen[bytes]] = []

    def start(*args: str) -> subprocess.Popen[bytes]:
        stderr = open(tmp_path / f"stderr{len(procs)}", "wb")  # noqa: SIM115
        proc = subprocess.Popen(meshmq(*args), stdout=stderr, stderr=stderr,
                                env=dict(os.environ, PYTHONUNBUFFERED="1"))
        stderr.close()
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def records(log: Path) -> list[dict[str, Any]]:
    """Every JSON line of the log file and its rotated files, oldest first."""
    files = [*sorted(log.parent.glob(log.name + ".*"), reverse=True), log]
    lines = [line for f in files if f.exists() for line in f.read_text().splitlines()]
    return [json.loads(line) for line in lines]


def started(log: Path) -> list[dict[str, Any]] | None:
    if not log.exists():
        return None
    found = records(log)
    return found if any("started" in r["message"] for r in found) else None


def test_json_lines_rotate_and_per_logger_levels_apply(tmp_path: Path, run_broker: Any
                                                       ) -> None:
    log = tmp_path / "logs" / "broker.log"
    log.parent.mkdir()
    config = broker_toml(tmp_path, f'[logging]\nlevel = "warning"\n'
                         f'loggers = {{ "meshmq.runtime" = "info" }}\nfile = "{log}"\n'
                         f'max_file_bytes = {MAX_BYTES}\nbackup_count = 2\nformat = "json"\n')
    proc = run_broker("broker", "--config", str(config))
    found = poll(lambda: started(log), 30, "the broker's start in its JSON log")
    assert all({"time", "level", "logger", "message"} <= set(r) for r in found)
    assert any(r["message"].startswith("listening for stomp on") for r in found)
    # INFO only from the logger raised to info; the management endpoint's INFO line is
    # below the overall level.
    assert {r["logger"] for r in found if r["level"] == "INFO"} == {"meshmq.runtime"}
    assert not any(r["logger"] == "meshmq.management" for r in found)
    # Rotated at the size limit, two old files kept.
    assert (log.parent / "broker.log.1").exists()
    assert not (log.parent / "broker.log.3").exists()
    assert all(f.stat().st_size <= MAX_BYTES for f in log.parent.iterdir())
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(20) == 0
    assert (tmp_path / "stderr0").read_text() == ""  # everything went to the file


def test_the_command_line_level_wins_over_the_file(tmp_path: Path, run_broker: Any) -> None:
    log = tmp_path / "broker.log"
    config = broker_toml(tmp_path, f'[logging]\nlevel = "error"\nfile = "{log}"\n'
                         'format = "json"\n')
    run_broker("--log-level", "info", "broker", "--config", str(config))
    poll(lambda: started(log), 30, "the broker's start in its JSON log")
    poll(lambda: any(r["logger"] == "meshmq.management" and r["level"] == "INFO"
                     for r in records(log)), 10, "the management endpoint's INFO line")


def test_a_bad_level_is_one_line_naming_file_line_and_option(tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text('[broker]\nname = "b"\n\n[logging]\nformat = "json"\nlevel = "loud"\n')
    done = subprocess.run(meshmq("broker", "--config", str(config)), capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        f"meshmq: configuration error: {config}:6, option 'logging.level': must be one of "
        "'debug', 'info', 'warning', 'error', 'critical', got 'loud'"]


def test_a_log_file_that_cannot_be_opened_is_one_line(tmp_path: Path) -> None:
    config = broker_toml(tmp_path, f'[logging]\nfile = "{tmp_path / "missing" / "b.log"}"\n')
    done = subprocess.run(meshmq("broker", "--config", str(config)), capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        f"meshmq: configuration error: {config}, option 'logging.file': cannot open the log "
        f"file {tmp_path / 'missing' / 'b.log'}: No such file or directory"]
