"""The asyncio failover client (STOMP or MQTT) — ActiveMQ's ``failover:`` for Python.

One supervisor task owns the connection: it walks the reconnect schedule
(:mod:`meshmq.backoff`), and after every (re)connect restores the subscriptions and
lets waiting operations through. Operations never touch a dead socket for long: a
dropped connection fails what was waiting on it at once, and the operation retries
on the next connection (sends keep their ``dedup-id``, so meshmq stores them once)
or raises what the application must know (transactions).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import random
import ssl
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from meshmq.backoff import ReconnectSchedule
from meshmq.protocol.mqtt import topic_matches
from meshmq.uri import URIError

from .connection import BaseConnection, Dialer, dial_tcp
from .dedup import DuplicateFilter
from .errors import (
    AuthenticationFailedError,
    BrokerError,
    CertificateError,
    ClientClosedError,
    ClientError,
    ConnectionFailedError,
    ConnectionLostError,
    OperationTimeoutError,
    ProtocolVersionRefusedError,
    TlsSetupError,
    TransactionInDoubtError,
    TransactionRolledBackError,
)
from .mqtt_connection import MqttConnection
from .options import Endpoint, FailoverSpec, parse_failover
from .stomp_connection import StompConnection
from .tls import TlsSettings, client_context
from .types import DEDUP_HEADER, AckMode, Event, EventKind, Message, SubscriptionSpec

log = logging.getLogger("meshmq.client")

__all__ = ["FailoverClient", "Subscription", "Transaction"]

ORPHAN_LIMIT = 10_000  # MQTT messages kept for a subscription not yet re-made
EventCallback = Callable[[Event], None]
MessageCallback = Callable[[Message], None]


@dataclass(eq=False)
class Subscription:
    """A subscription that survives failover. Read with ``await sub.get()`` or
    ``async for msg in sub``, or give ``callback=`` to ``subscribe``."""

    spec: SubscriptionSpec
    client: FailoverClient
    callback: MessageCallback | None = None
    queue: asyncio.Queue[Message] = field(default_factory=asyncio.Queue)
    filter: DuplicateFilter = field(default_factory=DuplicateFilter)
    duplicates: int = 0  # duplicates dropped by the filter
    active: bool = True
    confirmed: bool = False  # the broker accepted it once: restore it after failover
    # Headers of the broker's latest confirmation (STOMP RECEIPT; a stream destination's
    # carries its x-stream-first / x-stream-next offsets); replaced at every restore.
    receipt: dict[str, str] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return self.spec.id

    async def get(self, timeout: float | None = None) -> Message:
        """The next message; ``OperationTimeoutError`` after ``timeout`` seconds."""
        try:
            async with asyncio.timeout(timeout):
                return await self.queue.get()
        except TimeoutError:
            raise OperationTimeoutError(
                f"no message on {self.spec.destination!r} within {timeout:g} s") from None

    def __aiter__(self) -> AsyncIterator[Message]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Message]:
        while self.active:
            yield await self.queue.get()

    async def unsubscribe(self, *, remove_durable: bool = False) -> None:
        await self.client.unsubscribe(self, remove_durable=remove_durable)


@dataclass(eq=False)
class Transaction:
    """A STOMP transaction, bound to the connection it began on."""

    id: str
    generation: int
    lost: bool = False
    done: bool = False


class FailoverClient:
    """Connect with ``await client.connect()``; use as ``async with FailoverClient(...)``.

    ``uri``: ``failover:(stomp://a:61613,stomp://b:61613)?randomize=false`` or one
    endpoint. ``protocol`` (``"stomp"``/``"mqtt"``) is taken from the schemes when
    omitted. ``durable=True`` (MQTT) keeps a persistent session under ``client_id``.
    ``dialer`` opens each broker connection (default: TCP, with TLS where the endpoint
    asks for it); it receives the endpoint and its TLS context.
    """

    def __init__(self, uri: str, *, protocol: str | None = None, login: str | None = None,
                 passcode: str | None = None, client_id: str | None = None,
                 heartbeat_ms: tuple[int, int] = (5000, 5000), mqtt_version: int | None = None,
                 keep_alive: int = 30, durable: bool = False,
                 on_event: EventCallback | None = None, rng: random.Random | None = None,
                 spec: FailoverSpec | None = None,
                 give_up_on_auth_failure: bool = True,
                 ssl_cafile: str | os.PathLike[str] | None = None,
                 ssl_certfile: str | os.PathLike[str] | None = None,
                 ssl_keyfile: str | os.PathLike[str] | None = None,
                 ssl_key_password: str | None = None,
                 ssl_verify: bool = True, dialer: Dialer | None = None) -> None:
        self.spec = spec or parse_failover(uri, protocol=protocol)
        # How each broker connection is opened: TCP (and TLS) unless another is given.
        self.dialer: Dialer = dialer or dial_tcp
        if ssl_keyfile is not None and ssl_certfile is None:
            raise ClientError("ssl_keyfile needs ssl_certfile (the client certificate the "
                              "key belongs to)")
        # TLS endpoints (ssl://, stomp+ssl://, mqtts://, wss://) verify the broker's
        # certificate; URI options (trustStore, keyStore, ...) override these per endpoint.
        self.tls = TlsSettings(
            cafile=None if ssl_cafile is None else os.fspath(ssl_cafile),
            certfile=None if ssl_certfile is None else os.fspath(ssl_certfile),
            keyfile=None if ssl_keyfile is None else os.fspath(ssl_keyfile),
            key_password=ssl_key_password, verify=ssl_verify)
        self._contexts: dict[TlsSettings, ssl.SSLContext] = {}
        for endpoint in self.spec.endpoints:  # a file that cannot be used fails here
            self._tls_context(endpoint)
        self.options = self.spec.options
        self.protocol = self.spec.endpoints[0].protocol
        if durable and self.protocol == "mqtt" and not client_id:
            raise ClientError("a durable MQTT session needs a client_id")
        self.login, self.passcode, self.client_id = login, passcode, client_id
        # A refused login is permanent (as ActiveMQ's JMSSecurityException): stop and say
        # so, instead of retrying for ever. False: log it and try the next broker.
        self.give_up_on_auth_failure = give_up_on_auth_failure
        self.heartbeat_ms = heartbeat_ms
        self.mqtt_version, self.keep_alive, self.durable = mqtt_version, keep_alive, durable
        self._listeners: list[EventCallback] = [on_event] if on_event else []
        self._rng = rng or random.Random()
        self._static = list(self.spec.endpoints)
        self.schedule: ReconnectSchedule[Endpoint] = ReconnectSchedule(
            self._static, self.options.policy(), priority=self.spec.priority_endpoints(),
            rng=self._rng)
        self._conn: BaseConnection | None = None
        self._generation = 0
        self._ready = asyncio.Event()
        self._changed = asyncio.Event()  # pulsed on every state change
        self._subs: dict[str, Subscription] = {}
        self._txs: dict[str, Transaction] = {}
        self._sub_ids = itertools.count(1)
        self._failure: BaseException | None = None
        self._closed = False
        self._supervisor: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[Any]] = set()
        self._switch: BaseConnection | None = None
        self._orphans: list[Message] = []  # MQTT messages that arrived before subscribe()
        self._backups: dict[Endpoint, BaseConnection] = {}  # hot standbys (backup=true)
        self._mqtt_levels: dict[Endpoint, int] = {}  # learnt per broker (automatic version)
        self._prefix = uuid.uuid4().hex[:12]
        self._dedup_seq = itertools.count(1)
        self.tracked_bytes = 0
        self.stats = {"reconnects": 0, "resent": 0, "duplicates": 0, "dropped_acks": 0,
                      "backup_used": 0}

    # ------------------------------------------------------------- lifecycle

    def add_listener(self, callback: EventCallback) -> None:
        self._listeners.append(callback)

    @property
    def connected(self) -> bool:
        return self._ready.is_set()

    @property
    def endpoint(self) -> Endpoint | None:
        return None if self._conn is None else self._conn.endpoint

    @property
    def endpoints(self) -> tuple[Endpoint, ...]:
        return self.schedule.endpoints

    @property
    def backup_endpoints(self) -> tuple[Endpoint, ...]:
        """Brokers with an open hot-standby connection (``backup=true``)."""
        return tuple(e for e, c in self._backups.items() if not c.closed.is_set())

    async def connect(self, timeout: float | None = None) -> None:
        """Connect to the first broker that answers (startupMaxReconnectAttempts bounds
        the tries; ``timeout`` seconds, or the failover ``timeout``, bounds the wait)."""
        if self._closed:
            raise ClientClosedError("the client is closed")
        await self._wait_ready(self._deadline(timeout))

    async def __aenter__(self) -> FailoverClient:
        await self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Disconnect politely and stop reconnecting. Pending operations fail."""
        if self._closed:
            return
        self._closed = True
        self._pulse()
        for sub in self._subs.values():
            sub.active = False
        if self._supervisor is not None:
            self._supervisor.cancel()
            with contextlib.suppress(BaseException):
                await self._supervisor
        for task in list(self._background):
            task.cancel()
        for task in list(self._background):
            with contextlib.suppress(BaseException):
                await task
        if self._conn is not None:
            await self._conn.close()
        for backup in list(self._backups.values()):
            await backup.close(timeout=1.0)
        self._backups.clear()
        self._ready.clear()

    def is_closed(self) -> bool:
        return self._closed

    def _deadline(self, timeout: float | None = None) -> float | None:
        t = self.options.timeout_s if timeout is None else timeout
        return None if t is None else asyncio.get_running_loop().time() + t

    def _pulse(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def _emit(self, event: Event) -> None:
        for callback in list(self._listeners):
            try:
                callback(event)
            except Exception:
                log.exception("failover event listener failed on %s", event.kind.value)

    async def _wait_ready(self, deadline: float | None) -> BaseConnection:
        loop = asyncio.get_running_loop()
        if self._supervisor is None and not self._closed:
            # An operation before connect() connects (as ActiveMQ's lazy start does).
            self._supervisor = asyncio.create_task(self._run(), name="failover supervisor")
        while True:
            if self._closed:
                raise ClientClosedError("the client is closed")
            if isinstance(self._failure, AuthenticationFailedError):
                raise AuthenticationFailedError(f"failover gave up: {self._failure}")
            if isinstance(self._failure, CertificateError):
                raise CertificateError(f"failover gave up: {self._failure}")
            if self._failure is not None:
                raise ConnectionFailedError(f"failover gave up: {self._failure}")
            if self._ready.is_set() and self._conn is not None \
                    and not self._conn.closed.is_set():
                return self._conn
            changed = self._changed
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                raise OperationTimeoutError(
                    f"not connected to any of {', '.join(map(str, self.endpoints))} within "
                    f"the timeout (failover timeout={self.options.timeout} ms)")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await changed.wait()

    # ------------------------------------------------------------ supervisor

    def _tls_context(self, endpoint: Endpoint) -> ssl.SSLContext | None:
        """One context per distinct setting (CA files are read once, the opt-out warned
        once); pushed peers share the client's."""
        if not endpoint.tls:
            return None
        settings = endpoint.tls_settings(self.tls)
        ctx = self._contexts.get(settings)
        if ctx is None:
            ctx = self._contexts[settings] = client_context(settings, str(endpoint))
        return ctx

    def _new_connection(self, endpoint: Endpoint) -> BaseConnection:
        tls = self._tls_context(endpoint)
        self._generation += 1
        if self.protocol == "stomp":
            return StompConnection(endpoint, self._on_message, self._generation,
                                   login=self.login, passcode=self.passcode,
                                   client_id=self.client_id, heartbeat_ms=self.heartbeat_ms,
                                   tls=tls, dialer=self.dialer)
        level = self.mqtt_version or self._mqtt_levels.get(endpoint, 5)
        return MqttConnection(endpoint, self._on_message, self._generation, login=self.login,
                              passcode=self.passcode, client_id=self.client_id,
                              keep_alive=self.keep_alive, version=level,
                              durable=self.durable, tls=tls, dialer=self.dialer)

    async def _open(self, endpoint: Endpoint) -> BaseConnection:
        """A connected, handshaken connection to ``endpoint``. With the MQTT version left
        automatic, a broker that refuses MQTT 5 is asked again with 3.1.1 (remembered)."""
        conn = self._new_connection(endpoint)
        try:
            await conn.open()
        except ProtocolVersionRefusedError:
            if self.mqtt_version is not None or self._mqtt_levels.get(endpoint) == 4:
                raise
            self._mqtt_levels[endpoint] = 4
            conn = self._new_connection(endpoint)
            try:
                await conn.open()
            except BaseException:
                # 3.1.1 fails too: the broker was just going away, not old; unlearn.
                del self._mqtt_levels[endpoint]
                raise
            log.info("%s does not speak MQTT 5: using MQTT 3.1.1 with it", endpoint)
        return conn

    async def _establish(self) -> BaseConnection | None:
        await self._read_uris_url()
        backup = self._take_backup()
        if backup is not None:
            log.info("failing over to the pre-opened backup connection to %s",
                     backup.endpoint)
            self.stats["backup_used"] += 1
            self.schedule.connected(backup.endpoint, asyncio.get_running_loop().time())
            return backup
        warn_every = self.options.warnAfterReconnectAttempts
        failures = 0
        last_error: BaseException | None = None
        while (attempt := self.schedule.next_attempt()) is not None:
            if attempt.delay > 0:
                await asyncio.sleep(attempt.delay)  # the policy's back-off delay
            try:
                conn = await self._open(attempt.endpoint)
            except (AuthenticationFailedError, CertificateError) as exc:
                last_error = exc
                if self.give_up_on_auth_failure:
                    break
                log.warning("%s", exc)
                continue
            except TlsSetupError as exc:  # a CA or key file of a URI read later
                last_error = exc
                log.error("%s", exc)
                continue
            except BrokerError as exc:  # another broker may differ
                last_error = exc
                log.warning("%s", exc)
                continue
            except (ConnectionLostError, OSError) as exc:
                last_error = exc
                failures += 1
                if warn_every and failures % warn_every == 0:
                    log.warning("failover: %d failed connection attempts, last: %s",
                                failures, exc)
                continue
            self.schedule.connected(attempt.endpoint, asyncio.get_running_loop().time())
            return conn
        self._failure = last_error or ConnectionFailedError("no reconnect attempts allowed")
        return None

    async def _run(self) -> None:
        first = True
        loop = asyncio.get_running_loop()
        try:
            while not self._closed:
                conn = self._switch or await self._establish()
                self._switch = None
                if conn is None:
                    self._fail_all()
                    return
                self._conn = conn
                self._apply_topology(conn)
                try:
                    await self._restore(conn)
                except ConnectionLostError:
                    self.schedule.lost(loop.time())
                    await conn.close(timeout=0)
                    continue
                self._ready.set()
                self._pulse()
                self._emit(Event(EventKind.CONNECTED if first else EventKind.RESUMED,
                                 conn.endpoint, peers=conn.peers))
                if not first:
                    self.stats["reconnects"] += 1
                first = False
                self._maybe_probe_priority(conn)
                self._maybe_keep_backups(conn)
                await conn.closed.wait()
                self._ready.clear()
                self._lose_transactions()
                if self.is_closed():
                    return
                if self._switch is None:
                    self.schedule.lost(loop.time())
                self._pulse()
                log.info("connection to %s lost: %s", conn.endpoint, conn.error)
                self._emit(Event(EventKind.INTERRUPTED, conn.endpoint, error=conn.error))
                await conn.close(timeout=0)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug here must not leave operations waiting for ever
            log.exception("failover supervisor crashed")
            self._failure = exc
            self._fail_all()

    def _fail_all(self) -> None:
        self._ready.clear()
        self._pulse()
        self._emit(Event(EventKind.FAILED, error=self._failure))
        log.error("failover: giving up: %s", self._failure)

    async def _restore(self, conn: BaseConnection) -> None:
        for sub in list(self._subs.values()):
            if not sub.confirmed:
                continue  # its subscribe() call is still under way and will send it
            try:
                sub.receipt = await conn.subscribe(sub.spec)
            except BrokerError as exc:
                log.error("could not restore subscription to %r: %s", sub.spec.destination,
                          exc)

    def _lose_transactions(self) -> None:
        # The Transaction objects remember it; the next use raises the right error.
        for tx in self._txs.values():
            tx.lost = True
        self._txs.clear()

    # ---------------------------------------------------------------- topology

    def _apply_topology(self, conn: BaseConnection) -> None:
        if not self.options.updateURIsSupported or not conn.peers:
            return
        pushed = self._dialable(conn.peers)
        merged = list(dict.fromkeys([*self._static, *pushed]))
        if merged != list(self.schedule.endpoints):
            self.schedule.update_endpoints(merged)
            self._emit(Event(EventKind.TOPOLOGY, conn.endpoint, peers=conn.peers))

    def _dialable(self, uris: tuple[str, ...] | list[str]) -> list[Endpoint]:
        result: list[Endpoint] = []
        for text in uris:
            try:
                result.extend(parse_failover(text, protocol=self.protocol).endpoints)
            except (URIError, ValueError) as exc:
                log.debug("ignoring peer URI %r: %s", text, exc)
        return result

    async def _read_uris_url(self) -> None:
        url = self.options.updateURIsURL
        if not url:
            return
        path = url.removeprefix("file://")
        try:
            text = await asyncio.to_thread(Path(path).read_text)
        except OSError as exc:
            log.warning("updateURIsURL %s: %s", url, exc)
            return
        found = self._dialable([u.strip() for u in text.replace("\n", ",").split(",")
                                if u.strip()])
        if found:
            self.schedule.update_endpoints(list(dict.fromkeys([*self._static, *found])))

    # ------------------------------------------------------------------ backups

    def _backups_wanted(self) -> bool:
        # A persistent MQTT session lives on one broker at a time: a backup connection
        # would take it over, so durable MQTT clients keep no hot standby.
        return self.options.backup and self.options.backupPoolSize > 0 and not (
            self.protocol == "mqtt" and self.durable)

    def _take_backup(self) -> BaseConnection | None:
        for endpoint in self.schedule.endpoints:  # in list order
            conn = self._backups.pop(endpoint, None)
            if conn is None:
                continue
            if not conn.closed.is_set():
                return conn
        return None

    def _maybe_keep_backups(self, conn: BaseConnection) -> None:
        if not self._backups_wanted():
            return
        task = asyncio.create_task(self._keep_backups(conn), name="backup pool")
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _keep_backups(self, current: BaseConnection) -> None:
        """backup=true: keep up to backupPoolSize connections to other brokers open (and
        handshaken), so a failover needs no connect at all."""
        period = max(self.options.initialReconnectDelay / 1000, 0.5)
        while not current.closed.is_set() and not self._closed:
            for endpoint, conn in list(self._backups.items()):
                if conn.closed.is_set() or endpoint == current.endpoint:
                    self._backups.pop(endpoint, None)
                    await conn.close(timeout=0)
            for endpoint in self.schedule.endpoints:
                if len(self._backups) >= self.options.backupPoolSize:
                    break
                if endpoint == current.endpoint or endpoint in self._backups:
                    continue
                try:
                    conn = await self._open(endpoint)
                except (ClientError, OSError) as exc:
                    log.debug("backup connection to %s: %s", endpoint, exc)
                    continue
                if current.closed.is_set() or self._closed:
                    await conn.close()
                    return
                self._backups[endpoint] = conn
            await asyncio.sleep(period)  # pool upkeep period

    def _maybe_probe_priority(self, conn: BaseConnection) -> None:
        priority = self.spec.priority_endpoints()
        if not priority or conn.endpoint in priority:
            return
        task = asyncio.create_task(self._probe_priority(conn, priority), name="priority probe")
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _probe_priority(self, current: BaseConnection,
                              priority: tuple[Endpoint, ...]) -> None:
        """priorityBackup: while on a secondary broker, keep trying the preferred ones and
        move back as soon as one answers."""
        delay = max(self.options.initialReconnectDelay / 1000, 0.1)
        while not current.closed.is_set() and not self._closed:
            for endpoint in priority:
                try:
                    conn = await self._open(endpoint)
                except (ClientError, OSError):
                    continue
                if current.closed.is_set() or self._closed:
                    await conn.close()
                    return
                log.info("priority broker %s is back: moving there", endpoint)
                self.schedule.connected(endpoint, asyncio.get_running_loop().time())
                self._switch = conn
                current.abort("moving to a priority broker")
                return
            await asyncio.sleep(delay)  # probe period
            delay = min(delay * 2, self.options.maxReconnectDelay / 1000)

    # ---------------------------------------------------------------- messages

    def _route(self, msg: Message) -> Subscription | None:
        if self.protocol == "stomp":
            return self._subs.get(msg.subscription)
        for sub in self._subs.values():
            if topic_matches(sub.spec.destination, msg.destination):
                return sub
        return None

    def _on_message(self, msg: Message) -> None:
        sub = self._route(msg)
        if sub is None or not sub.active:
            if self.protocol == "mqtt" and len(self._orphans) < ORPHAN_LIMIT:
                # A persistent MQTT session delivers its backlog right after CONNACK,
                # before the application has subscribed again: keep it for subscribe().
                self._orphans.append(msg)
            else:
                log.debug("message for unknown subscription %r dropped", msg.subscription)
            return
        msg.subscription = sub.id
        conn = self._conn
        auto = sub.spec.ack is AckMode.AUTO
        if self.options.checkForDuplicates and sub.filter.is_duplicate(msg.key,
                                                                     msg.redelivered):
            sub.duplicates += 1
            self.stats["duplicates"] += 1
            if conn is not None and conn.generation == msg.generation:
                # The app already has (and acked) it: settle the copy with the broker.
                self._spawn(self._settle(conn, msg, sub))
            return
        if auto:
            sub.filter.add(msg.key)
            if isinstance(conn, MqttConnection) and conn.generation == msg.generation:
                conn.auto_ack(msg)
        else:
            sub.filter.hold(msg.key)
        if sub.callback is not None:
            try:
                sub.callback(msg)
            except Exception:
                log.exception("message callback failed")
        else:
            sub.queue.put_nowait(msg)

    def _adopt_orphans(self) -> None:
        orphans, self._orphans = self._orphans, []
        for msg in orphans:
            self._on_message(msg)

    async def _settle(self, conn: BaseConnection, msg: Message, sub: Subscription) -> None:
        if isinstance(conn, MqttConnection):
            conn.auto_ack(msg)
            return
        with contextlib.suppress(ClientError):
            await conn.ack(msg, sub.spec)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # -------------------------------------------------------------- operations

    def new_dedup_id(self) -> str:
        return f"{self._prefix}-{next(self._dedup_seq)}"

    async def send(self, destination: str, body: bytes | str,
                   headers: dict[str, str] | None = None, *, persistent: bool = True,
                   confirm: bool = True, transaction: Transaction | None = None,
                   dedup_id: str | None = None, qos: int = 1, retain: bool = False,
                   timeout: float | None = None) -> str:
        """Send and (by default) wait for the broker's confirmation (STOMP receipt,
        MQTT PUBACK). Across a failover the send is repeated with the same ``dedup-id``
        until confirmed or ``timeout`` (default: the failover ``timeout``) passes.
        Returns the ``dedup-id``."""
        data = body.encode() if isinstance(body, str) else body
        dedup_id = dedup_id or self.new_dedup_id()
        hdrs = dict(headers or {})
        hdrs[DEDUP_HEADER] = dedup_id
        if self.protocol == "stomp" and persistent:
            hdrs.setdefault("persistent", "true")
        extra: dict[str, Any] = {}
        if self.protocol == "mqtt":
            extra = {"qos": qos, "retain": retain}
        if transaction is not None:
            await self._tx_send(transaction, destination, data, hdrs, extra)
            return dedup_id
        if not confirm:
            if self.options.trackMessages and \
                    self.tracked_bytes + len(data) <= self.options.maxCacheSize:
                self.tracked_bytes += len(data)
                self._spawn(self._tracked(destination, data, hdrs, extra, timeout))
                return dedup_id
            conn = await self._wait_ready(self._deadline(timeout))
            await conn.send(destination, data, hdrs, confirm=False, **extra)
            await conn.drain()
            return dedup_id
        await self._confirmed_send(destination, data, hdrs, extra, timeout)
        return dedup_id

    async def _tracked(self, destination: str, data: bytes, hdrs: dict[str, str],
                       extra: dict[str, Any], timeout: float | None) -> None:
        try:
            await self._confirmed_send(destination, data, hdrs, extra, timeout)
        except ClientError as exc:
            log.warning("tracked send to %r (dedup-id %s) failed: %s", destination,
                        hdrs[DEDUP_HEADER], exc)
        finally:
            self.tracked_bytes -= len(data)

    async def _confirmed_send(self, destination: str, data: bytes, hdrs: dict[str, str],
                              extra: dict[str, Any], timeout: float | None) -> None:
        deadline = self._deadline(timeout)
        attempt = 0
        while True:
            conn = await self._wait_ready(deadline)
            if attempt:
                self.stats["resent"] += 1
            attempt += 1
            try:
                await self._bounded(self._replied(conn, conn.send(
                    destination, data, hdrs, confirm=True, **extra)), deadline)
                return
            except ConnectionLostError:
                continue  # re-sent on the next connection with the same dedup-id

    async def _replied(self, conn: BaseConnection, aw: Any) -> Any:
        """replyTimeout: a broker that does not confirm in time is treated as dead (the
        connection is dropped and the operation fails over) instead of waiting for the
        heart-beats to notice."""
        limit = self.options.reply_timeout_s
        if limit is None:
            return await aw
        try:
            async with asyncio.timeout(limit):
                return await aw
        except TimeoutError:
            conn.abort(f"no confirmation within replyTimeout={self.options.replyTimeout} ms")
            raise ConnectionLostError(f"{conn.endpoint}: no confirmation in time") from None

    async def _bounded(self, aw: Any, deadline: float | None) -> Any:
        if deadline is None:
            return await aw
        remaining = deadline - asyncio.get_running_loop().time()
        try:
            async with asyncio.timeout(max(remaining, 0)):
                return await aw
        except TimeoutError:
            raise OperationTimeoutError("no confirmation from the broker within the "
                                        "timeout") from None

    async def subscribe(self, destination: str, *, ack: str | AckMode = AckMode.AUTO,
                        durable_name: str | None = None, selector: str | None = None,
                        qos: int = 1, headers: dict[str, str] | None = None,
                        callback: MessageCallback | None = None, id: str | None = None,
                        timeout: float | None = None) -> Subscription:
        """Subscribe (STOMP destination or MQTT topic filter); restored after failover."""
        mode = AckMode(ack) if isinstance(ack, str) else ack
        if durable_name is not None and self.protocol == "stomp" and not self.client_id:
            raise ClientError("a durable subscription needs the client's client_id")
        spec = SubscriptionSpec(id or f"sub-{next(self._sub_ids)}", destination, mode,
                                durable_name, selector, qos, dict(headers or {}))
        if spec.id in self._subs:
            raise ClientError(f"subscription id {spec.id!r} is already in use")
        sub = Subscription(spec, self, callback, filter=DuplicateFilter(
            self.options.auditDepth if self.options.checkForDuplicates else 0))
        self._subs[spec.id] = sub
        deadline = self._deadline(timeout)
        while True:
            conn = await self._wait_ready(deadline)
            try:
                sub.receipt = await self._bounded(self._replied(conn, conn.subscribe(spec)),
                                                  deadline)
                sub.confirmed = True
                self._adopt_orphans()
                return sub
            except ConnectionLostError:
                continue
            except BaseException:
                self._subs.pop(spec.id, None)
                raise

    async def unsubscribe(self, sub: Subscription, *, remove_durable: bool = False) -> None:
        sub.active = False
        self._subs.pop(sub.id, None)
        conn = self._conn
        if conn is None or not self._ready.is_set():
            return  # not restored on the next connection, which is all that is needed
        with contextlib.suppress(ConnectionLostError):
            await conn.unsubscribe(sub.spec, remove_durable=remove_durable)

    async def ack(self, msg: Message, *, transaction: Transaction | None = None) -> bool:
        """Acknowledge; False if the message came on an earlier connection (the broker
        will redeliver it, and the duplicate filter settles that copy for you)."""
        return await self._ack(msg, True, transaction)

    async def nack(self, msg: Message, *, transaction: Transaction | None = None) -> bool:
        return await self._ack(msg, False, transaction)

    async def _ack(self, msg: Message, positive: bool, tx: Transaction | None) -> bool:
        sub = self._subs.get(msg.subscription)
        if sub is None:
            return False
        sub.filter.release(msg.key)
        if positive:
            sub.filter.add(msg.key)
        conn = self._conn
        if conn is None or conn.generation != msg.generation or conn.closed.is_set():
            self.stats["dropped_acks"] += 1
            return False
        try:
            await conn.ack(msg, sub.spec, positive=positive,
                           transaction=None if tx is None else tx.id)
        except ConnectionLostError:
            self.stats["dropped_acks"] += 1
            return False
        return True

    # ------------------------------------------------------------ transactions

    async def begin(self, timeout: float | None = None) -> Transaction:
        if self.protocol != "stomp":
            raise ClientError("MQTT has no transactions (use STOMP)")
        deadline = self._deadline(timeout)
        while True:
            conn = await self._wait_ready(deadline)
            tx = Transaction(f"tx-{self._prefix}-{next(self._dedup_seq)}", conn.generation)
            try:
                await self._bounded(conn.begin(tx.id), deadline)
            except ConnectionLostError:
                continue
            self._txs[tx.id] = tx
            return tx

    def _tx_conn(self, tx: Transaction) -> BaseConnection:
        if tx.done and not tx.lost:
            raise ClientError(f"transaction {tx.id} is already finished")
        conn = self._conn
        if tx.lost or conn is None or conn.generation != tx.generation \
                or conn.closed.is_set():
            tx.lost = tx.done = True
            self._txs.pop(tx.id, None)
            raise TransactionRolledBackError(
                f"transaction {tx.id} was rolled back: the connection it ran on was lost "
                "before COMMIT; nothing of it took effect, redo it")
        return conn

    async def _tx_send(self, tx: Transaction, destination: str, data: bytes,
                       hdrs: dict[str, str], extra: dict[str, Any]) -> None:
        conn = self._tx_conn(tx)
        try:
            await conn.send(destination, data, hdrs, transaction=tx.id, **extra)
        except ConnectionLostError:
            tx.lost = True
            self._tx_conn(tx)

    async def commit(self, tx: Transaction) -> None:
        """Commit. ``TransactionRolledBackError`` if the connection was lost before,
        ``TransactionInDoubtError`` if it was lost while waiting for the answer."""
        conn = self._tx_conn(tx)
        try:
            await conn.commit(tx.id)
        except ConnectionLostError:
            raise TransactionInDoubtError(
                f"transaction {tx.id}: the connection was lost after COMMIT was sent and "
                "before the broker confirmed it; it may or may not have been committed") \
                from None
        finally:
            tx.done = True
            self._txs.pop(tx.id, None)

    async def abort(self, tx: Transaction) -> None:
        try:
            conn = self._tx_conn(tx)
        except TransactionRolledBackError:
            return  # already rolled back by the broker
        try:
            await conn.abort_tx(tx.id)
        except ConnectionLostError:
            pass  # the broker rolls back a transaction whose connection is gone
        finally:
            tx.done = True
            self._txs.pop(tx.id, None)
