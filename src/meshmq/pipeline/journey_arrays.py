"""The journeys of one partition of message events, computed with numpy and pyarrow.

This is what runs in Spark's Python workers for the Arrow path of the audit
(``meshmq.pipeline.arrow_journeys``): the JVM only scans the trace and hash-partitions
the message events by message id, so every event of a message reaches the same call;
here the events of the partition are grouped per message and every column and verdict
of ``audit.journey_columns`` is computed with whole-array operations, without the
generated JVM code (and its JIT compilation) of the per-message aggregation.

The rules are those of ``meshmq.pipeline.audit`` (the reference), rewritten for arrays;
``tests/pipeline/test_audit_arrow.py`` compares the two row for row. The module imports
numpy and pyarrow only and takes everything it needs as plain data (``Plan``), so it
can be pickled by value to executors that do not have meshmq installed.

How a per-message aggregate is computed: the rows are sorted by message (a dictionary
code of the id), each message is a contiguous segment, and ``np.minimum.reduceat``
and friends reduce each segment. ``min_by``/``max_by`` pick the row whose keys are
smallest, key after key (each tie narrowed by the next key), then the first row left.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

_MAX = np.iinfo(np.int64).max
_MIN = np.iinfo(np.int64).min

# The event kinds by name (meshmq.core.trace); codes are positions in Plan.kinds.
RECEIVED, STORED, FORWARDED = "received", "stored", "forwarded"
RECEIVED_FROM_BRIDGE, DISPATCHED, ACKED = "received_from_bridge", "dispatched", "acked"
DELIVERED, REDELIVERED, EXPIRED, DLQ = "delivered", "redelivered", "expired", "dlq"
DROPPED, DENIED, RECOVERED = "dropped", "denied", "recovered"

# The input columns (the trace's, projected) and the output schema: the journeys'.
INPUT_COLUMNS = ("message_id", "ts", "event", "broker", "boot", "destination", "dedup_id",
                 "msg_ts", "size", "persistent", "delivery_count", "consumer", "peer",
                 "reason")
JOURNEYS_DDL = (
    "message_id string, dedup_id string, origin_broker string, destination string, "
    "persistent boolean, size int, first_ts bigint, received_ts bigint, path array<string>, "
    "path_text string, hops bigint, deliveries bigint, possible_deliveries bigint, "
    "acks bigint, redeliveries bigint, recoveries bigint, first_dispatch_ts bigint, "
    "first_ack_ts bigint, latency_ms double, ack_latency_ms double, consumed_on string, "
    "e2e_latency_ms double, last_ts bigint, last_event string, last_broker string, "
    "last_boot string, last_destination string, drop_reason string, "
    "holder_restarted_ts bigint, status string, reason string, delivered_by array<string>")
SCHEMA = pa.schema([
    ("message_id", pa.string()), ("dedup_id", pa.string()), ("origin_broker", pa.string()),
    ("destination", pa.string()), ("persistent", pa.bool_()), ("size", pa.int32()),
    ("first_ts", pa.int64()), ("received_ts", pa.int64()), ("path", pa.list_(pa.string())),
    ("path_text", pa.string()), ("hops", pa.int64()), ("deliveries", pa.int64()),
    ("possible_deliveries", pa.int64()), ("acks", pa.int64()), ("redeliveries", pa.int64()),
    ("recoveries", pa.int64()), ("first_dispatch_ts", pa.int64()),
    ("first_ack_ts", pa.int64()), ("latency_ms", pa.float64()),
    ("ack_latency_ms", pa.float64()), ("consumed_on", pa.string()),
    ("e2e_latency_ms", pa.float64()), ("last_ts", pa.int64()), ("last_event", pa.string()),
    ("last_broker", pa.string()), ("last_boot", pa.string()),
    ("last_destination", pa.string()), ("drop_reason", pa.string()),
    ("holder_restarted_ts", pa.int64()), ("status", pa.string()), ("reason", pa.string()),
    ("delivered_by", pa.list_(pa.string()))])


@dataclasses.dataclass(frozen=True)
class Plan:
    """What the workers need besides the events, from the driver's catalog pass.

    ``kinds``/``ranks``: event kinds and their lifecycle rank (``audit.RANK``);
    ``brokers``: every broker and peer name, sorted (codes order as names do);
    ``destinations``: sorted; ``runs``: ``boots``' rows (broker, boot, started_ts,
    next_started_ts, next_broker, clean_stop, exact); ``copies``: per dedup id, the
    first message id carrying it that reached a consumer (``audit.delivered_copies``)."""

    kinds: tuple[str, ...]
    ranks: tuple[int, ...]
    brokers: tuple[str, ...]
    destinations: tuple[str, ...]
    runs: tuple[tuple[Any, ...], ...]
    copies: dict[str, str]
    # For the stuck messages' candidates: "now" and the threshold (``audit.stuck``).
    now_ts: int = 0
    stuck_after_ms: int = 60_000


class _Groups:
    """Rows sorted by message; segment reductions over them."""

    def __init__(self, codes: np.ndarray, n_groups: int) -> None:
        self.order = np.argsort(codes, kind="stable")
        sorted_codes = codes[self.order]
        self.n = n_groups
        self.starts = np.flatnonzero(np.r_[True, sorted_codes[1:] != sorted_codes[:-1]])
        self.counts = np.diff(np.r_[self.starts, len(codes)])
        self.of_row = np.repeat(np.arange(n_groups), self.counts)
        self.index = np.arange(len(codes))

    def min(self, values: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
        """Per group, the minimum of ``values`` where ``mask``; ``_MAX`` when none."""
        v = values if mask is None else np.where(mask, values, _MAX)
        return np.minimum.reduceat(v.astype(np.int64, copy=False), self.starts)

    def max(self, values: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
        v = values if mask is None else np.where(mask, values, _MIN)
        return np.maximum.reduceat(v.astype(np.int64, copy=False), self.starts)

    def count(self, mask: np.ndarray) -> np.ndarray:
        return np.add.reduceat(mask.astype(np.int64), self.starts)

    def pick(self, mask: np.ndarray, *keys: np.ndarray) -> np.ndarray:
        """Per group, the (sorted) row with the smallest keys among ``mask``, key
        after key; -1 when the group has no such row."""
        candidates = mask
        for key in keys:
            least = self.min(key, candidates)
            candidates = candidates & (key == least[self.of_row])
        first = self.min(self.index, candidates)
        return np.where(first == _MAX, -1, first)

    def per_row(self, values: np.ndarray) -> np.ndarray:
        return values[self.of_row]


def _codes(column: pa.Array, values: Sequence[str] | pa.Array) -> np.ndarray:
    """Positions of ``column``'s values in ``values``; -1 for null or absent."""
    value_set = values if isinstance(values, pa.Array) else pa.array(list(values), pa.string())
    found = pc.index_in(column, value_set=value_set)
    return np.asarray(found.fill_null(-1).to_numpy(zero_copy_only=False), dtype=np.int64)


