"""``spark.readStream.format("meshmq")`` and ``df.writeStream.format("meshmq")``.

A PySpark Python Data Source (pyspark >= 4.0; admission control and availableNow
need 4.2). Register it once per session with ``register(spark)``.

Reading a **stream destination** (``[[streams]]``): offsets are the stream's own,
``{"offset": n}`` = the next offset to read. The driver only asks the broker for the
stream's head (the RECEIPT of a SUBSCRIBE carries ``x-stream-first``/``x-stream-next``);
executors read exact offset ranges, ``partitionSize`` messages per partition, each
over its own connection with ``x-stream-offset=offset=<start>``. A restarted query
asks for the same ranges and gets the same rows: exactly-once into an idempotent sink.
If retention removed offsets a batch needs, the read fails (``failOnDataLoss``, the
default) or skips them.

Reading a **queue** (``mode=queue``): messages are consumed with client acks and
acknowledged only when Spark commits the batch, so at-least-once: see
``QueueReader`` for exactly what can be delivered twice.

Every connection is meshmq's failover client (meshmq.pipeline.broker_client): a broker
that dies is left for the next one; a read task re-subscribes at its range's start
there and skips by offset what it already has; the sink re-sends unconfirmed sends.

Writing: every row becomes a persistent message sent with a ``dedup-id`` of
``<producerId>:<batchId>:<partition>:<row>``. A batch that Spark runs again after a
crash produces the same ids, and the broker's idempotent-producer window
(``broker.duplicate_window``) drops what it already has: exactly-once into meshmq as
long as one batch fits in the window. After the broker's own crash (or a slave's
takeover) the next broker refills the window from the dedup ids it still stores, so a
re-send of a send stored but never confirmed is dropped too; only one whose original a
consumer had already acked before the crash is stored again (a row there twice, both
copies with one dedup-id: consumers deduplicate on ``dedup-id``, as meshmq's client does).

Options (all strings):

=====================  ==========================================================
``url``                ``failover:(stomp://a:61613,stomp://b:61613)?options`` (the
                       failover client's URI, docs/client.md) or plain addresses
                       (``host:port``, ``a:1,b:2``); required. ``brokers``: its old
                       name. See meshmq.pipeline.broker_client for the reconnect limit
``destination``        ``/queue/name`` (``name`` alone means a queue); required
                       for reading, optional for writing when rows have one
``login``/``passcode`` credentials: the job's user, whose destination rights apply
``trustStore``         TLS: the CA bundle (PEM) that signed the brokers' certificates
                       (default: the system's); ``ssl://``/``stomp+ssl://`` addresses
                       are TLS, and every address is once trustStore or keyStore is set
``keyStore``           TLS: a client certificate (PEM) to present
``keyStoreKey``        TLS: its private key (PEM), unless ``keyStore`` holds it
``keyStorePassword``   TLS: the passphrase of an encrypted key
``verifyHostName``     TLS: ``true`` (default) checks the certificate's host name
``mode``               ``stream`` (default) or ``queue`` (reading)
``bodyType``           ``string`` (default) or ``binary``: the ``body`` column's type
``startingOffset``     ``first`` (default), ``next``, or an offset (stream mode)
``maxRowsPerBatch``    rows per micro-batch (default 10000; 0 = everything there)
``partitionSize``      messages per read partition (default 5000, stream mode)
``failOnDataLoss``     ``true`` (default): fail when retention removed needed data
``prefetch``           queue mode: unacked messages the broker may send (default
                       3 x maxRowsPerBatch: the acks of a batch come a batch late)
``producerId``         writing: prefix of the dedup ids (default: the query's id)
=====================  ==========================================================
"""

# ruff: noqa: N802, N803 - the method and argument names are PySpark's API

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import logging
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from meshmq.client.errors import ClientError
from meshmq.client.types import Message
from meshmq.core.stream import FIRST_HEADER, NEXT_HEADER, OFFSET_HEADER
from meshmq.pipeline.broker_client import (
    ClientSettings,
    JobClient,
    StompIOError,
    build_spec,
    one_line,
)

