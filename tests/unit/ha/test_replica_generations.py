"""A replicated node's files (``meshmq.ha.replica_files``): journal generations switched
by a pointer file, a plain journal adopted as the first generation, atomic writes."""

from __future__ import annotations

from pathlib import Path

import pytest

from meshmq.errors import StoreError
from meshmq.ha.replica_files import CURRENT_FILE, Generations, write_atomic
from meshmq.store.journal.format import segment_name


def test_a_new_node_starts_on_the_first_generation_without_a_pointer(tmp_path: Path) -> None:
    gens = Generations(tmp_path / "store")
    assert gens.current() == tmp_path / "store" / "gen-1"
    assert not (tmp_path / "store" / CURRENT_FILE).exists()


def test_a_plain_journal_moves_into_the_first_generation(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    for i in (1, 2):
        (tmp_path / segment_name(i)).write_bytes(b"segment %d" % i)
    (tmp_path / "notes.txt").write_text("not a segment")
    assert Generations(tmp_path).current() == tmp_path / "gen-1"
    assert sorted(p.name for p in (tmp_path / "gen-1").iterdir()) == [
        segment_name(1), segment_name(2)]
    assert (tmp_path / "gen-1" / segment_name(2)).read_bytes() == b"segment 2"
    assert (tmp_path / "notes.txt").exists()
    assert (tmp_path / CURRENT_FILE).read_text() == "gen-1"
    assert "moved the 2 journal segments" in caplog.text


@pytest.mark.parametrize("pointer", ["journal", "gen-", "gen-2x", "../gen-1", "gen--1"])
def test_a_pointer_that_names_no_generation_is_refused(tmp_path: Path, pointer: str) -> None:
    (tmp_path / CURRENT_FILE).write_text(pointer)
    with pytest.raises(StoreError, match="not a journal generation name"):
        Generations(tmp_path).current()


def test_a_fresh_generation_is_the_next_number_and_clears_an_interrupted_copy(
        tmp_path: Path) -> None:
    gens = Generations(tmp_path)
    (tmp_path / CURRENT_FILE).write_text("gen-4\n")
    left = tmp_path / "gen-5"
    left.mkdir()
    (left / "half-copied").write_bytes(b"x")
    assert gens.fresh() == left
    assert not left.exists()


def test_switching_moves_the_pointer_and_removes_the_old_generation(tmp_path: Path) -> None:
    gens = Generations(tmp_path)
    old = gens.current()
    old.mkdir()
    (old / segment_name(1)).write_bytes(b"old")
    new = gens.fresh()
    new.mkdir()
    gens.switch(new)
    assert gens.current() == new
    assert (tmp_path / CURRENT_FILE).read_text() == "gen-2"
    assert not old.exists() and new.is_dir()


def test_switching_to_the_current_generation_keeps_it(tmp_path: Path) -> None:
    gens = Generations(tmp_path)
    current = gens.current()
    current.mkdir()
    gens.switch(current)
    assert current.is_dir() and gens.current() == current


def test_an_atomic_write_replaces_the_file_and_leaves_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "repl-state.json"
    target.write_bytes(b"old")
    write_atomic(target, b'{"term": 3}')
    assert target.read_bytes() == b'{"term": 3}'
    assert [p.name for p in tmp_path.iterdir()] == ["repl-state.json"]
