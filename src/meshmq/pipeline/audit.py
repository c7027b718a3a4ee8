"""The delivery audit: pure DataFrame-to-DataFrame transforms over trace events.

Every function here takes DataFrames in the trace schema (``meshmq.core.trace``)
or the outputs of other functions here, and returns a DataFrame; nothing reads or
writes files (``meshmq.pipeline.audit_job`` does that). The tables:

* ``journeys``: one row per message id: where it entered, the brokers it crossed
  (``path``), hop count, deliveries, acks, latencies and a final ``status``:
  consumed, dead_lettered, expired, dropped, retained (in a stream destination, which
  keeps messages; reads of streams are not traced), pending, in_transit, lost or
  unknown (the trace cannot decide; ``reason`` says why). ``e2e_latency_ms``: send
  (first broker) to the delivery to the consumer that acked, wherever that was;
  ``delivered_by``: the brokers that delivered it (for ``duplicates``).
* ``boots``: one row per broker run; ``failover_windows``: the gaps between runs,
  from the last sign of life (heartbeat) of a crashed run to the next start. A run of
  a master/slave pair's broker also ends when another broker takes its lease over
  (``took_over`` in that broker's start names the lease holder it succeeded), so a
  pair whose brokers have different names ends the master's run at the takeover.
* ``lost``: messages accepted by a broker, never consumed or otherwise settled, with
  no evidence of a delivery anywhere: the broker that last held them restarted, they
  did not come back (no ``recovered`` event), and that broker's trace is complete up
  to the stop (a clean stop, or a crash of a run traced in ``exact`` mode).

After a crash of a run not traced in ``exact`` mode, the events between its last
flush and the crash are gone: a message it held, or was forwarded to it, may have
been delivered and acked there. Such messages are ``unknown``, never lost or in
transit.
* ``duplicates``: messages delivered more than once (``redelivered``: the same
  message id dispatched again, on any broker and run; complete when the runs that
  crashed traced in ``exact`` mode, otherwise a delivery just before a crash may be
  missing: journeys' ``possible_deliveries`` is the upper bound from the store's
  dispatch marks of recovered messages) and producer resends (``resent``: one dedup id,
  several message ids, more than one of them delivered).
* ``paths``, ``latency``: hop counts / paths and latency percentiles per destination
  and path; ``stuck``: messages pending longer than a threshold, flagged when
  consumers of their destination were served on another broker meanwhile;
  ``throughput`` and ``bridges``: events per time window per broker / per bridge.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F  # noqa: N812 - the usual Spark spelling

from meshmq.core import trace as tr

# Lifecycle order of events logged in the same microsecond (ties in ``ts``).
RANK = {tr.BROKER_STARTED: 0, tr.RECEIVED: 1, tr.RECEIVED_FROM_BRIDGE: 1, tr.RECOVERED: 2,
         tr.STORED: 2, tr.FORWARDED: 3, tr.DISPATCHED: 4, tr.REDELIVERED: 5, tr.ACKED: 6,
         tr.DELIVERED: 6, tr.DLQ: 7, tr.EXPIRED: 7, tr.DROPPED: 7, tr.DENIED: 7,
         tr.BROKER_STOPPED: 8, tr.HEARTBEAT: 8}

STATUSES = ("consumed", "dead_lettered", "expired", "dropped", "retained", "pending",
            "in_transit", "resent", "lost", "unknown")


def _start_field(name: str, cast: str) -> Column:
    """A ``key=value`` field of ``broker_started``'s reason (core.trace.start_reason)."""
    value = F.regexp_extract(F.coalesce(F.col("reason"), F.lit("")), rf"(?:^| ){name}=(\S+)",
                             1)
    return F.when((F.col("event") == tr.BROKER_STARTED) & (value != ""), value.cast(cast))


def _rank(event: Column) -> Column:
    expr = F.lit(9)
    for kind, rank in RANK.items():
        expr = F.when(event == kind, rank).otherwise(expr)
    return expr


def _count(*kinds: str) -> Column:
    return F.sum(F.when(F.col("event").isin(*kinds), 1).otherwise(0))


def _first_ts(*kinds: str) -> Column:
    return F.min(F.when(F.col("event").isin(*kinds), F.col("ts")))