try:  # pyspark >= 4.2: admission control and Trigger.AvailableNow
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadLimit,
        ReadMaxRows,
        SupportsTriggerAvailableNow,
    )
except ImportError:  # pragma: no cover - pyspark 4.0/4.1
    ReadLimit = ReadMaxRows = ReadAllAvailable = None  # type: ignore[assignment,misc]
    SupportsTriggerAvailableNow = object  # type: ignore[assignment,misc]

log = logging.getLogger("meshmq.pipeline.datasource")

NAME = "meshmq"
READ_TIMEOUT_S = 30.0  # a connected broker silent this long while a range is unread
_SKIP_HEADERS = frozenset({"subscription", "ack", "content-length", "message-id",
                           "destination", "timestamp", OFFSET_HEADER})


class DataLossError(StompIOError):
    code = "data-loss"
    retriable = False


@dataclasses.dataclass(frozen=True)
class Options:
    """The parsed options; plain data, so readers and writers pickle."""

    url: str
    destination: str | None
    login: str | None = None
    passcode: str | None = None
    mode: str = "stream"
    binary: bool = False
    starting_offset: str = "first"
    max_rows: int = 10_000
    partition_size: int = 5000
    fail_on_data_loss: bool = True
    prefetch: int = 0
    producer_id: str | None = None
    trust_store: str | None = None
    key_store: str | None = None
    key_store_key: str | None = None
    key_store_password: str | None = None
    verify_host_name: bool = True

    @classmethod
    def parse(cls, raw: Mapping[str, str], *, reading: bool) -> Options:
        opts = {k.lower(): v for k, v in raw.items()}

        def number(name: str, default: int, low: int) -> int:
            text = opts.get(name.lower())
            if text is None:
                return default
            try:
                value = int(text)
            except ValueError:
                value = low - 1
            if value < low:
                raise ValueError(f"meshmq option {name} must be an integer >= {low}, "
                                 f"got {text!r}")
            return value

        url = opts.get("url") or opts.get("brokers")  # brokers: the option's old name
        if not url:
            raise ValueError("meshmq option 'url' is required, e.g. "
                             "failover:(stomp://127.0.0.1:61613,stomp://127.0.0.1:61614)")
        destination = opts.get("destination")
        if destination is not None and not destination.startswith("/"):
            destination = f"/queue/{destination}"
        if reading and not destination:
            raise ValueError("meshmq option 'destination' is required for reading")
        mode = opts.get("mode", "stream")
        if mode not in ("stream", "queue"):
            raise ValueError(f"meshmq option mode must be 'stream' or 'queue', got {mode!r}")
        body = opts.get("bodytype", "string")
        if body not in ("string", "binary"):
            raise ValueError(f"meshmq option bodyType must be 'string' or 'binary', "
                             f"got {body!r}")
        start = opts.get("startingoffset", "first")
        if start not in ("first", "next") and not start.isdigit():
            raise ValueError(f"meshmq option startingOffset must be first, next or an "
                             f"offset, got {start!r}")
        loss = opts.get("failondataloss", "true").lower()
        if loss not in ("true", "false"):
            raise ValueError(f"meshmq option failOnDataLoss must be true or false, "
                             f"got {loss!r}")
        verify = opts.get("verifyhostname", "true").lower()
        if verify not in ("true", "false"):
            raise ValueError(f"meshmq option verifyHostName must be true or false, "
                             f"got {verify!r}")
        if "keystorekey" in opts and "keystore" not in opts:
            raise ValueError("meshmq option keyStoreKey needs keyStore (the client "
                             "certificate the key belongs to)")
        max_rows = number("maxRowsPerBatch", 10_000, 0)
        # Parsed here, on the driver, so a bad URI fails the query at once, in one line.
        build_spec(url, tls_only=bool(opts.get("truststore") or opts.get("keystore")))
        return cls(url=url, destination=destination, login=opts.get("login"),
                   passcode=opts.get("passcode"), mode=mode, binary=body == "binary",
                   starting_offset=start, max_rows=max_rows,
                   partition_size=number("partitionSize", 5000, 1),
                   fail_on_data_loss=loss == "true",
                   prefetch=number("prefetch", 3 * max_rows if max_rows else 30_000, 1),
                   producer_id=opts.get("producerid"), trust_store=opts.get("truststore"),
                   key_store=opts.get("keystore"), key_store_key=opts.get("keystorekey"),
                   key_store_password=opts.get("keystorepassword"),
                   verify_host_name=verify == "true")

    def settings(self) -> ClientSettings:
        return ClientSettings(self.url, login=self.login, passcode=self.passcode,
                              trust_store=self.trust_store, key_store=self.key_store,
                              key_store_key=self.key_store_key,
                              key_store_password=self.key_store_password,
                              verify_host_name=self.verify_host_name)

    def client(self) -> JobClient:
        """A connected failover client (created where it is used: never pickled)."""
        return JobClient(self.settings())