def _ordered_codes(column: pa.Array) -> tuple[np.ndarray, pa.Array]:
    """Codes that order as the strings do (byte order), -1 for null, and the values."""
    values = pc.unique(column.drop_null())
    values = values.take(pc.sort_indices(values))
    return _codes(column, values), values


def _ints(column: pa.Array, null: int) -> np.ndarray:
    return np.asarray(column.cast(pa.int64()).fill_null(null).to_numpy(zero_copy_only=False),
                      dtype=np.int64)


def _nulls(column: pa.Array) -> np.ndarray:
    return np.asarray(column.is_null().to_numpy(zero_copy_only=False), dtype=bool)


def _optional(values: np.ndarray, missing: np.ndarray) -> pa.Array:
    return pa.array(values, mask=missing)


def _take(column: pa.Array, rows: np.ndarray) -> pa.Array:
    """``column`` at ``rows`` (original row numbers), null where a row is -1."""
    return column.take(pa.array(rows, mask=rows < 0))


def _lists(present: np.ndarray, order_keys: np.ndarray | None, names: pa.Array
           ) -> pa.Array:
    """A list of names per row of ``present`` (groups x codes, bool), codes in the
    order of ``order_keys`` (same shape; code order when None)."""
    if order_keys is None:
        rows, cols = np.nonzero(present)
    else:
        keyed = np.where(present, order_keys, _MAX)
        order = np.argsort(keyed, axis=1, kind="stable")
        ranked = np.take_along_axis(present, order, axis=1)
        rows, positions = np.nonzero(ranked)
        cols = order[rows, positions]
    offsets = np.r_[0, np.cumsum(present.sum(axis=1))].astype(np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), names.take(pa.array(cols)))