def boots(events: DataFrame) -> DataFrame:
    """One row per broker run: when it started, its last event, whether it stopped
    cleanly, whether it traced in ``exact`` mode and its heartbeat interval, when the
    broker's next run started (null for the current run) and ``alive_until_ts``: the
    run's last sign of life (its last event, or the last heartbeat the next run
    found in the heartbeat file, whichever is later)."""
    runs = events.groupBy("broker", "boot").agg(
        F.min("ts").alias("started_ts"), F.max("ts").alias("last_ts"),
        F.max(F.when(F.col("event") == tr.BROKER_STOPPED, True).otherwise(False))
        .alias("clean_stop"),
        F.count(F.when(F.col("message_id") != "", 1)).alias("events"),
        F.min(F.when((F.col("message_id") != "") & (F.col("event") != tr.RECOVERED),
                     F.col("ts"))).alias("first_service_ts"),
        F.coalesce(F.max(_start_field("exact", "int")) == 1, F.lit(False)).alias("exact"),
        F.max(_start_field("heartbeat_ms", "int")).alias("heartbeat_ms"),
        F.max(_start_field("previous_boot", "string")).alias("previous_boot"),
        F.max(_start_field("last_heartbeat", "bigint")).alias("previous_heartbeat_ts"),
        F.max(_start_field("holder", "string")).alias("holder"),
        F.max(_start_field("took_over", "string")).alias("took_over"))
    by_broker = Window.partitionBy("broker").orderBy("started_ts")
    # The next run's columns beside each run's own (a window over the few runs, not a
    # self-join, which would aggregate the events twice); runs without a boot id are
    # left out, as a join on it would.
    nxt = runs.select(
        "*", F.lead("started_ts").over(by_broker).alias("next_started_ts"),
        F.lead("first_service_ts").over(by_broker).alias("next_service_ts"),
        F.lead("previous_boot").over(by_broker).alias("_nb_prev"),
        F.lead("previous_heartbeat_ts").over(by_broker).alias("_nb_hb"))
    # The first run that took the lease over from each holder (the runs are few).
    takeovers = (runs.where(F.col("took_over").isNotNull())
                 .groupBy(F.col("took_over").alias("_to"))
                 .agg(F.min(F.struct(F.col("started_ts").alias("ts"),
                                     F.col("first_service_ts").alias("service"),
                                     F.col("broker").alias("broker"))).alias("_succ")))
    succ = F.col("_succ")
    # Whichever came first ends the run: its broker's next start or the takeover.
    taken = succ.isNotNull() & (succ["ts"] > F.col("started_ts")) & (
        F.col("next_started_ts").isNull() | (succ["ts"] < F.col("next_started_ts")))
    return (nxt.where(F.col("boot").isNotNull())
            .join(F.broadcast(takeovers), F.col("holder") == F.col("_to"), "left")
            .withColumn("alive_until_ts", F.when(
                F.col("_nb_prev") == F.col("boot"),
                F.greatest("last_ts", "_nb_hb")).otherwise(F.col("last_ts")))
            .withColumn("next_broker", F.when(taken, succ["broker"])
                        .when(F.col("next_started_ts").isNotNull(), F.col("broker")))
            .withColumn("next_service_ts", F.when(taken, succ["service"])
                        .otherwise(F.col("next_service_ts")))
            .withColumn("next_started_ts", F.when(taken, succ["ts"])
                        .otherwise(F.col("next_started_ts")))
            .drop("_nb_prev", "_nb_hb", "_to", "_succ"))


def failover_windows(boot_table: DataFrame) -> DataFrame:
    """The time a broker was down between two runs: from its last sign of life (the
    last heartbeat or event of a crashed run; the clean stop) to the next start;
    ``kind`` is crash (no clean stop was traced) or restart. A crash happened at most
    ``uncertainty_ms`` (one heartbeat interval) after ``down_from_ts``;
    ``first_service_ts``: the next run's first message event; ``up_on``: the broker of
    that run (another one when it took the lease over)."""
    return (boot_table.where(F.col("next_started_ts").isNotNull())
            .select("broker", F.col("boot").alias("ended_boot"),
                    F.col("alive_until_ts").alias("down_from_ts"),
                    F.col("next_started_ts").alias("up_again_ts"),
                    ((F.col("next_started_ts") - F.col("alive_until_ts")) / 1000.0)
                    .alias("down_ms"),
                    F.when(F.col("clean_stop"), "restart").otherwise("crash").alias("kind"),
                    F.when(F.col("clean_stop"), F.lit(0.0))
                    .otherwise(F.col("heartbeat_ms").cast("double")).alias("uncertainty_ms"),
                    F.col("next_service_ts").alias("first_service_ts"),
                    F.col("next_broker").alias("up_on"))
            .transform(lambda f: sorted_small(f, "down_from_ts")))