def schema_ddl(binary: bool) -> str:
    body = "BINARY" if binary else "STRING"
    return (f"offset BIGINT, message_id STRING, destination STRING, timestamp TIMESTAMP, "
            f"body {body}, headers MAP<STRING, STRING>")


def _row(frame: Any, binary: bool, offset: int | None) -> tuple[Any, ...]:
    headers = dict(frame.headers)
    ts_text = headers.get("timestamp")
    ts = dt.datetime.fromtimestamp(int(ts_text) / 1000, dt.UTC) if ts_text else None
    body = bytes(frame.body) if binary else bytes(frame.body).decode("utf-8", "replace")
    return (offset, headers.get("message-id"), headers.get("destination"), ts, body,
            {k: v for k, v in headers.items() if k not in _SKIP_HEADERS})


class MeshmqDataSource(DataSource):
    """``format("meshmq")``: see the module docstring for the options."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        return schema_ddl(self.options.get("bodyType", self.options.get("bodytype"))
                          == "binary")

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        options = Options.parse(self.options, reading=True)
        if options.mode == "queue":
            return QueueReader(options)
        return StreamReader(options)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return Writer(Options.parse(self.options, reading=False), schema)


def register(spark: Any) -> None:
    """Make ``format("meshmq")`` available in ``spark``."""
    spark.dataSource.register(MeshmqDataSource)


# ----------------------------------------------------------------------------- streams

@dataclasses.dataclass(frozen=True)
class RangePartition(InputPartition):
    """Offsets [start, end) of the stream."""

    start: int
    end: int

    def __init__(self, start: int, end: int) -> None:  # InputPartition has its own init
        object.__setattr__(self, "start", start)
        object.__setattr__(self, "end", end)
        object.__setattr__(self, "value", (start, end))


def stream_head(options: Options, client: JobClient | None = None) -> tuple[int, int]:
    """(first retained offset, next offset) of the stream: the RECEIPT of a SUBSCRIBE
    carries both. ``client``: one to reuse (else one is opened for this question)."""
    if client is None:
        with options.client() as own:
            return stream_head(options, own)
    assert options.destination is not None
    sub = client.subscribe(options.destination, id=f"head-{uuid.uuid4().hex[:8]}",
                           headers={OFFSET_HEADER: "next", "activemq.prefetchSize": "1"})
    try:
        receipt = sub.inner.receipt
    finally:
        client.call(sub.unsubscribe)
    first, nxt = receipt.get(FIRST_HEADER), receipt.get(NEXT_HEADER)
    if first is None or nxt is None:
        raise StompIOError(f"{options.destination} is not a stream destination (no "
                           f"{NEXT_HEADER} in the subscription's receipt); use "
                           "mode=queue for queues", retriable=False)
    return int(first), int(nxt)


def split(start: int, end: int, size: int) -> list[RangePartition]:
    """[start, end) cut into consecutive ranges of at most ``size`` offsets."""
    return [RangePartition(s, min(s + size, end)) for s in range(start, end, size)]


class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Exact offset ranges of a stream destination (see the module docstring)."""

    def __init__(self, options: Options) -> None:
        self.options = options  # plain data only: this object is pickled to executors
        self.key = uuid.uuid4().hex  # the driver's client, in _HEAD_CLIENTS
        self._target: int | None = None
        self._last: int | None = None

    def _head(self) -> tuple[int, int]:
        """The stream's head over one failover client kept for the query's life."""
        with _SESSIONS_LOCK:
            client = _HEAD_CLIENTS.get(self.key)
        if client is None:
            client = self.options.client()
            with _SESSIONS_LOCK:
                _HEAD_CLIENTS[self.key] = client
        return stream_head(self.options, client)

    def initialOffset(self) -> dict[str, int]:
        start = self.options.starting_offset
        if start.isdigit():
            return {"offset": int(start)}
        first, nxt = self._head()
        return {"offset": first if start == "first" else nxt}

    def getDefaultReadLimit(self) -> Any:
        if ReadMaxRows is None or not self.options.max_rows:
            return ReadAllAvailable() if ReadAllAvailable is not None else None
        return ReadMaxRows(self.options.max_rows)

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._head()[1]

    def latestOffset(self, start: dict[str, int] | None = None, limit: Any = None
                     ) -> dict[str, int]:
        if start is not None:
            begin = int(start["offset"])
        elif self._last is not None:
            begin = self._last
        else:
            begin = self.initialOffset()["offset"]
        end = self._head()[1]
        if self._target is not None:
            end = min(end, self._target)
        if ReadMaxRows is not None and isinstance(limit, ReadMaxRows):
            end = min(end, begin + limit.max_rows)
        elif limit is None and self.options.max_rows:  # pyspark 4.0/4.1
            end = min(end, begin + self.options.max_rows)
        self._last = max(begin, end)
        return {"offset": self._last}

    def partitions(self, start: dict[str, int], end: dict[str, int]
                   ) -> Sequence[InputPartition]:
        return split(int(start["offset"]), int(end["offset"]), self.options.partition_size)

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        assert isinstance(partition, RangePartition)
        yield from read_range(self.options, partition.start, partition.end)

    def commit(self, end: dict[str, int]) -> None:
        """Nothing to do: the checkpoint is the only cursor (the stream keeps data)."""

    def stop(self) -> None:
        with _SESSIONS_LOCK:
            client = _HEAD_CLIENTS.pop(self.key, None)
        if client is not None:
            client.close()


