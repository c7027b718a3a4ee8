"""Copy a meshmq stream into a queue with Spark, exactly once, upper-casing bodies.

    python examples/spark_stream_copy.py --brokers 127.0.0.1:61613 \
        --source /queue/stream.in --sink /queue/out --checkpoint /tmp/copy-ckpt

Runs until stopped (``--available-now``: until the stream's current end). Kill it at
any moment and start it again with the same checkpoint: every message reaches the
sink once (the source replays exact offset ranges, the sink's dedup ids let the
broker drop what a replayed batch already wrote, also after a broker's crash). A row
the sink's consumer acked in the instant between a crashed broker storing it and its
receipt may come twice, both copies with one ``dedup-id`` (docs/pipeline.md, the sink). Needs ``pip install 'meshmq[spark]'`` and a broker with ``[[streams]]`` matching
the source.
"""

from __future__ import annotations

import argparse

from pyspark.sql import functions as F  # noqa: N812

from meshmq.pipeline.audit_job import spark_session
from meshmq.pipeline.datasource import register


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--brokers", required=True, help="host:port or failover:(...)")
    parser.add_argument("--source", required=True, help="stream destination to read")
    parser.add_argument("--sink", required=True, help="destination to write")
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--max-rows", type=int, default=1000, help="rows per micro-batch")
    parser.add_argument("--available-now", action="store_true",
                        help="process what the stream holds now, then stop")
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args()

    spark = spark_session(args.master, app="meshmq-stream-copy")
    register(spark)
    source = (spark.readStream.format("meshmq").option("url", args.brokers)
              .option("destination", args.source)
              .option("maxRowsPerBatch", str(args.max_rows)).load())
    out = source.select(F.upper("body").alias("body"),
                        F.map_from_arrays(F.array(F.lit("source-offset")),
                                          F.array(F.col("offset").cast("string")))
                        .alias("headers"))
    writer = (out.writeStream.format("meshmq").option("url", args.brokers)
              .option("destination", args.sink)
              .option("checkpointLocation", args.checkpoint))
    writer = writer.trigger(availableNow=True) if args.available_now else \
        writer.trigger(processingTime="100 milliseconds")
    writer.start().awaitTermination()
    spark.stop()


if __name__ == "__main__":
    main()