def journeys(events: DataFrame, boot_table: DataFrame) -> DataFrame:
    """One row per message id, with its final ``status`` (and ``reason`` when it is
    ``unknown``)."""
    msgs = events.where(F.col("message_id") != "")
    ev = F.col("event")
    point = F.struct(F.col("ts"), ev.alias("event"), F.col("broker"), F.col("boot"),
                     F.col("destination"), F.col("peer"))
    # Latest event, lifecycle order breaking ties within a microsecond (max_by on a
    # number is much cheaper than max over a struct).
    order = F.col("ts") * 16 + _rank(ev)
    arrival = ev.isin(tr.RECEIVED, tr.RECEIVED_FROM_BRIDGE, tr.RECOVERED)
    delivery = ev.isin(tr.DISPATCHED, tr.DELIVERED)
    settle = ev.isin(tr.ACKED, tr.DELIVERED)
    entry = F.struct(F.col("ts"), F.col("broker"), F.col("destination"),
                     F.col("persistent"), F.col("size"))
    agg = msgs.groupBy("message_id").agg(
        F.max("dedup_id").alias("dedup_id"),
        F.min(F.when(ev == tr.RECEIVED, entry)).alias("origin"),
        F.min(entry).alias("seen_first"),
        F.max_by(point, order).alias("last"),
        # Brokers in order of arrival (only arrivals are collected: short lists).
        F.array_distinct(F.transform(F.array_sort(F.collect_list(F.when(
            arrival, F.struct(F.col("ts"), F.col("broker"))))), lambda p: p["broker"]))
        .alias("arrivals"),
        _first_ts(tr.RECEIVED).alias("received_ts"),
        F.min("msg_ts").alias("msg_ts"),
        _first_ts(tr.DISPATCHED, tr.DELIVERED).alias("first_dispatch_ts"),
        _first_ts(tr.ACKED, tr.DELIVERED).alias("first_ack_ts"),
        # Who acked first, and every delivery (short lists): the delivery it acked.
        F.min_by(F.struct(F.col("broker"), F.col("consumer")),
                 F.when(settle, F.col("ts"))).alias("acker"),
        F.collect_list(F.when(delivery, F.struct(F.col("ts"), F.col("broker"),
                                                 F.col("consumer")))).alias("_deliveries"),
        _count(tr.FORWARDED).alias("hops"),
        _count(tr.DISPATCHED, tr.DELIVERED).alias("deliveries"),
        # A recovered message's delivery count says it may have been dispatched before
        # the crash (the store's dispatch mark runs ahead), traced or not.
        F.max(F.when(ev == tr.RECOVERED, F.col("delivery_count"))).alias("_rec_count"),
        F.max(F.when(ev == tr.RECOVERED, F.col("ts"))).alias("_rec_ts"),
        _count(tr.ACKED, tr.DELIVERED).alias("acks"),
        _count(tr.REDELIVERED).alias("redeliveries"),
        _count(tr.DLQ).alias("dead_letters"),
        _count(tr.EXPIRED).alias("expiries"),
        # A send the authorization map refused never entered the broker: dropped.
        _count(tr.DROPPED, tr.DENIED).alias("drops"),
        _count(tr.RECOVERED).alias("recoveries"),
        F.max(F.when(ev.isin(tr.DROPPED, tr.DENIED), F.col("reason"))).alias("drop_reason"),
        F.max((ev == tr.STORED) & (F.col("reason") == "stream")).alias("streamed"),
    )
    after_recovery = F.size(F.filter("_deliveries", lambda d: d["ts"] > F.col("_rec_ts")))
    possible = F.greatest(F.col("deliveries"),
                          F.coalesce(F.col("_rec_count"), F.lit(0)) + after_recovery)
    acked_delivery = F.array_max(F.transform(F.filter(
        "_deliveries", lambda d: (d["broker"] == F.col("acker.broker"))
        & (d["consumer"] == F.col("acker.consumer")) & (d["ts"] <= F.col("first_ack_ts"))),
        lambda d: d["ts"]))
    delivered_by = F.array_sort(F.array_distinct(F.transform("_deliveries",
                                                             lambda d: d["broker"])))
    agg = agg.join(delivered_copies(events), F.col("dedup_id") == F.col("_copy_of"), "left")
    return journey_columns(join_runs(agg, boot_table),
                           start=F.coalesce(F.col("origin"), F.col("seen_first")),
                           arrivals=F.col("arrivals"), possible=possible,
                           acked_delivery=acked_delivery, delivered_by=delivered_by)