def read_range(options: Options, start: int, end: int) -> Iterator[tuple[Any, ...]]:
    """The messages at offsets [start, end) of the stream, in order.

    Across a failover the client subscribes again at ``start`` on the next broker (the
    same store: the same offsets); what was already read is skipped by offset."""
    if start >= end:
        return
    assert options.destination is not None
    window = max(1, min(1000, end - start))
    with options.client() as client:
        sub = client.subscribe(options.destination, ack="client", headers={
            "activemq.prefetchSize": str(window), OFFSET_HEADER: f"offset={start}"})
        expected = start
        unacked = 0
        quiet_since = time.monotonic()
        while expected < end:
            msg = client.next_message(sub, 1.0)
            if msg is None:
                if not client.connected:  # failing over: the silence is not the broker's
                    quiet_since = time.monotonic()
                elif time.monotonic() - quiet_since > READ_TIMEOUT_S:
                    raise StompIOError(f"timed out reading offset {expected} of "
                                       f"{options.destination}")
                continue
            quiet_since = time.monotonic()
            unacked += 1
            if unacked * 2 >= window:  # cumulative ack: reopen the prefetch window
                client.ack(msg)
                unacked = 0
            offset = int(msg.headers.get(OFFSET_HEADER) or -1)
            if offset < expected:
                continue  # read before a failover
            if offset > expected and options.fail_on_data_loss:
                raise DataLossError(
                    f"offsets {expected}..{min(offset, end) - 1} of {options.destination} "
                    "are gone (stream retention); set failOnDataLoss=false to skip them",
                    retriable=False)
            if offset >= end:
                break
            yield _row(msg, options.binary, offset)
            expected = offset + 1


# ----------------------------------------------------------------------------- queues