def journeys(table: pa.Table, plan: Plan) -> pa.Table:
    """One row per message id of ``table`` (message events, ``INPUT_COLUMNS``), in
    ``SCHEMA``: what ``audit.journeys`` gives for these messages."""
    if table.num_rows == 0:
        return SCHEMA.empty_table()
    table = table.combine_chunks()
    col = {name: table.column(name).chunk(0) if table.column(name).num_chunks
           else pa.array([], table.schema.field(name).type) for name in INPUT_COLUMNS}
    ids = col["message_id"].dictionary_encode()
    g = _Groups(np.asarray(ids.indices.to_numpy(zero_copy_only=False)), len(ids.dictionary))
    o = g.order
    kinds = list(plan.kinds)
    e = _codes(col["event"], kinds)[o]

    def kind(*names: str) -> np.ndarray:
        return np.isin(e, [kinds.index(n) for n in names])

    brokers = pa.array(list(plan.brokers), pa.string())
    t = np.asarray(col["ts"].to_numpy(zero_copy_only=False), dtype=np.int64)[o]
    b = _codes(col["broker"], plan.brokers)[o]
    rank = np.asarray(plan.ranks, dtype=np.int64)[e]
    row = o  # sorted position -> original row

    # Origin: the first acceptance (a received event), else the first event, as the
    # minimum of the struct (ts, broker, destination, persistent, size), nulls first.
    received = kind(RECEIVED)
    dest = _codes(col["destination"], ["", *plan.destinations])[o]
    persistent = col["persistent"]
    pers = np.where(_nulls(persistent), -1,
                    _ints(persistent.cast(pa.int8()), 0))[o]
    size = _ints(col["size"], _MIN)[o]
    has_received = g.count(received) > 0
    origin_mask = received | ~g.per_row(has_received)
    origin = g.pick(origin_mask, t, b, dest, pers, size)
    o_row = row[origin]

    # Last event: latest ts, lifecycle rank breaking ties (then the kind).
    last = g.pick(np.ones(len(t), dtype=bool), -t, -rank, -e)
    l_row = row[last]

    delivery = kind(DISPATCHED, DELIVERED)
    settle = kind(ACKED, DELIVERED)
    first_dispatch = g.min(t, delivery)
    first_ack = g.min(t, settle)
    has_dispatch, has_ack = first_dispatch != _MAX, first_ack != _MAX
    consumer_ids = col["consumer"].dictionary_encode()
    consumer = np.where(_nulls(consumer_ids), -1,
                        _ints(consumer_ids.indices, -1))[o]
    acker = g.pick(settle, t, b, consumer)
    has_acker = acker >= 0
    acker_b = np.where(has_acker, b[np.maximum(acker, 0)], -1)
    acker_c = np.where(has_acker, consumer[np.maximum(acker, 0)], -1)
    acked = (delivery & (b == g.per_row(acker_b)) & (consumer == g.per_row(acker_c))
             & (consumer >= 0) & (t <= g.per_row(first_ack)))
    acked_ts = g.max(t, acked)
    has_acked = acked_ts != _MIN

    recovered = kind(RECOVERED)
    rec_ts = g.max(t, recovered)
    after = g.count(delivery & (t > g.per_row(rec_ts)) & g.per_row(rec_ts != _MIN))
    rec_count = g.max(_ints(col["delivery_count"], _MIN)[o],
                      recovered & ~_nulls(col["delivery_count"])[o])
    deliveries = g.count(delivery)
    possible = np.maximum(deliveries, np.where(rec_count == _MIN, 0, rec_count) + after)

    counts = {
        "hops": g.count(kind(FORWARDED)), "deliveries": deliveries,
        "acks": g.count(settle), "redeliveries": g.count(kind(REDELIVERED)),
        "dead_letters": g.count(kind(DLQ)), "expiries": g.count(kind(EXPIRED)),
        "drops": g.count(kind(DROPPED, DENIED)), "recoveries": g.count(recovered)}

    reason_codes, reason_values = _ordered_codes(col["reason"])
    reason = reason_codes[o]
    drop_code = g.max(reason, kind(DROPPED, DENIED) & (reason >= 0))
    drop_reason = reason_values.take(pa.array(drop_code, mask=drop_code == _MIN))
    # (event == stored) & (reason == "stream"): null for a stored event without a
    # reason; the group's maximum ignores nulls (and is null when all are).
    stored = kind(STORED)
    stream_values = reason_values.to_pylist()
    stream = stream_values.index("stream") if "stream" in stream_values else -2
    streamed_true = g.count(stored & (reason == stream)) > 0
    streamed_known = g.count(~stored | (reason >= 0)) > 0

    dedup_codes, dedup_values = _ordered_codes(col["dedup_id"])
    dedup = g.max(dedup_codes[o], dedup_codes[o] >= 0)
    dedup_id = dedup_values.take(pa.array(dedup, mask=dedup == _MIN))
    copy_keys = list(plan.copies)
    copy_at = _codes(dedup_id, copy_keys)
    copy = pa.array(list(plan.copies.values()), pa.string()).take(
        pa.array(copy_at, mask=copy_at < 0)) if copy_keys else pa.nulls(g.n, pa.string())
    message_id = ids.dictionary

    # Arrivals: brokers in order of their first arrival (ties by name); the delivering
    # brokers, sorted by name.
    arrival = kind(RECEIVED, RECEIVED_FROM_BRIDGE, RECOVERED)
    n_brokers = len(plan.brokers)
    first_arrival = np.stack([g.min(t, arrival & (b == i)) for i in range(n_brokers)],
                             axis=1) if n_brokers else np.zeros((g.n, 0), np.int64)
    arrived = first_arrival != _MAX
    last_b = b[last]
    no_arrival = ~arrived.any(axis=1)
    path_present = arrived.copy()
    path_present[no_arrival, np.maximum(last_b[no_arrival], 0)] = True
    path_keys = np.where(arrived, first_arrival, 0)
    path = _lists(path_present, path_keys, brokers)
    delivered_by = _lists(np.stack([g.count(delivery & (b == i)) > 0
                                    for i in range(n_brokers)], axis=1)
                          if n_brokers else np.zeros((g.n, 0), bool), None, brokers)

    # The run that last held the message, and after a forward the peer's run then.
    last_ts = t[last]
    last_event = _take(col["event"], l_row)
    last_boot = _take(col["boot"], l_row)
    last_peer = _codes(col["peer"], plan.brokers)[l_row]
    boot_names = sorted({r[1] for r in plan.runs})
    boot_codes = _codes(last_boot, boot_names)
    restarted_ts = np.full(g.n, _MIN)
    h_next = np.full(g.n, -1)
    h_clean = np.zeros(g.n, bool)
    h_exact = np.zeros(g.n, bool)
    p_restarted = np.zeros(g.n, bool)
    p_blind = np.zeros(g.n, bool)
    held = np.zeros(g.n, bool)
    forwarded_last = e[last] == kinds.index(FORWARDED)
    for broker, boot, started, next_started, next_broker, clean, exact in plan.runs:
        code = plan.brokers.index(broker)
        holder = (last_b == code) & (boot_codes == boot_names.index(boot))
        held |= holder
        if next_started is not None:
            restarted_ts[holder] = next_started
        if next_broker is not None:
            h_next[holder] = plan.brokers.index(next_broker)
        h_clean[holder] = bool(clean)
        h_exact[holder] = bool(exact)
        peer = forwarded_last & (last_peer == code) & (started <= last_ts)
        if next_started is not None:
            peer &= last_ts < next_started
            p_restarted |= peer
            if not clean and not exact:
                p_blind |= peer
    restarted = restarted_ts != _MIN
    # Outside a known run the holder's flags are unknown (a left join's nulls).
    holder_blind = held & ~h_clean & ~h_exact
    c = counts
    settled_known = (c["acks"] > 0) | (c["dead_letters"] > 0) | (c["expiries"] > 0) \
        | (c["drops"] > 0) | streamed_true
    settled_null = ~settled_known & ~streamed_known
    copy_np = np.asarray(copy.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    copy_differs = copy_np & np.asarray(
        pc.fill_null(pc.not_equal(copy, message_id), False).to_numpy(zero_copy_only=False),
        dtype=bool)
    resent = restarted & (deliveries == 0) & ~settled_known & ~settled_null & copy_differs
    peer_blind = p_blind & p_restarted
    unknown_kind = np.select(
        [settled_known, peer_blind, restarted & (deliveries > 0), restarted & holder_blind],
        [0, 1, 2, 3], 0)
    status = np.select(
        [c["acks"] > 0, c["dead_letters"] > 0, c["expiries"] > 0, c["drops"] > 0,
         streamed_true, resent, unknown_kind > 0, restarted, forwarded_last],
        [0, 1, 2, 3, 4, 5, 6, 7, 8], 9)
    status_names = pa.array(["consumed", "dead_lettered", "expired", "dropped", "retained",
                             "resent", "unknown", "lost", "in_transit", "pending"])
    last_broker_names = brokers.take(pa.array(last_b)).to_pylist() if len(last_b) else []
    reasons: list[str | None] = [None] * g.n
    for i in np.flatnonzero(resent | (unknown_kind > 0)).tolist():
        holder_name = last_broker_names[i]
        took = h_next[i] >= 0 and plan.brokers[h_next[i]] != holder_name
        nxt = plan.brokers[h_next[i]] if h_next[i] >= 0 else None
        if resent[i]:
            ended_by = f"{nxt}'s takeover from {holder_name}" if took else \
                f"{holder_name}'s restart"
            reasons[i] = (f"taken by {ended_by}; sent again with its dedup-id as "
                          f"{copy[i].as_py()}, which was delivered")
        elif unknown_kind[i] == 1:
            reasons[i] = (f"forwarded to {plan.brokers[last_peer[i]]}, which crashed before "
                          "its trace was complete")
        elif unknown_kind[i] == 2:
            ended = f"{nxt} took over from {holder_name}" if took else \
                f"{holder_name} restarted"
            reasons[i] = f"delivered to a consumer; no ack traced before {ended}"
        else:
            reasons[i] = (f"{holder_name} crashed; its trace was not exact, so a delivery "
                          "after its last flush is missing")

    received_ts = np.where(has_received, t[origin], 0)
    msg_ts = g.min(_ints(col["msg_ts"], _MAX)[o])
    sent_missing = ~has_received & (msg_ts == _MAX)
    sent_ts = np.where(has_received, received_ts, np.where(msg_ts == _MAX, 0, msg_ts) * 1000)
    latency = (first_dispatch - received_ts) / 1000.0
    ack_latency = (first_ack - received_ts) / 1000.0
    e2e = (acked_ts - sent_ts) / 1000.0
    consumed_on = brokers.take(pa.array(acker_b, mask=~has_acker))
    columns = {
        "message_id": message_id, "dedup_id": dedup_id,
        "origin_broker": _take(col["broker"], o_row),
        "destination": _take(col["destination"], o_row),
        "persistent": _take(col["persistent"], o_row), "size": _take(col["size"], o_row),
        "first_ts": pa.array(t[origin]),
        "received_ts": _optional(received_ts, ~has_received),
        "path": path, "path_text": pc.binary_join(path, ">"),
        "hops": pa.array(c["hops"]), "deliveries": pa.array(deliveries),
        "possible_deliveries": pa.array(possible), "acks": pa.array(c["acks"]),
        "redeliveries": pa.array(c["redeliveries"]), "recoveries": pa.array(c["recoveries"]),
        "first_dispatch_ts": _optional(first_dispatch, ~has_dispatch),
        "first_ack_ts": _optional(first_ack, ~has_ack),
        "latency_ms": _optional(latency, ~has_dispatch | ~has_received),
        "ack_latency_ms": _optional(ack_latency, ~has_ack | ~has_received),
        "consumed_on": consumed_on,
        "e2e_latency_ms": _optional(e2e, ~has_acked | sent_missing),
        "last_ts": pa.array(last_ts), "last_event": last_event,
        "last_broker": _take(col["broker"], l_row), "last_boot": last_boot,
        "last_destination": _take(col["destination"], l_row),
        "drop_reason": drop_reason,
        "holder_restarted_ts": _optional(restarted_ts, ~restarted),
        "status": status_names.take(pa.array(status)),
        "reason": pa.array(reasons, pa.string()),
        "delivered_by": delivered_by}
    return pa.table(columns).cast(SCHEMA)


# The footer key Spark reads its own schema from (as ``small_tables`` writes it).
SPARK_SCHEMA_KEY = b"org.apache.spark.sql.parquet.row.metadata"
PARTIALS = ("summary", "paths", "lost", "duplicates", "stuck")
WRITTEN_DDL = "file string, rows bigint, " + ", ".join(f"{p} binary" for p in PARTIALS)
LOST_COLUMNS = ("message_id", "dedup_id", "origin_broker", "destination", "persistent",
                "path_text", "last_event", "last_broker", "last_destination", "last_ts",
                "holder_restarted_ts")


def partials(out: pa.Table, plan: Plan) -> dict[str, pa.Table]:
    """What the tables derived from the journeys need of one partition's journeys:
    counts per status and per path (sums over partitions are exact), and the few rows
    that are lost, delivered more than once or resent, or stuck candidates (pending
    longer than ``plan.stuck_after_ms`` before ``plan.now_ts``)."""
    status = out.column("status")
    consumed = pc.equal(status, "consumed").cast(pa.int64())
    per_path = (pa.table({"path_text": out.column("path_text"), "hops": out.column("hops"),
                          "consumed": consumed})
                .group_by(["path_text", "hops"], use_threads=False)
                .aggregate([("consumed", "count"), ("consumed", "sum")])
                .rename_columns(["path_text", "hops", "messages", "consumed"]))
    per_status = (pa.table({"status": status}).group_by("status", use_threads=False)
                  .aggregate([("status", "count")]).rename_columns(["status", "messages"]))
    deliveries = out.column("deliveries")
    repeated = pc.or_(pc.greater(deliveries, 1),
                      pc.and_(pc.is_valid(out.column("dedup_id")), pc.greater(deliveries, 0)))
    age_ms = pc.divide(pc.subtract(pa.scalar(plan.now_ts, pa.int64()), out.column("last_ts"))
                       .cast(pa.float64()), 1000.0)
    stuck = pc.and_(pc.equal(status, "pending"),
                    pc.greater(age_ms, float(plan.stuck_after_ms)))
    return {
        "summary": per_status, "paths": per_path,
        "lost": out.filter(pc.equal(status, "lost")).select(list(LOST_COLUMNS)),
        "duplicates": out.filter(repeated).select(
            ["message_id", "dedup_id", "destination", "deliveries", "acks", "delivered_by"]),
        "stuck": out.filter(stuck).select(
            ["message_id", "last_broker", "last_destination", "last_event", "last_ts"])}


def _ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


def read_partial(data: bytes) -> pa.Table:
    return pa.ipc.open_stream(data).read_all()


def write_partition(plan: Plan, directory: str, spark_schema_json: str) -> Any:
    """The function ``mapInArrow`` runs to write the journeys itself: a partition's
    journeys go to ``directory/part-<partition>.snappy.parquet`` (a retried task
    replaces its file), with Spark's schema in the footer as Spark's writer puts it;
    one row out per file written (``WRITTEN_DDL``), carrying its ``partials`` as
    Arrow IPC streams."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import os

        import pyarrow.parquet as pq
        from pyspark import TaskContext

        received = list(batches)
        table = pa.Table.from_batches(received) if received else None
        if table is None or not table.num_rows:
            return
        out = journeys(table, plan)
        context = TaskContext.get()
        name = f"part-{context.partitionId() if context else 0:05d}.snappy.parquet"
        staging = os.path.join(directory, f".{name}.{os.getpid()}")
        pq.write_table(out.replace_schema_metadata({SPARK_SCHEMA_KEY: spark_schema_json}),
                       staging, compression="snappy", store_schema=False)
        os.replace(staging, os.path.join(directory, name))
        parts = partials(out, plan)
        yield pa.record_batch(
            [pa.array([name]), pa.array([out.num_rows], pa.int64()),
             *[pa.array([_ipc(parts[p])], pa.binary()) for p in PARTIALS]],
            names=["file", "rows", *PARTIALS])

    return run


def map_partition(plan: Plan) -> Any:
    """The function ``mapInArrow`` runs: a partition's batches in, its journeys out."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        received = list(batches)
        table = pa.Table.from_batches(received) if received else None
        if table is not None and table.num_rows:
            yield from journeys(table, plan).to_batches()

    return run