def delivered_copies(events: DataFrame) -> DataFrame:
    """Per dedup id, the first message id carrying it that reached a consumer
    (``_copy_of``, ``_copy``): the evidence that a producer's re-send delivered what a
    crash took before it was stored (``journey_columns``' ``resent``). Only events with
    a dedup id take part."""
    return (events.where(F.col("dedup_id").isNotNull() & (F.col("message_id") != "")
                         & F.col("event").isin(tr.DISPATCHED, tr.DELIVERED))
            .groupBy(F.col("dedup_id").alias("_copy_of"))
            .agg(F.min("message_id").alias("_copy")))


def join_runs(agg: DataFrame, boot_table: DataFrame) -> DataFrame:
    """Per-message rows (a ``last`` struct: ts, event, broker, boot, peer) beside the
    run that last held the message and, after a forward, the peer's run then."""
    runs = boot_table.select(F.col("broker").alias("_b"), F.col("boot").alias("_boot"),
                             F.col("next_started_ts").alias("holder_restarted_ts"),
                             F.col("next_broker").alias("_h_next"),
                             F.col("clean_stop").alias("_h_clean"),
                             F.col("exact").alias("_h_exact"))
    # The runs are few (one row per broker run): broadcast, never a shuffle of the
    # per-message rows.
    joined = agg.join(F.broadcast(runs), (F.col("last.broker") == F.col("_b"))
                      & (F.col("last.boot") == F.col("_boot")), "left")
    # The run of the peer a message was last forwarded to, at the time of the forward.
    peers = boot_table.select(F.col("broker").alias("_p"), F.col("started_ts").alias("_p0"),
                              F.col("next_started_ts").alias("_p_restarted"),
                              F.col("clean_stop").alias("_p_clean"),
                              F.col("exact").alias("_p_exact"))
    return joined.join(F.broadcast(peers), (F.col("last.event") == tr.FORWARDED)
                       & (F.col("last.peer") == F.col("_p")) & (F.col("_p0") <= F.col("last.ts"))
                       & (F.col("_p_restarted").isNull()
                          | (F.col("last.ts") < F.col("_p_restarted"))), "left")


