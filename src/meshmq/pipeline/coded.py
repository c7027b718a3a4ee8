"""The journeys as a hash aggregation over integer-coded events.

The reference transform (``audit.journeys``) keeps strings, structs and lists per
message, which Spark runs as an object aggregation that sorts once it holds more than
128 messages. Here every event is first coded with the dictionaries of the catalog
pass (``meshmq.pipeline.catalog``: one broadcast join on the run row's key gives the
broker, run, destination and drop reason codes; the event kind and the peer are
``CASE`` expressions over the few kinds and brokers) and its timestamp made relative
to the trace's first event, so that the per-message aggregation holds numbers only:
counts, minima and maxima, and ``min_by``/``max_by`` of numbers. Spark runs it as a
hash aggregation. Strings come back after the aggregation, one row per message, by
indexing literal arrays of the dictionaries' names.

Packed keys carry what the reference keeps in structs (bits, high to low):

* first acceptance: ``not received (1) | ts (46) | broker (12)``; its minimum is the
  origin (a ``received`` event first, else the first event), with ties ordered by
  broker name as the reference's struct minimum; ``min_by`` of ``destination + 1 (..)
  | persistent (2)`` and of ``size`` at that key;
* last event: ``ts (46) | lifecycle rank (4) | event kind (5)``, the reference's
  ``ts * 16 + rank`` order; ``max_by`` of ``run + 1 (23) | destination + 1 (32) |
  peer + 1 (8)``;
* first settle and first delivery: ``ts (46) | broker (12)``, with ``min_by`` of the
  consumer id's 64-bit hash (only compared with another consumer of the same message
  on the same broker: a collision would need two consumers of one message whose
  xxhash64 values are equal);
* path: one minimum of the arrival time per broker (so at most ``MAX_BROKERS``).

Deliveries are not kept per message: the delivery the consumer acked and the
deliveries after the last recovery follow from the first delivery when there was one,
and are computed from the delivery events of the (few) messages delivered more than
once. ``supported`` says when the codes fit; otherwise ``audit.journeys`` runs.

The audit's default is ``meshmq.pipeline.arrow_journeys`` (per message in Python
workers, with less CPU); this path runs when that one does not take the trace, or
when asked for (``audit_job.compute(journeys="coded")``).
"""

from __future__ import annotations

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F  # noqa: N812 - the usual Spark spelling

from meshmq.core import trace as tr
from meshmq.pipeline import audit, catalog

TS_BITS = 46  # about 2.2 years of microseconds from the trace's first event
BROKER_BITS = 12
MAX_BROKERS = 16  # one aggregate per broker for the path
MAX_RUNS = (1 << 23) - 2
MAX_DESTINATIONS = (1 << 31) - 2

KINDS = tr.EVENT_KINDS
_LOW = (1 << BROKER_BITS) - 1
_TS_MASK = (1 << TS_BITS) - 1


def supported(cat: catalog.Catalog) -> bool:
    """Whether the trace fits the codes: few enough brokers, runs and destinations,
    and a time span of at most ``TS_BITS`` microseconds."""
    span = 0 if cat.first_ts is None or cat.last_ts is None else cat.last_ts - cat.first_ts
    return (len(cat.brokers) <= MAX_BROKERS and len(cat.runs) <= MAX_RUNS
            and len(cat.destinations) <= MAX_DESTINATIONS and 0 <= span <= _TS_MASK
            and len(KINDS) < 32)


def _names(values: list[str | None]) -> Column:
    """A literal array to index by code + 1."""
    return F.array(*[F.lit(v).cast("string") for v in values]) if values else \
        F.array().cast("array<string>")


def _at(names: Column, index: Column) -> Column:
    """``names[index]`` (from 1), null for a null index (``element_at`` alone is not)."""
    return F.when(index.isNotNull(), F.element_at(names, index))


def _code_of(col: Column, values: list[str]) -> Column:
    expr: Column = F.lit(None).cast("int")
    for i, value in reversed(list(enumerate(values))):
        expr = F.when(col == value, i).otherwise(expr)
    return expr


