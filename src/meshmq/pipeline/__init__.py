"""The PySpark data pipeline over the broker's message traces and streams (docs/pipeline.md).

- ``audit`` and ``audit_job``: ``meshmq audit`` reads trace files (JSON Lines or Parquet,
  the schema of ``meshmq.core.trace``), follows every message from send to settle, and
  writes the lost, duplicated and stuck messages, latencies and paths; ``report``
  renders its Markdown report and charts. ``audit`` holds the reference transforms;
  ``catalog`` (the small tables, finished on the driver) and ``coded`` (the journeys
  over integer-coded events) compute the same tables faster.
- ``datasource``: ``format("meshmq")``, the Structured Streaming source and sink over
  stream destinations, through the public failover client (``broker_client``).

Nothing here is imported by ``import meshmq`` or by the broker: these modules import
pyspark, which comes with the ``spark`` extra.
"""