def journey_columns(joined: DataFrame, *, start: Column, arrivals: Column, possible: Column,
                    acked_delivery: Column, delivered_by: Column) -> DataFrame:
    """The journeys' columns and verdicts from per-message rows beside their runs
    (``join_runs``). ``start``: the message's first acceptance (else its first event)
    as a struct (ts, broker, destination, persistent, size); ``arrivals``: brokers in
    order of arrival; ``possible``: the deliveries a crash may have hidden included;
    ``acked_delivery``: the timestamp of the delivery the consumer acked;
    ``delivered_by``: the brokers that delivered it, sorted."""
    deliveries = F.col("deliveries")
    # No traced arrival (sampling, a lost trace file): the broker it was last seen on.
    path = F.when(F.size(arrivals) > 0, arrivals).otherwise(F.array(F.col("last.broker")))
    restarted = F.col("holder_restarted_ts").isNotNull()
    holder_blind = ~F.col("_h_clean") & ~F.col("_h_exact")
    peer_blind = F.col("_p_restarted").isNotNull() & ~F.col("_p_clean") & ~F.col("_p_exact")
    settled = (F.col("acks") > 0) | (F.col("dead_letters") > 0) | (F.col("expiries") > 0) \
        | (F.col("drops") > 0) | F.col("streamed")
    # Taken by its broker's restart before any delivery, but the producer sent it again
    # with its dedup-id and that copy reached a consumer: delivered, so not lost (nor
    # unknown), though not under this id.
    resent = restarted & (deliveries == 0) & ~settled & F.col("_copy").isNotNull() \
        & (F.col("_copy") != F.col("message_id"))
    # How the holder's run ended: a restart, or another broker took its lease over.
    taken_over = F.col("_h_next") != F.col("last.broker")
    ended_by = F.when(taken_over, F.concat(F.col("_h_next"), F.lit("'s takeover from "),
                                           F.col("last.broker"))) \
        .otherwise(F.concat(F.col("last.broker"), F.lit("'s restart")))
    ended = F.when(taken_over, F.concat(F.col("_h_next"), F.lit(" took over from "),
                                        F.col("last.broker"))) \
        .otherwise(F.concat(F.col("last.broker"), F.lit(" restarted")))
    resent_reason = F.concat(F.lit("taken by "), ended_by,
                             F.lit("; sent again with its dedup-id as "),
                             F.col("_copy"), F.lit(", which was delivered"))
    unknown_reason = (
        F.when(settled, F.lit(None))
        .when(peer_blind, F.concat(F.lit("forwarded to "), F.col("last.peer"),
                                   F.lit(", which crashed before its trace was complete")))
        .when(restarted & (deliveries > 0),
              F.concat(F.lit("delivered to a consumer; no ack traced before "), ended))
        .when(restarted & holder_blind,
              F.concat(F.col("last.broker"), F.lit(" crashed; its trace was not exact, so "
                                                   "a delivery after its last flush is "
                                                   "missing"))))
    status = (F.when(F.col("acks") > 0, "consumed")
              .when(F.col("dead_letters") > 0, "dead_lettered")
              .when(F.col("expiries") > 0, "expired")
              .when(F.col("drops") > 0, "dropped")
              .when(F.col("streamed"), "retained")
              .when(resent, "resent")
              .when(unknown_reason.isNotNull(), "unknown")
              .when(restarted, "lost")
              .when(F.col("last.event") == tr.FORWARDED, "in_transit")
              .otherwise("pending"))
    # Send: the first broker's acceptance, else the producer's timestamp (ms).
    sent_ts = F.coalesce(F.col("received_ts"), F.col("msg_ts") * 1000)
    return joined.select(
        "message_id", "dedup_id",
        start["broker"].alias("origin_broker"), start["destination"].alias("destination"),
        start["persistent"].alias("persistent"), start["size"].alias("size"),
        start["ts"].alias("first_ts"), "received_ts",
        path.alias("path"), F.concat_ws(">", path).alias("path_text"), "hops",
        "deliveries", possible.alias("possible_deliveries"), "acks", "redeliveries",
        "recoveries", "first_dispatch_ts", "first_ack_ts",
        ((F.col("first_dispatch_ts") - F.col("received_ts")) / 1000.0).alias("latency_ms"),
        ((F.col("first_ack_ts") - F.col("received_ts")) / 1000.0).alias("ack_latency_ms"),
        F.col("acker.broker").alias("consumed_on"),
        ((acked_delivery - sent_ts) / 1000.0).alias("e2e_latency_ms"),
        F.col("last.ts").alias("last_ts"), F.col("last.event").alias("last_event"),
        F.col("last.broker").alias("last_broker"), F.col("last.boot").alias("last_boot"),
        F.col("last.destination").alias("last_destination"),
        "drop_reason", "holder_restarted_ts", status.alias("status"),
        F.when(resent, resent_reason).otherwise(unknown_reason).alias("reason"),
        delivered_by.alias("delivered_by"))


def lost(journey_table: DataFrame) -> DataFrame:
    return (journey_table.where(F.col("status") == "lost")
            .select("message_id", "dedup_id", "origin_broker", "destination", "persistent",
                    "path_text", "last_event", "last_broker", "last_destination", "last_ts",
                    "holder_restarted_ts")
            .transform(lambda f: sorted_small(f, "last_ts", "message_id")))


