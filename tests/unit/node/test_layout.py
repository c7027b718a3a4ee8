"""The node's data directory: shards.json, refusals of another shard count, the run
directory."""

from __future__ import annotations

import json
import shutil
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from meshmq.core.shards import HASH_NAME, NUMBERED_NAME
from meshmq.node.layout import (
    LayoutError,
    NodeLayout,
    check_layout,
    make_run_dir,
    read_shards_file,
    release_run_dir,
    shard_directory,
)


def _store(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    (path / "00000001.log").write_bytes(b"x")


def test_a_fresh_directory_records_the_count(tmp_path: Path) -> None:
    data = tmp_path / "data"
    check_layout(data, 3, "node-a", data / "journal")
    assert read_shards_file(data) == NodeLayout(3, HASH_NAME, "node-a")
    assert json.loads((data / "shards.json").read_text()) == {
        "shards": 3, "hash": HASH_NAME, "node": "node-a"}


def test_the_same_count_starts_again(tmp_path: Path) -> None:
    check_layout(tmp_path, 2, "n", tmp_path / "journal")
    _store(shard_directory(tmp_path, 0) / "journal")
    check_layout(tmp_path, 2, "n", tmp_path / "journal")
    assert read_shards_file(tmp_path) == NodeLayout(2, HASH_NAME, "n")


def test_another_count_over_stored_data_is_refused_naming_the_recorded_one(
        tmp_path: Path) -> None:
    check_layout(tmp_path, 2, "n", tmp_path / "journal")
    _store(shard_directory(tmp_path, 1) / "journal")
    with pytest.raises(LayoutError) as err:
        check_layout(tmp_path, 4, "n", tmp_path / "journal")
    assert "--shards 2" in str(err.value) and "\n" not in str(err.value)
    assert read_shards_file(tmp_path) == NodeLayout(2, HASH_NAME, "n")


def test_another_count_with_nothing_stored_is_recorded(tmp_path: Path) -> None:
    check_layout(tmp_path, 2, "n", tmp_path / "journal")
    shard_directory(tmp_path, 0).mkdir()  # made, never written
    check_layout(tmp_path, 4, "n", tmp_path / "journal")
    assert read_shards_file(tmp_path) == NodeLayout(4, HASH_NAME, "n")


def test_a_plain_store_is_not_split(tmp_path: Path) -> None:
    _store(tmp_path / "journal")
    with pytest.raises(LayoutError) as err:
        check_layout(tmp_path, 2, "n", tmp_path / "journal")
    assert "one-process store" in str(err.value) and "shards = 1" in str(err.value)
    assert read_shards_file(tmp_path) is None


def test_one_shard_over_a_node_is_refused(tmp_path: Path) -> None:
    check_layout(tmp_path, 2, "n", tmp_path / "journal")
    _store(shard_directory(tmp_path, 0) / "journal")
    with pytest.raises(LayoutError, match="--shards 2"):
        check_layout(tmp_path, 1, "n", tmp_path / "journal")


def test_one_shard_on_a_plain_or_fresh_directory_writes_nothing(tmp_path: Path) -> None:
    _store(tmp_path / "journal")
    check_layout(tmp_path, 1, "n", tmp_path / "journal")
    check_layout(tmp_path / "fresh", 1, "n", tmp_path / "fresh" / "journal")
    assert not (tmp_path / "shards.json").exists()
    assert not (tmp_path / "fresh").exists()


def test_a_memory_store_fits_any_count(tmp_path: Path) -> None:
    _store(tmp_path / "journal")
    check_layout(tmp_path, 2, "n", tmp_path / "journal", persistent=False)
    assert read_shards_file(tmp_path) is None


@pytest.mark.parametrize("text", ["not json", '{"shards": 2}', '{"shards": "2", '
                                  '"hash": "h", "node": "n"}', "[]"])
def test_a_damaged_shards_file_is_one_line(tmp_path: Path, text: str) -> None:
    (tmp_path / "shards.json").write_text(text)
    with pytest.raises(LayoutError) as err:
        check_layout(tmp_path, 2, "n", tmp_path / "journal")
    assert "shards.json" in str(err.value) and "\n" not in str(err.value)


def test_an_unknown_hash_is_refused(tmp_path: Path) -> None:
    (tmp_path / "shards.json").write_text(json.dumps(
        {"shards": 2, "hash": "other-hash-9", "node": "n"}))
    with pytest.raises(LayoutError, match="other-hash-9"):
        check_layout(tmp_path, 2, "n", tmp_path / "journal")


def test_a_fresh_node_records_its_placement(tmp_path: Path) -> None:
    check_layout(tmp_path, 2, "n", tmp_path / "journal", placement=NUMBERED_NAME)
    assert read_shards_file(tmp_path) == NodeLayout(2, NUMBERED_NAME, "n")
    _store(shard_directory(tmp_path, 0) / "journal")
    check_layout(tmp_path, 2, "n", tmp_path / "journal", placement=NUMBERED_NAME)
    assert read_shards_file(tmp_path) == NodeLayout(2, NUMBERED_NAME, "n")


@pytest.mark.parametrize(("made", "asked", "word"), [(HASH_NAME, NUMBERED_NAME, "numbered"),
                                                     (NUMBERED_NAME, HASH_NAME, "hash")])
def test_another_placement_over_stored_data_is_refused_naming_the_rebalance(
        tmp_path: Path, made: str, asked: str, word: str) -> None:
    check_layout(tmp_path, 2, "n", tmp_path / "journal", placement=made)
    _store(shard_directory(tmp_path, 1) / "journal")
    with pytest.raises(LayoutError) as err:
        check_layout(tmp_path, 2, "n", tmp_path / "journal", placement=asked)
    line = str(err.value)
    assert "\n" not in line and f"placement = {word!r}" in line
    assert f"--to 2 --placement {word}" in line
    assert read_shards_file(tmp_path) == NodeLayout(2, made, "n")


def test_another_placement_with_nothing_stored_is_recorded(tmp_path: Path) -> None:
    check_layout(tmp_path, 2, "n", tmp_path / "journal")
    shard_directory(tmp_path, 0).mkdir()  # made, never written
    check_layout(tmp_path, 2, "n", tmp_path / "journal", placement=NUMBERED_NAME)
    assert read_shards_file(tmp_path) == NodeLayout(2, NUMBERED_NAME, "n")


def test_the_run_directory_is_private(tmp_path: Path) -> None:
    run, temporary = make_run_dir(tmp_path)
    assert run == (tmp_path / "run").absolute() and not temporary
    assert stat.S_IMODE(run.stat().st_mode) == 0o700
    (tmp_path / "run").chmod(0o755)
    run, _ = make_run_dir(tmp_path)
    assert stat.S_IMODE(run.stat().st_mode) == 0o700


def test_a_run_directory_too_deep_for_socket_paths_is_a_private_temporary_one(
        tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 120)
    run, temporary = make_run_dir(deep)
    try:
        assert temporary and len(str(run / "shard-255.mgmt.sock")) <= 100
        assert stat.S_IMODE(run.stat().st_mode) == 0o700
        assert not (deep / "run").exists()
    finally:
        release_run_dir(run)
    assert not run.exists()


def test_one_shard_leaves_an_unusable_directory_to_the_store(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    check_layout(not_a_dir, 1, "n", not_a_dir / "journal")  # the store says what is wrong


def test_a_node_on_an_unusable_directory_is_one_line_naming_the_option(
        tmp_path: Path) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    with pytest.raises(LayoutError) as err:
        check_layout(not_a_dir, 2, "n", not_a_dir / "journal")
    assert "--data" in str(err.value) and str(not_a_dir) in str(err.value)


_HOLD_RUN_DIR = """
import sys
from pathlib import Path
from meshmq.node.layout import make_run_dir
run, temporary = make_run_dir(Path(sys.argv[1]))
assert temporary
print(run, flush=True)
sys.stdin.read()
"""


def _holder(data: Path) -> tuple[subprocess.Popen[str], Path]:
    """A process that made the temporary run directory of ``data`` and holds it."""
    proc = subprocess.Popen([sys.executable, "-c", _HOLD_RUN_DIR, str(data)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    return proc, Path(proc.stdout.readline().strip())


def test_a_killed_supervisors_temporary_run_directory_goes_at_the_next_start(
        tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 120)
    other = tmp_path / ("e" * 120)
    killed, stale = _holder(deep)
    live, running = _holder(deep)  # the other node of a pair, still up
    elsewhere, theirs = _holder(other)  # another data directory's, its node gone
    try:
        killed.send_signal(signal.SIGKILL)
        killed.wait(10)
        elsewhere.send_signal(signal.SIGKILL)
        elsewhere.wait(10)
        assert stale.exists() and running.exists() and theirs.exists()
        run, temporary = make_run_dir(deep)
        try:
            assert temporary and run not in (stale, running)
            assert not stale.exists()  # its lock went with the killed process
            assert running.exists() and theirs.exists()
            assert stat.S_IMODE(run.stat().st_mode) == 0o700
        finally:
            release_run_dir(run)
        assert not run.exists()
    finally:
        for proc in (killed, live, elsewhere):
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.close()  # its end of input: it exits
            proc.wait(10)
            proc.stdout.close()
        shutil.rmtree(theirs, ignore_errors=True)
        shutil.rmtree(running, ignore_errors=True)
