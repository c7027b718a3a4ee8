"""Trace and output locations as Hadoop URIs, resolved where the executors resolve them.

The audit must run where the driver's disk is not the executors' (``spark-submit`` on
YARN or a standalone cluster reading ``hdfs://`` or ``s3a://``), so a location is never
opened with ``pathlib``: it is a string handed to Hadoop's FileSystem API through the
driver's JVM gateway, which lists files for any scheme Spark can read. A plain path
(no scheme) means what it means to Spark: relative to the default filesystem
(``fs.defaultFS``; the local disk unless the cluster says otherwise).

The report is written on the driver's local disk and, when the output location is on
another filesystem, uploaded beside the tables (``publish``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from meshmq.errors import MeshmqError

JSONL_SUFFIXES = (".jsonl", ".jsonl.open")
PARQUET_SUFFIXES = (".parquet",)

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


class LocationError(MeshmqError):
    code = "audit-location"


def has_scheme(location: str) -> bool:
    """``hdfs:///x``, ``s3a://b/x``, ``file:/x``; not ``/x`` or ``x`` (nor ``C:\\x``)."""
    return bool(_SCHEME.match(location)) and not re.match(r"^[A-Za-z]:[\\/]", location)


def local_path(location: str) -> Path | None:
    """The local path a location names when no Spark is needed to tell (a plain path
    or ``file:``), else None."""
    if not has_scheme(location):
        return Path(location)
    if location.startswith("file:"):
        rest = location[len("file:"):]
        if rest.startswith("//"):
            rest = rest[2:]
            if not rest.startswith("/"):  # file://host/path: only localhost is local
                host, _, tail = rest.partition("/")
                if host not in ("", "localhost"):
                    return None
                rest = "/" + tail
        return Path(rest)
    return None


def check_local(locations: Sequence[str]) -> None:
    """A missing local trace path is a one-line error before Spark starts; remote
    locations are checked once the JVM can reach their filesystem."""
    for location in locations:
        path = local_path(location)
        if path is not None and not path.exists():
            raise LocationError(f"trace path {location} does not exist")


def _jvm(spark: SparkSession) -> tuple[Any, Any]:
    sc = spark.sparkContext
    return sc._jvm, sc._jsc.hadoopConfiguration()


def _java_message(exc: Exception) -> str:
    """The JVM exception's own one-line message (py4j's text begins with the call)."""
    java = getattr(exc, "java_exception", None)
    text = str(java.toString()) if java is not None else str(exc)
    lines = text.strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def _fs(spark: SparkSession, location: str) -> tuple[Any, Any]:
    """(FileSystem, qualified Path) for a location."""
    jvm, conf = _jvm(spark)
    try:
        path = jvm.org.apache.hadoop.fs.Path(location)
        fs = path.getFileSystem(conf)
        return fs, fs.makeQualified(path)
    except Exception as exc:  # a bad URI, no FileSystem for the scheme, no such host
        raise LocationError(f"cannot open {location}: {_java_message(exc)}") from None


def trace_files(spark: SparkSession, locations: Sequence[str]) -> tuple[list[str], list[str]]:
    """The JSON-lines and Parquet trace files under ``locations`` (files or
    directories, searched recursively), as fully qualified URIs for the executors."""
    jsonl: list[str] = []
    parquet: list[str] = []
    for location in locations:
        fs, path = _fs(spark, location)
        try:
            found_jsonl, found_parquet = _list(fs, path)
        except Exception as exc:  # the filesystem said no (permissions, unreachable)
            raise LocationError(f"cannot list {location}: {_java_message(exc)}") from None
        if found_jsonl is None:
            raise LocationError(f"trace path {location} does not exist")
        jsonl += found_jsonl
        parquet += found_parquet
    if not jsonl and not parquet:
        raise LocationError("no trace files (*.jsonl, *.jsonl.open, *.parquet) under "
                            + ", ".join(locations))
    return jsonl, parquet


def _list(fs: Any, path: Any) -> tuple[list[str] | None, list[str]]:
    """(JSON-lines files, Parquet files) at ``path``, sorted; (None, []) when it
    does not exist."""
    if not fs.exists(path):
        return None, []
    if fs.getFileStatus(path).isFile():
        name = str(path.toString())
        return ([], [name]) if name.endswith(PARQUET_SUFFIXES) else ([name], [])
    jsonl: list[str] = []
    parquet: list[str] = []
    files = fs.listFiles(path, True)
    while files.hasNext():
        name = str(files.next().getPath().toString())
        if name.endswith(JSONL_SUFFIXES):
            jsonl.append(name)
        elif name.endswith(PARQUET_SUFFIXES):
            parquet.append(name)
    return sorted(jsonl), sorted(parquet)


def output_local_dir(spark: SparkSession, out: str) -> Path | None:
    """The local directory ``out`` is, when Hadoop resolves it to the local
    filesystem (the report is then written in place), else None."""
    _, path = _fs(spark, out)
    uri = path.toUri()
    if uri.getScheme() == "file":
        return Path(uri.getPath())
    return None


def publish(spark: SparkSession, local_dir: Path, out: str, names: Sequence[str]) -> None:
    """Upload ``names`` from ``local_dir`` into the output location (overwriting)."""
    fs, path = _fs(spark, out)
    jvm, _ = _jvm(spark)
    fs.mkdirs(path)
    for name in names:
        source = local_dir / name
        if source.exists():
            fs.copyFromLocalFile(False, True, jvm.org.apache.hadoop.fs.Path(
                source.resolve().as_uri()), jvm.org.apache.hadoop.fs.Path(path, name))


def qualified(spark: SparkSession, location: str) -> str:
    """The location as Hadoop resolves it (scheme and authority filled in)."""
    _, path = _fs(spark, location)
    return str(path.toString())


def display(location: str) -> str:
    """A location as a person typed it, for messages."""
    return location if has_scheme(location) else os.path.normpath(location)


def is_dir(spark: SparkSession, location: str) -> bool:
    fs, path = _fs(spark, location)
    return bool(fs.exists(path) and fs.getFileStatus(path).isDirectory())


def replace_dir(spark: SparkSession, local_dir: Path, location: str) -> None:
    """Upload ``local_dir`` to ``location``, replacing whatever was there (a table
    written from the driver, as ``mode("overwrite")`` would)."""
    fs, path = _fs(spark, location)
    jvm, _ = _jvm(spark)
    fs.delete(path, True)
    fs.copyFromLocalFile(False, True, jvm.org.apache.hadoop.fs.Path(
        local_dir.resolve().as_uri()), path)
