"""Write a small audit table from the driver: one Arrow collect, one Parquet file.

Every audit table but the journeys holds a few hundred rows at most. Spark's own
writer spends several short jobs and a commit protocol on each (tasks, a job commit,
a rename per file); collecting the rows once as Arrow and writing the one file here
costs a single job. The layout and file content stay what Spark's writer makes: a
directory with one ``part-*.parquet`` file and ``_SUCCESS``, snappy, timestamps in
the physical type ``spark.sql.parquet.outputTimestampType`` names, and Spark's own
schema in the footer (so Spark reads back exactly the types it wrote). A location on
another filesystem (``hdfs://``, ``s3a://``) is written to a local temporary
directory and uploaded through Hadoop's FileSystem API (``meshmq.pipeline.paths``).
"""

from __future__ import annotations

import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from meshmq.pipeline import paths

# The footer key Spark reads its own schema from (ParquetReadSupport).
_SPARK_SCHEMA_KEY = b"org.apache.spark.sql.parquet.row.metadata"


def _timestamp_options(spark: SparkSession) -> dict[str, Any]:
    kind = spark.conf.get("spark.sql.parquet.outputTimestampType", "INT96") or "INT96"
    if kind.upper() == "INT96":
        return {"use_deprecated_int96_timestamps": True}
    unit = "ms" if kind.upper() == "TIMESTAMP_MILLIS" else "us"
    return {"coerce_timestamps": unit, "allow_truncated_timestamps": unit == "ms"}


def write_local(spark: SparkSession, table: Any, schema_json: str, directory: Path) -> None:
    """``table`` (a pyarrow Table) as Spark would write it, replacing ``directory``."""
    import pyarrow.parquet as pq

    schema = table.schema.with_metadata({_SPARK_SCHEMA_KEY: schema_json.encode()})
    staging = directory.parent / f".{directory.name}.{uuid.uuid4().hex}"
    staging.mkdir(parents=True)
    try:
        # store_schema=False: no Arrow schema in the footer, as in Spark's files, so
        # pyarrow readers see the same types (strings, INT96 as nanoseconds) either way.
        pq.write_table(table.cast(schema), staging / f"part-00000-{uuid.uuid4()}-c000"
                       ".snappy.parquet", compression="snappy", store_schema=False,
                       **_timestamp_options(spark))
        (staging / "_SUCCESS").touch()
        shutil.rmtree(directory, ignore_errors=True)
        staging.rename(directory)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def write(frame: DataFrame, location: str, local_dir: Path | None) -> None:
    """``frame`` collected once and written to ``location``; ``local_dir``: the local
    directory ``location`` resolves to (``paths.output_local_dir``), None when it is
    on another filesystem."""
    spark = frame.sparkSession
    table = frame.toArrow()
    schema_json = frame.schema.json()
    if local_dir is not None:
        write_local(spark, table, schema_json, local_dir)
        return
    with tempfile.TemporaryDirectory(prefix="meshmq-table-") as tmp:
        staged = Path(tmp) / "table"
        write_local(spark, table, schema_json, staged)
        paths.replace_dir(spark, staged, location)