@dataclasses.dataclass(frozen=True)
class RowsPartition(InputPartition):
    rows: tuple[tuple[Any, ...], ...]

    def __init__(self, rows: tuple[tuple[Any, ...], ...]) -> None:
        object.__setattr__(self, "rows", rows)
        object.__setattr__(self, "value", None)


class _QueueSession:
    """The driver runner's consumer of a queue, kept out of the (pickled) reader."""

    def __init__(self, options: Options) -> None:
        assert options.destination is not None
        self.client = options.client()
        self.sub = self.client.subscribe(options.destination, ack="client-individual",
                                         headers={"activemq.prefetchSize":
                                                  str(options.prefetch)})
        self.buffer: list[tuple[int, Message, tuple[Any, ...]]] = []  # (seq, msg, row)
        self.seq = 0

    def poll(self, options: Options, want: int) -> None:
        while len(self.buffer) < want:
            msg = self.client.next_message(self.sub, 0.05 if self.buffer else 0.2)
            if msg is None:
                return
            self.seq += 1
            self.buffer.append((self.seq, msg, _row(msg, options.binary, None)))


_SESSIONS: dict[str, _QueueSession] = {}
_HEAD_CLIENTS: dict[str, JobClient] = {}  # stream readers' driver clients
_SESSIONS_LOCK = threading.Lock()


class QueueReader(DataSourceStreamReader):
    """At-least-once from a queue: acknowledged when Spark commits the batch.

    The driver runner holds one client-individual subscription (in a module-level
    table, so the reader itself stays picklable) and numbers what arrives; a batch's
    rows travel to the executors inside its partitions; ``commit(end)`` acks every
    message up to ``end``. Spark calls ``commit`` for batch N when it builds batch
    N+1, so acks lag one batch and the broker must be allowed at least two batches
    unacked (``prefetch``, default 3 x maxRowsPerBatch) or the query stalls.

    What can arrive twice: everything not yet acked when the query (or the driver,
    or the broker connection) dies: the last batch before a stop is never acked, and
    a batch Spark re-runs after a crash is returned empty (its rows were only in the
    dead process) while the broker redelivers those messages into later batches,
    with ``redelivered: true`` in ``headers``. Deduplicate on ``message_id``
    downstream (e.g. ``dropDuplicatesWithinWatermark``) if that matters.
    """

    def __init__(self, options: Options) -> None:
        self.options = options
        self.key = uuid.uuid4().hex
        self._last = 0

    def _session(self) -> _QueueSession:
        with _SESSIONS_LOCK:
            session = _SESSIONS.get(self.key)
            if session is None:
                session = _SESSIONS[self.key] = _QueueSession(self.options)
            return session

    def initialOffset(self) -> dict[str, int]:
        return {"seq": 0}

    def latestOffset(self, start: dict[str, int] | None = None, limit: Any = None
                     ) -> dict[str, int]:
        session = self._session()
        begin = int(start["seq"]) if start is not None else self._last
        if session.seq < begin:  # a new driver runner after a restart: continue numbering
            session.seq = begin
            session.buffer = [(s + begin, a, r) for s, a, r in session.buffer]
        want = self.options.max_rows or 1 << 30
        if ReadMaxRows is not None and isinstance(limit, ReadMaxRows):
            want = limit.max_rows
        pending = [b for b in session.buffer if b[0] > begin]
        session.poll(self.options, want + len(session.buffer) - len(pending))
        pending = [b for b in session.buffer if b[0] > begin][:want]
        self._last = pending[-1][0] if pending else begin
        return {"seq": self._last}

    def partitions(self, start: dict[str, int], end: dict[str, int]
                   ) -> Sequence[InputPartition]:
        lo, hi = int(start["seq"]), int(end["seq"])
        rows = tuple(r for s, _, r in self._session().buffer if lo < s <= hi)
        if len(rows) < hi - lo:
            log.warning("queue batch (%d, %d] is being re-run after a restart: its messages "
                        "come again, redelivered, in later batches", lo, hi)
            return []
        size = self.options.partition_size
        return [RowsPartition(rows[i:i + size]) for i in range(0, len(rows), size)]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        assert isinstance(partition, RowsPartition)
        yield from partition.rows

    def commit(self, end: dict[str, int]) -> None:
        session = self._session()
        upto = int(end["seq"])
        keep = []
        for seq, msg, row in session.buffer:
            if seq <= upto:
                # False: it came before a failover; the broker redelivers it (at least once)
                session.client.ack(msg)
            else:
                keep.append((seq, msg, row))
        session.buffer = keep

    def stop(self) -> None:
        with _SESSIONS_LOCK:
            session = _SESSIONS.pop(self.key, None)
        if session is not None:
            session.client.close()