def duplicates(journey_table: DataFrame) -> DataFrame:
    """Messages delivered more than once, and producer resends of one dedup id;
    ``delivered_by``: the brokers that delivered them (the journeys' column)."""
    journey_table = journey_table.where(
        (F.col("deliveries") > 1) | (F.col("dedup_id").isNotNull() & (F.col("deliveries") > 0)))
    redelivered = (journey_table.where(F.col("deliveries") > 1)
                   .select(F.col("message_id").alias("key"), F.lit("redelivered").alias("kind"),
                           F.array("message_id").alias("message_ids"), "destination",
                           "deliveries", "acks", "delivered_by"))
    resent = (journey_table.where(F.col("dedup_id").isNotNull() & (F.col("deliveries") > 0))
              .groupBy("dedup_id")
              .agg(F.array_sort(F.collect_list("message_id")).alias("message_ids"),
                   F.first("destination").alias("destination"),
                   F.sum("deliveries").alias("deliveries"), F.sum("acks").alias("acks"),
                   F.array_sort(F.array_distinct(F.flatten(F.collect_list("delivered_by"))))
                   .alias("delivered_by"))
              .where(F.size("message_ids") > 1)
              .select(F.col("dedup_id").alias("key"), F.lit("resent").alias("kind"),
                      "message_ids", "destination", "deliveries", "acks", "delivered_by"))
    return sorted_small(redelivered.unionByName(resent), "kind", "key")


_PERCENTILES = [0.5, 0.95, 0.99]


def sorted_small(frame: DataFrame, *cols: str | Column) -> DataFrame:
    """``frame`` sorted, for a small frame: one partition sorted in place, the same
    order as ``orderBy`` without its sampling job and range shuffle. ``coalesce``,
    not ``repartition``: the one partition is read straight from the aggregation
    before it, without a shuffle (and the Spark job adaptive execution runs for it)."""
    return frame.coalesce(1).sortWithinPartitions(*cols)


def journey_stats(journey_table: DataFrame) -> DataFrame:
    """The per-status, per-path and per-destination-and-path aggregates of the
    journeys in one pass (one scan and one shuffle instead of one per table): a row
    per group, ``table`` saying which (``summary``, ``paths``, ``latency``). Small:
    ``summary``, ``paths`` and ``latency`` select from it."""
    timed = F.col("latency_ms").isNotNull()
    text = F.lit(None).cast("string")
    double = F.lit(None).cast("double")

    def key(table: str, k1: Column, k2: Column, hops: Column, with_latency: bool) -> Column:
        return F.struct(F.lit(table).alias("table"), k1.alias("k1"), k2.alias("k2"),
                        hops.alias("hops"),
                        (F.col("status") == "consumed").alias("consumed"),
                        (F.col("latency_ms") if with_latency else double).alias("lat"),
                        (F.col("e2e_latency_ms") if with_latency else double).alias("e2e"),
                        (F.col("hops") if with_latency else F.lit(None).cast("long"))
                        .alias("lat_hops"))

    keyed = journey_table.select(F.explode(F.array(
        key("summary", F.col("status"), text, F.lit(None).cast("long"), False),
        key("paths", F.col("path_text"), text, F.col("hops"), False),
        # Latency counts only messages with a broker latency.
        F.when(timed, key("latency", F.col("path_text"), F.col("destination"),
                          F.lit(None).cast("long"), True)))).alias("k")).where(
        F.col("k").isNotNull()).select("k.*")
    return (keyed.groupBy("table", "k1", "k2", "hops")
            .agg(F.count("*").alias("messages"),
                 F.sum(F.when(F.col("consumed"), 1).otherwise(0)).alias("consumed"),
                 F.percentile_approx("lat", _PERCENTILES, 10_000).alias("q"),
                 F.max("lat").alias("max_ms"), F.avg("lat_hops").alias("avg_hops"),
                 F.percentile_approx("e2e", _PERCENTILES, 10_000).alias("e"),
                 F.max("e2e").alias("e2e_max_ms")))


def _latency_stats(df: DataFrame, *keys: str) -> DataFrame:
    timed = df.where(F.col("latency_ms").isNotNull())
    return (timed.groupBy(*keys)
            .agg(F.count("*").alias("messages"),
                 F.percentile_approx("latency_ms", _PERCENTILES, 10_000).alias("q"),
                 F.max("latency_ms").alias("max_ms"), F.avg("hops").alias("avg_hops"),
                 F.percentile_approx("e2e_latency_ms", _PERCENTILES, 10_000).alias("e"),
                 F.max("e2e_latency_ms").alias("e2e_max_ms"))
            .select(*keys, "messages", F.col("q")[0].alias("p50_ms"),
                    F.col("q")[1].alias("p95_ms"), F.col("q")[2].alias("p99_ms"), "max_ms",
                    "avg_hops", F.col("e")[0].alias("e2e_p50_ms"),
                    F.col("e")[1].alias("e2e_p95_ms"), F.col("e")[2].alias("e2e_p99_ms"),
                    "e2e_max_ms")
            .orderBy(*keys))


