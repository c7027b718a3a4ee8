"""Message trace: lifecycle events of every message, as data.

The broker core records events into a ``Tracer`` (an in-memory list; no I/O on the
hot path). Writing them is the edge's job: the runtime hands the list to a sink in
``transport/trace_files.py`` once per pump, and that module writes the rolling files
in the versioned schema defined here and documented in ``docs/pipeline.md``.

What an audit can know after a crash depends on what reached the OS before it:

* ``heartbeat`` events (every ``heartbeat_interval_ms``, each one flushed) bound the
  crash: the broker died less than an interval after its last heartbeat; the next
  start's ``broker_started`` names the previous run's boot and last heartbeat
  (``start_reason``).
* In ``exact`` mode the runtime flushes the trace before anything that confirms a
  traced message leaves the broker (a delivery, a receipt, a bridge ack), so nothing
  a client or peer was told about is missing from the trace after a crash;
  ``broker_started`` says ``exact=1`` so the audit can rely on it.

Sampling is per message (a CRC32 of the message id), so every broker of a network
keeps or skips the same messages and sampled journeys stay complete.
"""

from __future__ import annotations

import json
import logging
import re
import time
import zlib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

if TYPE_CHECKING:
    from meshmq.core.destinations import Destination
    from meshmq.core.message import Message

log = logging.getLogger("meshmq.trace")

SCHEMA_VERSION = 1

# Event kinds (the ``event`` column).
RECEIVED = "received"  # accepted from a producer connection
STORED = "stored"  # written to the message store (persistent messages)
FORWARDED = "forwarded"  # sent on over a network bridge (peer = the receiving broker)
RECEIVED_FROM_BRIDGE = "received_from_bridge"  # arrived over a bridge (peer = the sender)
DISPATCHED = "dispatched"  # handed to a consumer (delivery_count says which attempt)
ACKED = "acked"  # consumed: the consumer acknowledged it
DELIVERED = "delivered"  # dispatched to an auto-ack consumer: dispatched and acked at once
REDELIVERED = "redelivered"  # returned to its queue for another attempt (reason says why)
EXPIRED = "expired"
DLQ = "dlq"  # moved to a dead-letter queue (reason: cause and DLQ name)
DROPPED = "dropped"  # discarded (reason says why)
DENIED = "denied"  # refused by the authorization map (reason: the refusal's text)
RECOVERED = "recovered"  # found in the store when the broker started
BROKER_STARTED = "broker_started"  # message fields are empty
BROKER_STOPPED = "broker_stopped"  # clean shutdown; a crash leaves no such event
HEARTBEAT = "heartbeat"  # the broker was alive (and its trace flushed) at ``ts``

EVENT_KINDS = (RECEIVED, STORED, FORWARDED, RECEIVED_FROM_BRIDGE, DISPATCHED, ACKED, DELIVERED,
               REDELIVERED, EXPIRED, DLQ, DROPPED, DENIED, RECOVERED, BROKER_STARTED,
               BROKER_STOPPED, HEARTBEAT)

# The schema: (column, Spark SQL type, Arrow type name, meaning). Readers use this
# order; the JSON lines carry the same keys (absent or null = not applicable).
COLUMNS: tuple[tuple[str, str, str, str], ...] = (
    ("v", "INT", "int32", "schema version (1)"),
    ("ts", "BIGINT", "int64", "when the event happened, microseconds since the epoch"),
    ("event", "STRING", "string", "event kind"),
    ("broker", "STRING", "string", "broker that recorded the event"),
    ("boot", "STRING", "string", "that broker's run (changes at every start)"),
    ("message_id", "STRING", "string", "message id (empty for broker events)"),
    ("dedup_id", "STRING", "string", "producer's dedup-id header, if any"),
    ("destination", "STRING", "string", "destination URI, e.g. queue://orders"),
    ("msg_ts", "BIGINT", "int64", "message timestamp set at the first broker, ms"),
    ("size", "INT", "int32", "body size in bytes"),
    ("persistent", "BOOLEAN", "bool", "persistent message"),
    ("path", "ARRAY<STRING>", "list<string>", "brokers the message crossed before this one"),
    ("delivery_count", "INT", "int32", "delivery attempt (dispatched, delivered, acked, "
     "redelivered)"),
    ("consumer", "STRING", "string", "consumer id (dispatched, delivered, acked, redelivered)"),
    ("peer", "STRING", "string", "other broker of a forwarded/received_from_bridge"),
    ("connector", "STRING", "string", "network connector name"),
    ("reason", "STRING", "string", "why (dropped, dlq, redelivered, expired)"),
)
COLUMN_NAMES = tuple(c[0] for c in COLUMNS)
SPARK_DDL = ", ".join(f"{name} {sql}" for name, sql, _, _ in COLUMNS)