def coded_events(events: DataFrame, cat: catalog.Catalog) -> DataFrame:
    """Message events with integer codes and timestamps relative to the first event."""
    spark: SparkSession = events.sparkSession
    ev = F.col("event")
    msgs = events.where(F.col("message_id") != "")
    aux_kind = (F.when(ev == tr.BROKER_STARTED, catalog.AUX_START)
                .when(ev.isin(tr.DROPPED, tr.DENIED), catalog.AUX_DROP)
                .otherwise(catalog.AUX_NONE))
    broker_code = {b: i for i, b in enumerate(cat.brokers)}
    run_code = {r: i for i, r in enumerate(cat.runs)}
    dest_code = {d: i for i, d in enumerate(cat.destinations)}
    reason_code = {r: i for i, r in enumerate(cat.drop_reasons)}
    rows = [(b, boot, d, kind, aux, broker_code[b], run_code[(b, boot)], dest_code.get(d),
             reason_code.get(aux) if kind == catalog.AUX_DROP else None)
            for b, boot, d, kind, aux in cat.keys]
    codes = spark.createDataFrame(
        rows, "_cb string, _cboot string, _cd string, _ck int, _ca string, b int, r int, "
              "d int, a int")
    keyed = msgs.select("*", aux_kind.alias("_k"),
                        F.when(aux_kind != catalog.AUX_NONE, F.col("reason")).alias("_aux"))
    joined = keyed.join(F.broadcast(codes),
                        F.col("broker").eqNullSafe(F.col("_cb"))
                        & F.col("boot").eqNullSafe(F.col("_cboot"))
                        & F.col("destination").eqNullSafe(F.col("_cd"))
                        & F.col("_k").eqNullSafe(F.col("_ck"))
                        & F.col("_aux").eqNullSafe(F.col("_ca")), "left")
    consumer = F.col("consumer")
    return joined.select(
        "message_id", (F.col("ts") - F.lit(cat.first_ts or 0)).alias("t"),
        _code_of(ev, list(KINDS)).alias("e"), "b", "r", "d", "a",
        _code_of(F.col("peer"), cat.brokers).alias("p"),
        F.when(consumer.isNotNull(), F.xxhash64(consumer)).alias("c"),
        "msg_ts", "size", "persistent", "delivery_count",
        ((ev == tr.STORED) & (F.col("reason") == "stream")).alias("stream"))


def _is(*kinds: str) -> Column:
    codes = [KINDS.index(k) for k in kinds]
    return F.col("e") == codes[0] if len(codes) == 1 else F.col("e").isin(*codes)


def _count(*kinds: str) -> Column:
    return F.sum(F.when(_is(*kinds), 1).otherwise(0))


def aggregate(coded: DataFrame, n_brokers: int) -> DataFrame:
    """One row per message id, numbers only (see the module docstring)."""
    t, b = F.col("t"), F.col("b").cast("long")
    rank = F.element_at(F.array(*[F.lit(audit.RANK.get(k, 9)) for k in KINDS]),
                        F.col("e") + 1).cast("long")
    okey = (F.when(_is(tr.RECEIVED), 0).otherwise(1).cast("long")
            * (1 << (TS_BITS + BROKER_BITS))) + t * (1 << BROKER_BITS) + b
    opay = F.coalesce(F.col("d").cast("long") + 1, F.lit(0)) * 4 + F.when(
        F.col("persistent").isNull(), 2).when(F.col("persistent"), 1).otherwise(0)
    order = t * 512 + rank * 32 + F.col("e")
    lpay = ((F.coalesce(F.col("r").cast("long") + 1, F.lit(0)) * (1 << 32)
             + F.coalesce(F.col("d").cast("long") + 1, F.lit(0))) * 256
            + F.coalesce(F.col("p") + 1, F.lit(0)))
    tb = t * (1 << BROKER_BITS) + b
    skey = F.when(_is(tr.ACKED, tr.DELIVERED), tb)
    dkey = F.when(_is(tr.DISPATCHED, tr.DELIVERED), tb)
    arrival = _is(tr.RECEIVED, tr.RECEIVED_FROM_BRIDGE, tr.RECOVERED)
    return coded.groupBy("message_id").agg(
        F.min(okey).alias("okey"), F.min_by(opay, okey).alias("opay"),
        F.min_by("size", okey).alias("osize"),
        F.max(order).alias("order"), F.max_by(lpay, order).alias("lpay"),
        F.min(skey).alias("skey"), F.min_by("c", skey).alias("skey_c"),
        F.min(dkey).alias("dkey"), F.min_by("c", dkey).alias("dkey_c"),
        F.min("msg_ts").alias("msg_ts"),
        _count(tr.FORWARDED).alias("hops"),
        _count(tr.DISPATCHED, tr.DELIVERED).alias("deliveries"),
        _count(tr.ACKED, tr.DELIVERED).alias("acks"),
        _count(tr.REDELIVERED).alias("redeliveries"),
        _count(tr.DLQ).alias("dead_letters"),
        _count(tr.EXPIRED).alias("expiries"),
        _count(tr.DROPPED, tr.DENIED).alias("drops"),
        _count(tr.RECOVERED).alias("recoveries"),
        F.max(F.when(_is(tr.RECOVERED), F.col("delivery_count"))).alias("_rec_count"),
        F.max(F.when(_is(tr.RECOVERED), t)).alias("rec_t"),
        F.max(F.when(_is(tr.DROPPED, tr.DENIED), F.col("a"))).alias("drop_code"),
        F.max("stream").alias("streamed"),
        *[F.min(F.when(arrival & (F.col("b") == i), t)).alias(f"arr{i}")
          for i in range(n_brokers)])