def latency(journey_table: DataFrame, stats: DataFrame | None = None) -> DataFrame:
    """Broker latency (accepted -> first dispatch) per destination and path, and
    end-to-end latency (``e2e_*``: send -> delivery to the consumer that acked).
    ``stats``: ``journey_stats`` of the journeys, when already computed."""
    if stats is None:
        return _latency_stats(journey_table, "destination", "path_text")
    return sorted_small(
        stats.where(F.col("table") == "latency")
        .select(F.col("k2").alias("destination"), F.col("k1").alias("path_text"),
                "messages", F.col("q")[0].alias("p50_ms"), F.col("q")[1].alias("p95_ms"),
                F.col("q")[2].alias("p99_ms"), "max_ms", "avg_hops",
                F.col("e")[0].alias("e2e_p50_ms"), F.col("e")[1].alias("e2e_p95_ms"),
                F.col("e")[2].alias("e2e_p99_ms"), "e2e_max_ms"),
        "destination", "path_text")


def paths(journey_table: DataFrame, stats: DataFrame | None = None) -> DataFrame:
    """How many messages took each path (brokers in order) and with how many hops."""
    if stats is not None:
        return sorted_small(
            stats.where(F.col("table") == "paths")
            .select(F.col("k1").alias("path_text"), "hops", "messages", "consumed"),
            F.desc("messages"), "path_text")
    return (journey_table.groupBy("path_text", "hops")
            .agg(F.count("*").alias("messages"),
                 F.sum(F.when(F.col("status") == "consumed", 1).otherwise(0))
                 .alias("consumed"))
            .orderBy(F.desc("messages"), "path_text"))


def stuck(journey_table: DataFrame, events: DataFrame, *, older_than_ms: int,
          now_ts: int | None = None, stats: DataFrame | None = None,
          served_table: DataFrame | None = None) -> DataFrame:
    """Messages pending for longer than ``older_than_ms`` (measured to ``now_ts``, by
    default the newest event). ``consumers_elsewhere``: another broker dispatched
    messages of the same destination after this one got stuck, so consumers exist
    there but not here. ``served_table``: ``served``'s rows, when already known."""
    if now_ts is None:
        now_ts = events.agg(F.max("ts").alias("now")).collect()[0]["now"] or 0
    pending = journey_table.where(F.col("status") == "pending").withColumn(
        "age_ms", (F.lit(now_ts) - F.col("last_ts")) / 1000.0).where(
        F.col("age_ms") > older_than_ms)
    last_served = served(events, stats) if served_table is None else served_table
    elsewhere = pending.join(
        last_served, (F.col("served_destination") == F.col("last_destination"))
        & (F.col("served_broker") != F.col("last_broker"))
        & (F.col("served_ts") > F.col("last_ts")), "left")
    return (elsewhere.groupBy("message_id", "last_broker", "last_destination", "last_event",
                              "last_ts", "age_ms")
            .agg(F.collect_set("served_broker").alias("served_by"))
            .withColumn("consumers_elsewhere", F.size("served_by") > 0)
            .transform(lambda f: sorted_small(f, "last_ts", "message_id")))


_THROUGHPUT_KINDS = (tr.RECEIVED, tr.RECEIVED_FROM_BRIDGE, tr.DISPATCHED, tr.DELIVERED,
                    tr.ACKED, tr.FORWARDED)