# One recorded event: (ts in ns, kind, message, destination, delivery_count, consumer, peer,
# connector, reason). The message object itself is kept (it is immutable once routed)
# and its columns are read only when the sink encodes the batch, so recording an event
# costs one tuple. ``message`` is None for broker events; ``destination`` None means
# the message's own.
Event = tuple[int, str, "Message | None", "Destination | None", int, str | None, str | None,
              str | None, str | None]

SAMPLE_SCALE = 1 << 20
DEDUP_HEADER = "dedup-id"


def sampled(message_id: str, rate: float) -> bool:
    """Whether ``message_id`` is traced at ``rate`` (0..1); the same on every broker."""
    if rate >= 1.0:
        return True
    if rate <= 0.0:
        return False
    return zlib.crc32(message_id.encode("utf-8", "surrogatepass")) % SAMPLE_SCALE \
        < int(rate * SAMPLE_SCALE)


class Tracer:
    """Collects trace events in memory; the runtime drains them with ``take()``.

    Everything runs on the event-loop thread. The hooks for network bridges are
    ``forwarded`` and ``received_from_bridge`` (also reachable through
    ``Broker.trace_forwarded`` / ``Broker.trace_received_from_bridge``).
    """

    __slots__ = ("_clock", "broker", "events", "sample_rate")

    def __init__(self, broker: str, *, sample_rate: float = 1.0,
                 clock_ns: Callable[[], int] | None = None) -> None:
        if not 0.0 <= sample_rate <= 1.0:
            raise ValueError(f"sample_rate must be between 0 and 1, got {sample_rate}")
        self.broker = broker
        self.sample_rate = sample_rate
        self._clock = clock_ns or time.time_ns  # ns: no arithmetic on the hot path
        self.events: list[Event] = []

    def message(self, kind: str, msg: Message, dest: Destination | None = None, *,
                delivery_count: int = 0, consumer: str | None = None,
                peer: str | None = None, connector: str | None = None,
                reason: str | None = None) -> None:
        """Record ``kind`` for ``msg`` (at ``dest``, default: the message's own)."""
        if self.sample_rate < 1.0 and not sampled(msg.message_id, self.sample_rate):
            return
        self.events.append((self._clock(), kind, msg, dest, delivery_count, consumer, peer,
                            connector, reason))

    def hot(self, kind: str, msg: Message, dest: Destination | None, delivery_count: int,
            consumer: str | None) -> None:
        """``message`` for the per-message hot paths (positional, no keywords)."""
        if self.sample_rate < 1.0 and not sampled(msg.message_id, self.sample_rate):
            return
        self.events.append((self._clock(), kind, msg, dest, delivery_count, consumer, None,
                            None, None))

    def broker_event(self, kind: str, reason: str | None = None) -> None:
        self.events.append((self._clock(), kind, None, None, 0, None, None, None, reason))

    def denied(self, dest: Destination, reason: str, msg: Message | None = None) -> None:
        """A send (``msg``) or subscription refused on ``dest`` by the authorization map."""
        if msg is not None:
            self.message(DENIED, msg, dest, reason=reason)
        else:
            self.events.append((self._clock(), DENIED, None, dest, 0, None, None, None,
                                reason))

    # -- hooks for network bridges ---------------------------------------------
    def forwarded(self, msg: Message, *, to_broker: str, connector: str) -> None:
        """``msg`` was handed to the bridge ``connector`` towards ``to_broker``."""
        self.message(FORWARDED, msg, peer=to_broker, connector=connector)

    def received_from_bridge(self, msg: Message, *, from_broker: str, connector: str) -> None:
        """``msg`` arrived from ``from_broker`` over ``connector`` (before routing)."""
        self.message(RECEIVED_FROM_BRIDGE, msg, peer=from_broker, connector=connector)

    def take(self) -> list[Event]:
        events, self.events = self.events, []
        return events


# ---------------------------------------------------------------------------------
# Encoding

_PLAIN = re.compile(r'[^"\\\x00-\x1f\x7f-\uffff]*\Z')


def _js(text: str) -> str:
    """``text`` as a JSON string literal (fast path for plain ASCII)."""
    if _PLAIN.match(text):
        return f'"{text}"'
    return json.dumps(text)


def _opt(text: str | None) -> str:
    return "null" if text is None else _js(text)


def _message_part(msg: Message) -> str:
    """The JSON members that are the same in every event of ``msg``."""
    part = (f'"message_id":{_js(msg.message_id)},"msg_ts":{msg.timestamp},'
            f'"size":{len(msg.body)},"persistent":{"true" if msg.persistent else "false"}')
    dedup = msg.properties.get(DEDUP_HEADER) if msg.properties else None
    if dedup is not None:
        part += f',"dedup_id":{_js(str(dedup))}'
    if msg.broker_path:
        part += ',"path":[' + ",".join(map(_js, msg.broker_path)) + "]"
    return part


