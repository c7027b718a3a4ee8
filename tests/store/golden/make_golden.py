"""Generate the golden journal files under tests/store/golden/ (committed).

    .venv/bin/python tests/store/golden/make_golden.py [output directory]

``v2/basic`` is a valid multi-segment journal written by ``JournalStore`` from the
fixed batches in ``batches()``; the other ``v2/*`` directories are byte-level damaged
copies of it. ``v2/expected.json`` is the state a reader must recover (all batches, and
all but the last for the torn/bad-CRC tails). ``codec_v1.bin`` pins the message codec.
The output is deterministic: the test suite regenerates it and compares bytes, so a
format change cannot slip in without a FORMAT_VERSION decision and new golden files.

``v1/`` holds the files of format version 1 (written by the generator of that version,
from the same batches minus the dispatch marks, which version 1 did not have). They are
no longer generated: they stay committed as they were, and the tests check that they
still read to ``v1/expected.json``.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import struct
import sys
import zlib
from pathlib import Path
from typing import Any

from meshmq.core.destinations import queue, topic
from meshmq.core.message import Message
from meshmq.core.message_codec import encode_message
from meshmq.store.base import (
    AddMessage,
    DropKey,
    DurableSubscription,
    MarkDispatched,
    PutDurableSubscription,
    RemoveRef,
    SetDeliveryCount,
    Store,
    StoreOp,
)
from meshmq.store.journal import JournalStore
from meshmq.store.journal import format as fmt

HERE = Path(__file__).parent
KEYS = ("queue://orders", "queue://audit", "durable://c1:prices", "durable://c1:old")
SEGMENT_SIZE = 1024


def _message(n: int) -> Message:
    return Message(message_id=f"ID:golden-{n}", destination=queue("orders"),
                   body=f"golden body {n} ".encode() * 4, properties={"n": n, "kind": "g"},
                   persistent=True, priority=n % 10, timestamp=1_700_000_000_000 + n)


def codec_message() -> Message:
    return Message(
        message_id="ID:codec-1", destination=topic("prices.eu"), body=b"\x00\x01payload\xff",
        properties={"s": "välue", "i": -42, "big": 2**70, "f": 2.5, "t": True, "no": False,
                    "none": None},
        persistent=True, priority=7, timestamp=1_700_000_000_123, expiration=1_800_000_000_000,
        correlation_id="corr", reply_to=queue("replies"), type="order", group_id="g1",
        group_seq=3, producer_id="ID:producer-1", broker_path=("a", "b"),
        original_destination=queue("orig"), user_id="alice", content_type="text/plain")


def batches() -> list[list[StoreOp]]:
    orders, audit, prices, old = KEYS
    out: list[list[StoreOp]] = [
        [PutDurableSubscription(DurableSubscription(prices, "c1", "prices", "topic://prices.>",
                                                    "n > 2", True, 1000)),
         PutDurableSubscription(DurableSubscription(old, "c1", "old", "topic://old", None,
                                                    False, 900))],
    ]
    for n in range(1, 25):
        refs = [(orders, n)]
        if n % 3 == 0:
            refs.append((prices, n // 3))
        if n % 4 == 0:
            refs.append((audit, n))
        out.append([AddMessage(_message(n), tuple(refs))])
    out.append([RemoveRef(orders, n) for n in range(1, 9)])
    out.append([SetDeliveryCount(orders, 10, 2), SetDeliveryCount(prices, 4, 1),
                MarkDispatched(orders, 40), MarkDispatched(prices, 6)])
    out.append([DropKey(old), RemoveRef(audit, 4), RemoveRef(orders, 15)])
    out.append([AddMessage(_message(99), ((audit, 100),)), RemoveRef(orders, 24)])
    return out


def state(store: Store) -> dict[str, Any]:
    """A JSON-able view of everything a reader must recover."""
    keys = {}
    for key in KEYS:
        info = store.key_info(key)
        keys[key] = {
            "info": [info.count, info.bytes, info.first_seq, info.last_seq],
            "entries": [[e.seq, e.message.message_id, e.message.body.hex(), e.delivery_count,
                         e.message.priority, sorted(e.message.properties.items())]
                        for e in store.load(key, 0, 1 << 30)],
        }
    return keys


def dispatched(store: Store) -> dict[str, int]:
    """The dispatch marks a reader must recover (format version 2 on)."""
    return {key: store.key_info(key).dispatched for key in KEYS}


def subs_view(subs: list[DurableSubscription]) -> list[list[Any]]:
    return sorted([s.key, s.client_id, s.subscription_name, s.destination, s.selector,
                   s.no_local, s.created_ms] for s in subs)


async def _write_journal(directory: Path, todo: list[list[StoreOp]]) -> None:
    store = JournalStore(directory, segment_size=SEGMENT_SIZE, fsync=False,
                         compact_live_ratio=0.0)
    store.open()
    for batch in todo:
        store.write(batch)
    await store.sync()
    await store.close()
    (directory / "lock").unlink()


def _segments(directory: Path) -> list[Path]:
    return sorted(directory.glob("seg-*.log"))


def _last_record_offset(path: Path) -> int:
    return fmt.scan_records(path.read_bytes()).records[-1][0]


def _flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x5A
    path.write_bytes(bytes(data))


def generate(out: Path) -> None:
    v2 = out / "v2"
    if v2.exists():
        shutil.rmtree(v2)
    basic = v2 / "basic"
    asyncio.run(_write_journal(basic, batches()))
    segs = _segments(basic)
    assert len(segs) >= 3, "golden journal should span several segments"
    last = segs[-1]
    tail_off = _last_record_offset(last)

    def variant(name: str) -> Path:
        d = v2 / name
        shutil.copytree(basic, d)
        return d

    d = variant("torn_tail")  # cut inside the last record: recover all but the last batch
    (d / last.name).write_bytes(last.read_bytes()[:tail_off + 13])
    d = variant("bad_crc_tail")  # damaged last record: same outcome
    _flip(d / last.name, tail_off + 20)
    d = variant("bad_crc_middle")  # damaged record in the first segment: refuse to open
    _flip(d / segs[0].name, fmt.HEADER_SIZE + 30)
    d = variant("bad_magic")
    _flip(d / segs[0].name, 0)
    d = variant("future_version")
    for seg in _segments(d):
        data = bytearray(seg.read_bytes())
        magic, _version, flags, seg_id = fmt.SEGMENT_HEADER.unpack_from(data, 0)
        head = fmt.SEGMENT_HEADER.pack(magic, fmt.FORMAT_VERSION + 1, flags, seg_id)
        data[:fmt.HEADER_SIZE] = head + struct.pack("<I", zlib.crc32(head))
        seg.write_bytes(bytes(data))
    d = variant("torn_new_segment")  # crash while creating the next segment file
    (d / fmt.segment_name(len(segs) + 1)).write_bytes(fmt.pack_segment_header(len(segs) + 1)[:9])

    from meshmq.store.memory import MemoryStore

    expected = {}
    for name, todo in (("all", batches()), ("all_but_last", batches()[:-1])):
        model = MemoryStore()
        model.open()
        for batch in todo:
            model.write(batch)
        expected[name] = {"keys": state(model), "dispatched": dispatched(model),
                          "subscriptions": subs_view(model.durable_subscriptions())}
    (v2 / "expected.json").write_text(json.dumps(expected, indent=1, sort_keys=True) + "\n")
    (out / "codec_v1.bin").write_bytes(encode_message(codec_message()))


if __name__ == "__main__":
    generate(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE)