def event_stats(events: DataFrame, window: str = "10 seconds") -> DataFrame:
    """The events counted per window and broker (``throughput``), per window and
    bridge (``bridges``) and the last delivery per broker and destination (``served``,
    for ``stuck``) in one pass over the events, a row per group, ``table`` saying
    which. Small: ``throughput``, ``bridges`` and ``stuck`` select from it."""
    start = F.window(F.timestamp_micros("ts"), window)["start"]
    text = F.lit(None).cast("string")

    def key(table: str, w: Column, event: Column, peer: Column, connector: Column,
            destination: Column) -> Column:
        return F.struct(F.lit(table).alias("table"), w.alias("window_start"),
                        F.col("broker").alias("broker"), event.alias("event"),
                        peer.alias("peer"), connector.alias("connector"),
                        destination.alias("destination"), F.col("ts").alias("ts"),
                        F.col("size").alias("size"))

    ev = F.col("event")
    keyed = (events.where(ev.isin(*_THROUGHPUT_KINDS)).select(F.explode(F.array(
        key("throughput", start, ev, text, text, text),
        F.when(ev == tr.FORWARDED,
               key("bridges", start, text, F.col("peer"), F.col("connector"), text)),
        F.when(ev.isin(tr.DISPATCHED, tr.DELIVERED),
               key("served", F.lit(None).cast("timestamp"), text, text, text,
                   F.col("destination"))))).alias("k"))
        .where(F.col("k").isNotNull()).select("k.*"))
    return (keyed.groupBy("table", "window_start", "broker", "event", "peer", "connector",
                          "destination")
            .agg(F.count("*").alias("events"), F.sum("size").alias("bytes"),
                 F.max("ts").alias("last_ts")))


def served(events: DataFrame, stats: DataFrame | None = None) -> DataFrame:
    """The last delivery to a consumer per broker and destination."""
    if stats is not None:
        return stats.where(F.col("table") == "served").select(
            F.col("broker").alias("served_broker"),
            F.col("destination").alias("served_destination"),
            F.col("last_ts").alias("served_ts"))
    return (events.where(F.col("event").isin(tr.DISPATCHED, tr.DELIVERED))
            .groupBy(F.col("broker").alias("served_broker"),
                     F.col("destination").alias("served_destination"))
            .agg(F.max("ts").alias("served_ts")))


def with_time(events: DataFrame) -> DataFrame:
    return events.withColumn("time", F.timestamp_micros("ts"))


def throughput(events: DataFrame, window: str = "10 seconds",
               stats: DataFrame | None = None) -> DataFrame:
    """Events per broker, kind and time window (messages in, out, acked, forwarded).
    ``stats``: ``event_stats`` of the events, when already computed."""
    if stats is not None:
        return sorted_small(
            stats.where(F.col("table") == "throughput")
            .select("window_start", "broker", "event", "events", "bytes"),
            "window_start", "broker", "event")
    return (with_time(events.where(F.col("event").isin(*_THROUGHPUT_KINDS)))
            .groupBy(F.window("time", window).alias("w"), "broker", "event")
            .agg(F.count("*").alias("events"), F.sum("size").alias("bytes"))
            .select(F.col("w.start").alias("window_start"), "broker", "event", "events",
                    "bytes")
            .orderBy("window_start", "broker", "event"))


def bridges(events: DataFrame, window: str = "10 seconds",
            stats: DataFrame | None = None) -> DataFrame:
    """Messages forwarded per bridge (broker -> peer over connector) and time window."""
    if stats is not None:
        return sorted_small(
            stats.where(F.col("table") == "bridges")
            .select("window_start", "broker", "peer", "connector",
                    F.col("events").alias("messages"), "bytes"),
            "window_start", "broker", "peer")
    return (with_time(events.where(F.col("event") == tr.FORWARDED))
            .groupBy(F.window("time", window).alias("w"), "broker", "peer", "connector")
            .agg(F.count("*").alias("messages"), F.sum("size").alias("bytes"))
            .select(F.col("w.start").alias("window_start"), "broker", "peer", "connector",
                    "messages", "bytes")
            .orderBy("window_start", "broker", "peer"))


def summary(journey_table: DataFrame, stats: DataFrame | None = None) -> DataFrame:
    """Message counts per status (every status present, zero if none)."""
    if stats is None:
        counts = journey_table.agg(*[
            F.sum(F.when(F.col("status") == s, 1).otherwise(0)).alias(s) for s in STATUSES])
    else:
        per_status = stats.where(F.col("table") == "summary")
        counts = per_status.agg(*[
            F.sum(F.when(F.col("k1") == s, F.col("messages")).otherwise(0)).alias(s)
            for s in STATUSES])
    pairs = ", ".join(f"'{s}', coalesce({s}, 0L)" for s in STATUSES)
    return counts.selectExpr(f"stack({len(STATUSES)}, {pairs}) as (status, messages)")