class JsonEncoder:
    """Encodes events as JSON lines; caches the parts that repeat between events (a
    message's fields, destination names), which is most of the cost."""

    def __init__(self, broker: str, boot: str) -> None:
        self.head = f'{{"v":{SCHEMA_VERSION},"broker":{_js(broker)},"boot":{_js(boot)},"ts":'
        self._dests: dict[Destination, str] = {}
        self._tails: dict[tuple[int, str | None, str | None, str | None, str | None],
                          str] = {}

    def _dest(self, dest: Destination) -> str:
        text = self._dests.get(dest)
        if text is None:
            if len(self._dests) > 10_000:
                self._dests.clear()
            text = self._dests[dest] = f',"destination":{_js(str(dest))}'
        return text

    def _tail(self, count: int, consumer: str | None, peer: str | None,
              connector: str | None, reason: str | None) -> str:
        key = (count, consumer, peer, connector, reason)
        tail = self._tails.get(key)
        if tail is None:
            tail = ""
            if count:
                tail += f',"delivery_count":{count}'
            if consumer is not None:
                tail += f',"consumer":{_js(consumer)}'
            if peer is not None:
                tail += f',"peer":{_js(peer)}'
            if connector is not None:
                tail += f',"connector":{_js(connector)}'
            if reason is not None:
                tail += f',"reason":{_js(reason)}'
            if len(self._tails) > 10_000:
                self._tails.clear()
            tail = self._tails[key] = tail + "}\n"
        return tail

    def encode(self, events: Sequence[Event]) -> str:
        head = self.head
        parts: dict[Message, str] = {}  # by identity, for this batch
        dests = self._dests
        tail_of = self._tail
        out: list[str] = []
        append = out.append
        for ts, kind, msg, dest, count, consumer, peer, connector, reason in events:
            if msg is None:
                part = '"message_id":"","destination":' + (
                    '""' if dest is None else _js(str(dest)))
            else:
                cached = parts.get(msg)
                if cached is None:
                    cached = parts[msg] = _message_part(msg)
                d = dest if dest is not None else msg.destination
                dpart = dests.get(d)
                if dpart is None:
                    dpart = self._dest(d)
                part = cached + dpart
            if count or consumer is not None or reason is not None or peer is not None \
                    or connector is not None:
                tail = tail_of(count, consumer, peer, connector, reason)
            else:
                tail = "}\n"
            append(f'{head}{ts // 1000},"event":"{kind}",{part}{tail}')
        return "".join(out)


def encode_jsonl(events: Sequence[Event], broker: str, boot: str) -> str:
    """Events as JSON lines (one object per line, each ending in a newline)."""
    return JsonEncoder(broker, boot).encode(events)


def to_rows(events: Sequence[Event], broker: str, boot: str) -> list[dict[str, Any]]:
    """Events as full rows (every column, in COLUMNS order), as a reader sees them."""
    rows = []
    for ts, kind, msg, dest, count, consumer, peer, connector, reason in events:
        row: dict[str, Any] = {"v": SCHEMA_VERSION, "ts": ts // 1000, "event": kind,
                               "broker": broker, "boot": boot, "message_id": "", "dedup_id": None,
                               "destination": "" if dest is None else str(dest),
                               "msg_ts": None, "size": None,
                               "persistent": None, "path": []}
        if msg is not None:
            dedup = msg.properties.get(DEDUP_HEADER)
            row.update(message_id=msg.message_id,
                       dedup_id=None if dedup is None else str(dedup),
                       destination=str(dest if dest is not None else msg.destination),
                       msg_ts=msg.timestamp, size=len(msg.body), persistent=msg.persistent,
                       path=list(msg.broker_path))
        row.update(delivery_count=count or None, consumer=consumer, peer=peer,
                   connector=connector, reason=reason)
        rows.append(row)
    return rows


def decode_jsonl_line(line: str) -> dict[str, Any]:
    """One JSON line back into a full row (every column present) — for tests and tools."""
    raw = json.loads(line)
    if not isinstance(raw, dict) or raw.get("v") != SCHEMA_VERSION:
        raise ValueError(f"not a version {SCHEMA_VERSION} trace event: {line[:80]!r}")
    row: dict[str, Any] = {name: raw.get(name) for name in COLUMN_NAMES}
    if row["path"] is None:
        row["path"] = []
    return row


# ---------------------------------------------------------------------------------
def start_reason(*, heartbeat_ms: int, exact: bool, previous: tuple[str, int] | None,
                 lease: tuple[str, str | None] | None = None) -> str:
    """The ``reason`` of ``broker_started``: how this run traces (``heartbeat_ms``,
    ``exact``), after an earlier run its boot and last heartbeat (microseconds) and, for
    a broker of a master/slave pair, its lease holder id and the holder it took the lease
    from (``took_over``: that broker's run ended here, whatever its name). Holder ids are
    percent-encoded: the fields are separated by spaces."""
    text = f"heartbeat_ms={heartbeat_ms} exact={int(exact)}"
    if previous is not None:
        text += f" previous_boot={previous[0]} last_heartbeat={previous[1]}"
    if lease is not None:
        text += f" holder={quote(lease[0], safe='')}"
        if lease[1] is not None:
            text += f" took_over={quote(lease[1], safe='')}"
    return text