# Up to this many messages delivered more than once, their keys are broadcast to the
# scan of the deliveries (no shuffle of every delivery event); more are joined by a
# shuffle.
BROADCAST_REPEATED = 1_000_000


def repeated_deliveries(events: DataFrame, cat: catalog.Catalog, agg: DataFrame) -> DataFrame:
    """For the messages delivered more than once: the deliveries after the last
    recovery, the delivery the first settling consumer received (its relative ts) and
    the delivering brokers (a bit per broker code). ``agg`` is cached: counting its
    candidates is a scan of the kept rows."""
    many = agg.where(F.col("deliveries") > 1).select(
        F.col("message_id").alias("_m"), "skey", "skey_c", "rec_t")
    if many.count() <= BROADCAST_REPEATED:
        many = F.broadcast(many)
    # The deliveries alone: their broker's code needs no join.
    dl = events.where(F.col("event").isin(tr.DISPATCHED, tr.DELIVERED)).select(
        "message_id", (F.col("ts") - F.lit(cat.first_ts or 0)).alias("t"),
        _code_of(F.col("broker"), cat.brokers).alias("b"),
        F.when(F.col("consumer").isNotNull(), F.xxhash64("consumer")).alias("c"))
    t = F.col("t")
    acked = ((F.col("b") == F.col("skey").bitwiseAND(_LOW)) & (F.col("c") == F.col("skey_c"))
             & (t <= F.shiftright("skey", BROKER_BITS)))
    return (dl.join(many, F.col("message_id") == F.col("_m"))
            .groupBy("message_id")
            .agg(F.sum(F.when(t > F.col("rec_t"), 1).otherwise(0)).alias("_after"),
                 F.max(F.when(acked, t)).alias("_acked_t"),
                 F.bit_or(F.expr("shiftleft(1L, b)")).alias("_mask"))
            .withColumnRenamed("message_id", "_m2"))


def dedup_ids(events: DataFrame) -> DataFrame:
    """The dedup id per message id, for the messages that have one (the reference's
    maximum), with the first message id of that dedup id that reached a consumer
    (``audit.delivered_copies``): string aggregates over the events that carry a dedup
    id only, kept out of the numbers-only aggregation."""
    with_ids = events.where((F.col("message_id") != "") & F.col("dedup_id").isNotNull())
    per_message = (with_ids.groupBy(F.col("message_id").alias("_m3"))
                   .agg(F.max("dedup_id").alias("dedup_id")))
    return per_message.join(audit.delivered_copies(with_ids),
                            F.col("dedup_id") == F.col("_copy_of"), "left")


