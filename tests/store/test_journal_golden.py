"""Golden journal files: the committed bytes must keep reading to the committed state,
damaged copies must behave as docs/store-format.md says, and the writer must still
produce exactly those bytes (no silent format change). Every format version's files
stay committed and readable (``v1``: before dispatch marks); only the current one
(``v2``) is regenerated."""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
from pathlib import Path
from typing import Any

import pytest

from meshmq.errors import CorruptStoreError
from meshmq.store.base import MarkDispatched
from meshmq.store.journal import JournalStore
from meshmq.store.journal import format as fmt
from tests.store.golden.make_golden import dispatched, generate, state, subs_view

GOLDEN = Path(__file__).parent / "golden"
CURRENT = f"v{fmt.FORMAT_VERSION}"
VERSIONS = ["v1", CURRENT]  # every format version a reader must still accept
EXPECTED: dict[str, dict[str, Any]] = {
    v: json.loads((GOLDEN / v / "expected.json").read_text()) for v in VERSIONS}

versions = pytest.mark.parametrize("version", VERSIONS)


def open_copy(version: str, name: str, tmp_path: Path) -> tuple[JournalStore, Any]:
    d = tmp_path / name
    shutil.copytree(GOLDEN / version / name, d)
    store = JournalStore(d, segment_size=1024)
    return store, store.open()


def check(store: JournalStore, recovery: Any, expected: dict[str, Any]) -> None:
    assert json.loads(json.dumps(state(store))) == expected["keys"]
    # Version 1 had no dispatch marks: its keys recover with none.
    assert dispatched(store) == expected.get("dispatched", dict.fromkeys(expected["keys"], 0))
    assert json.loads(json.dumps(subs_view(recovery.durable_subscriptions))) == \
        expected["subscriptions"]
    for key, info in recovery.keys.items():
        assert [info.count, info.bytes, info.first_seq, info.last_seq] == \
            expected["keys"][key]["info"]


def close(store: JournalStore) -> None:
    asyncio.run(store.close())


@versions
def test_basic_reads_to_expected_state(version: str, tmp_path: Path) -> None:
    store, rec = open_copy(version, "basic", tmp_path)
    try:
        check(store, rec, EXPECTED[version]["all"])
    finally:
        close(store)


@versions
@pytest.mark.parametrize("name", ["torn_tail", "bad_crc_tail"])
def test_damaged_tail_drops_only_the_last_batch(version: str, name: str, tmp_path: Path,
                                                caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="meshmq.store")
    store, rec = open_copy(version, name, tmp_path)
    try:
        check(store, rec, EXPECTED[version]["all_but_last"])
    finally:
        close(store)
    assert any("torn tail" in r.getMessage() for r in caplog.records)
    # The file was cut back to the last intact record: a second open is clean.
    caplog.clear()
    store = JournalStore(tmp_path / name, segment_size=1024)
    check(store, store.open(), EXPECTED[version]["all_but_last"])
    close(store)
    assert not caplog.records


@versions
def test_torn_new_segment_is_removed(version: str, tmp_path: Path) -> None:
    store, rec = open_copy(version, "torn_new_segment", tmp_path)
    try:
        check(store, rec, EXPECTED[version]["all"])
    finally:
        close(store)
    assert not (tmp_path / "torn_new_segment" / "seg-0000000000000006.log").exists()


@pytest.mark.parametrize(("version", "name", "match"), [
    ("v1", "bad_crc_middle", r"seg-0000000000000001\.log: record checksum mismatch at offset 24"),
    (CURRENT, "bad_crc_middle",
     r"seg-0000000000000001\.log: record checksum mismatch at offset 24"),
    (CURRENT, "future_version",
     rf"format version {fmt.FORMAT_VERSION + 1} is newer than this broker supports"),
])
def test_damage_outside_the_tail_refuses_to_open(version: str, name: str, match: str,
                                                 tmp_path: Path) -> None:
    d = tmp_path / name
    shutil.copytree(GOLDEN / version / name, d)
    before = {p.name: p.read_bytes() for p in d.iterdir()}
    with pytest.raises(CorruptStoreError, match=match):
        JournalStore(d).open()
    # Nothing was "repaired": the operator gets the files exactly as they were.
    after = {p.name: p.read_bytes() for p in d.iterdir() if p.name != "lock"}
    assert after == before
    JournalStore(d)  # and the directory lock was released
    store = JournalStore(d)
    with pytest.raises(CorruptStoreError):
        store.open()


@versions
def test_refusal_names_the_flag_that_accepts_the_loss(version: str, tmp_path: Path) -> None:
    d = tmp_path / "bad_crc_middle"
    shutil.copytree(GOLDEN / version / "bad_crc_middle", d)
    with pytest.raises(CorruptStoreError, match="--accept-data-loss") as info:
        JournalStore(d).open()
    assert "recovering its first 0 intact records" in str(info.value)
    original = (d / "seg-0000000000000001.log").read_bytes()
    store = JournalStore(d, accept_data_loss=True)
    store.open()
    close(store)
    # The damaged file is kept aside byte for byte, never deleted.
    assert (d / "seg-0000000000000001.log.damaged").read_bytes() == original
    # With the flag spent, the next start is clean.
    store = JournalStore(d)
    store.open()
    close(store)


@versions
def test_damaged_header_with_intact_records_recovers_everything(
        version: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="meshmq.store")
    original = (GOLDEN / version / "bad_magic" / "seg-0000000000000001.log").read_bytes()
    store, rec = open_copy(version, "bad_magic", tmp_path)
    try:
        check(store, rec, EXPECTED[version]["all"])
    finally:
        close(store)
    d = tmp_path / "bad_magic"
    assert (d / "seg-0000000000000001.log.damaged").read_bytes() == original
    assert "kept the original as seg-0000000000000001.log.damaged" in caplog.text
    caplog.clear()
    store = JournalStore(d, segment_size=1024)
    check(store, store.open(), EXPECTED[version]["all"])
    close(store)
    assert not caplog.records


def test_version_1_segments_read_on_beside_newer_ones(tmp_path: Path) -> None:
    """An upgraded broker appends version-2 segments to a version-1 journal."""
    store, _ = open_copy("v1", "basic", tmp_path)
    try:
        store.write([MarkDispatched("queue://orders", 30)])
        asyncio.run(store.sync())  # (store.sync needs a running loop)
    finally:
        close(store)
    store = JournalStore(tmp_path / "basic", segment_size=1024)
    try:
        store.open()
        assert json.loads(json.dumps(state(store))) == EXPECTED["v1"]["all"]["keys"]
        assert store.key_info("queue://orders").dispatched == 30
    finally:
        close(store)


def test_generator_reproduces_committed_bytes(tmp_path: Path) -> None:
    generate(tmp_path)
    # Older versions' files are kept as they were, not generated any more.
    committed = sorted(p.relative_to(GOLDEN) for p in GOLDEN.rglob("*")
                       if p.is_file() and p.suffix != ".py" and "__pycache__" not in p.parts
                       and p.relative_to(GOLDEN).parts[0] in (CURRENT, "codec_v1.bin"))
    produced = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    assert produced == committed
    for rel in committed:
        assert (tmp_path / rel).read_bytes() == (GOLDEN / rel).read_bytes(), (
            f"{rel} changed: the on-disk format moved. Bump FORMAT_VERSION/CODEC_VERSION, keep "
            f"reading the old version, and regenerate the golden files on purpose.")