# ----------------------------------------------------------------------------- sink

SEND_WINDOW = 256  # confirmed sends in flight per write task


async def send_confirmed(settings: ClientSettings,
                         messages: Iterable[tuple[str, bytes, dict[str, str], str]]) -> int:
    """Send every (destination, body, headers, dedup id) persistently and wait for the
    broker's receipt of each; returns how many. A send cut off by a broker's death is
    sent again on the next broker with its dedup id (stored once by a broker whose
    window holds the id; a broker that crashed took its window with it)."""
    client = settings.asyncio_client()
    in_flight: set[asyncio.Task[str]] = set()
    count = 0
    try:
        await client.connect()
        for dest, data, headers, dedup in messages:
            if len(in_flight) >= SEND_WINDOW:
                done, in_flight = await asyncio.wait(in_flight,
                                                     return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    task.result()
            in_flight.add(asyncio.create_task(client.send(dest, data, headers,
                                                          dedup_id=dedup)))
            count += 1
        await asyncio.gather(*in_flight)
        return count
    except ClientError as exc:
        raise StompIOError(f"{settings.url}: {one_line(exc)}",
                           retriable=exc.retriable) from None
    finally:
        for task in in_flight:
            task.cancel()
        await asyncio.gather(*in_flight, return_exceptions=True)
        await client.close()


@dataclasses.dataclass(frozen=True)
class SentMessages(WriterCommitMessage):
    partition: int
    count: int


class Writer(DataSourceStreamWriter):
    """Rows -> persistent messages with deterministic dedup ids (module docstring).

    Columns: ``body`` (string or binary, required), optional ``destination`` (per
    row, else the ``destination`` option) and ``headers`` (map of strings)."""

    def __init__(self, options: Options, schema: StructType) -> None:
        names = set(schema.fieldNames())
        if "body" not in names:
            raise ValueError("the meshmq sink needs a 'body' column (string or binary)")
        if "destination" not in names and not options.destination:
            raise ValueError("the meshmq sink needs the 'destination' option or a "
                             "'destination' column")
        self.options = options
        self.has_headers = "headers" in names
        self.has_destination = "destination" in names

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        from pyspark import TaskContext

        context = TaskContext.get()
        assert context is not None
        batch = context.getLocalProperty("streaming.sql.batchId")
        producer = self.options.producer_id or context.getLocalProperty(
            "sql.streaming.queryId") or "meshmq-sink"
        partition = context.partitionId()
        prefix = f"{producer}:{batch}:{partition}"

        def messages() -> Iterator[tuple[str, bytes, dict[str, str], str]]:
            for i, row in enumerate(iterator):
                body = row["body"]
                data = body.encode() if isinstance(body, str) else bytes(body or b"")
                dest = (row["destination"] if self.has_destination else None) or \
                    self.options.destination
                if dest is None:
                    raise ValueError(f"row {i} has no destination")
                if not dest.startswith("/"):
                    dest = f"/queue/{dest}"
                headers = {str(k): str(v) for k, v in (row["headers"] or {}).items()} \
                    if self.has_headers else {}
                yield dest, data, headers, f"{prefix}:{i}"

        count = asyncio.run(send_confirmed(self.options.settings(), messages()))
        return SentMessages(partition, count)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        sent = sum(m.count for m in messages if isinstance(m, SentMessages))
        log.info("batch %d: %d messages confirmed by the broker", batchId, sent)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.warning("batch %d aborted; Spark runs it again and the broker drops the "
                    "messages it already has (dedup-id)", batchId)