def journeys(events: DataFrame, cat: catalog.Catalog, boot_table: DataFrame) -> DataFrame:
    """The journeys table, as ``audit.journeys`` computes it (``supported`` traces)."""
    n = len(cat.brokers)
    coded = coded_events(events, cat)
    # Kept: the journeys and the repeated deliveries both read it.
    agg = aggregate(coded, n).persist(StorageLevel.MEMORY_AND_DISK)
    many = repeated_deliveries(events, cat, agg)
    rows = (agg.join(many, F.col("message_id") == F.col("_m2"), "left")
            .join(dedup_ids(events), F.col("message_id") == F.col("_m3"), "left"))
    t0 = F.lit(cat.first_ts or 0)
    brokers = _names(list(cat.brokers))
    dests = _names([None, *cat.destinations])
    okey, lpay, order = F.col("okey"), F.col("lpay"), F.col("order")
    o_ts = F.shiftright(okey, BROKER_BITS).bitwiseAND(_TS_MASK) + t0
    opay = F.col("opay")
    start = F.struct(
        o_ts.alias("ts"), _at(brokers, okey.bitwiseAND(_LOW).cast("int") + 1)
        .alias("broker"),
        _at(dests, F.shiftright(opay, 2).cast("int") + 1).alias("destination"),
        F.when(opay.bitwiseAND(3) == 1, True).when(opay.bitwiseAND(3) == 0, False)
        .alias("persistent"), F.col("osize").alias("size"))
    received = okey < (1 << (TS_BITS + BROKER_BITS))
    run = F.shiftright(lpay, 40).cast("int")
    run_brokers = _names([None, *[r[0] for r in cat.runs]])
    run_boots = _names([None, *[r[1] for r in cat.runs]])
    last = F.struct(
        (F.shiftright(order, 9) + t0).alias("ts"),
        _at(_names(list(KINDS)), order.bitwiseAND(31).cast("int") + 1).alias("event"),
        _at(run_brokers, run + 1).alias("broker"),
        _at(run_boots, run + 1).alias("boot"),
        _at(dests, F.shiftright(lpay, 8).bitwiseAND((1 << 32) - 1).cast("int") + 1)
        .alias("destination"),
        _at(_names([None, *cat.brokers]), lpay.bitwiseAND(255).cast("int") + 1)
        .alias("peer"))
    skey, dkey = F.col("skey"), F.col("dkey")
    first_ack = F.shiftright(skey, BROKER_BITS) + t0
    first_dispatch = F.shiftright(dkey, BROKER_BITS) + t0
    arrivals = F.transform(
        F.array_sort(F.filter(F.array(*[F.struct(F.col(f"arr{i}").alias("t"),
                                                 F.lit(i).alias("i")) for i in range(n)]),
                              lambda a: a["t"].isNotNull())),
        lambda a: _at(brokers, a["i"] + 1)) if n else F.array().cast("array<string>")
    decoded = rows.select(
        "message_id", "dedup_id", "_copy", start.alias("start"),
        F.when(received, o_ts).alias("received_ts"), "msg_ts",
        F.when(dkey.isNotNull(), first_dispatch).alias("first_dispatch_ts"),
        F.when(skey.isNotNull(), first_ack).alias("first_ack_ts"),
        F.struct(_at(brokers, skey.bitwiseAND(_LOW).cast("int") + 1).alias("broker"))
        .alias("acker"),
        last.alias("last"), arrivals.alias("arrivals"),
        "hops", "deliveries", "acks", "redeliveries", "dead_letters", "expiries", "drops",
        "recoveries", "_rec_count", "streamed",
        _at(_names(list(cat.drop_reasons)), F.col("drop_code") + 1)
        .alias("drop_reason"),
        # One delivery: it is the first; several: from repeated_deliveries.
        F.when(F.col("deliveries") == 1, F.when(
            (dkey.bitwiseAND(_LOW) == skey.bitwiseAND(_LOW))
            & (F.col("dkey_c") == F.col("skey_c")) & (dkey <= skey), first_dispatch))
        .when(F.col("deliveries") > 1, F.col("_acked_t") + t0).alias("_acked_ts"),
        F.when(F.col("deliveries") == 1, F.when(
            F.shiftright(dkey, BROKER_BITS) > F.col("rec_t"), 1).otherwise(0))
        .when(F.col("deliveries") > 1, F.col("_after")).otherwise(0).alias("_after"),
        F.when(F.col("deliveries") == 1, F.array(_at(
            brokers, dkey.bitwiseAND(_LOW).cast("int") + 1)))
        .when(F.col("deliveries") > 1, F.filter(
            brokers, lambda _, i: F.col("_mask").bitwiseAND(F.pow(2, i).cast("long")) != 0))
        .otherwise(F.array().cast("array<string>")).alias("_delivered_by"))
    possible = F.greatest(F.col("deliveries"),
                          F.coalesce(F.col("_rec_count"), F.lit(0)) + F.col("_after"))
    return audit.journey_columns(
        audit.join_runs(decoded, boot_table), start=F.col("start"),
        arrivals=F.col("arrivals"), possible=possible, acked_delivery=F.col("_acked_ts"),
        delivered_by=F.col("_delivered_by"))
