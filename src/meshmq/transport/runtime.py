"""The broker runtime: wires the core, the store and the listeners to asyncio.

Work is batched per event-loop turn: protocol callbacks only *request* a pump;
the pump runs once per turn, dispatches every dirty queue, writes one store
batch and flushes each touched connection's output with one write.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import ssl
import time
from collections import deque
from typing import TYPE_CHECKING

from meshmq.config.credential_files import credential_source
from meshmq.config.model import BrokerConfig, ListenerConfig
from meshmq.core.broker import RETAINED_PREFIX, SYS_PREFIX, Broker
from meshmq.core.queue import BrowseEnd, Delivery, Outcome, Queue
from meshmq.errors import ConfigError, StoreError, describe_bind_failure
from meshmq.management.metrics import sync_histogram
from meshmq.store.base import Store
from meshmq.tls import CertificateReloader, TlsFileError, server_context
from meshmq.transport.durability import Durability
from meshmq.transport.host import Session
from meshmq.transport.mqtt_service import MqttService
from meshmq.transport.paging import PageReader
from meshmq.transport.topology import Topology, push_families

if TYPE_CHECKING:
    from meshmq.core.auth import Principal
    from meshmq.ha.controller import HaController
    from meshmq.ha.replication import ReplicatedHa
    from meshmq.transport.trace_files import HeartbeatFile, TraceSink


log = logging.getLogger("meshmq.runtime")

# How a listener's protocol is named in messages to the operator.
LISTENER_LABELS = {"stomp": "STOMP", "stomp+ssl": "STOMP over TLS", "mqtt": "MQTT",
                   "mqtt+ssl": "MQTT over TLS", "ws": "WebSocket", "wss": "WebSocket over TLS",
                   "tcp": "broker links", "ssl": "broker links over TLS",
                   "nio": "broker links"}

TIMER_INTERVAL = 0.5
SHUTDOWN_DRAIN_S = 3.0  # how long stop() waits for connections to finish closing


class _Gate:
    """Deliveries held until the store has synced a dispatch mark (see ``pump``)."""

    __slots__ = ("ready",)

    def __init__(self) -> None:
        self.ready = False


class BrokerRuntime:
    def __init__(self, config: BrokerConfig, store: Store | None = None) -> None:
        self.config = config
        # Master/slave (docs/ha.md): the lease backend is also the store's write fence.
        self.ha: HaController | ReplicatedHa | None = None
        self.deposed = False  # lost the lease (or the store refused writes) while master
        self.shutdown_requested = False  # SIGTERM/SIGINT: do not restart as a slave
        self._stop_requested = False
        # Every TLS context that presents a certificate, reloaded on SIGHUP.
        self.tls = CertificateReloader()
        fence = None
        if config.ha.mode == "replicated":
            # Each broker keeps its own journal; the master replicates it (docs/ha.md).
            from meshmq.ha.replication import ReplicatedHa

            self.ha = ReplicatedHa(config, on_lost=self._on_deposed, tls=self.tls)
            if store is None:
                store = self.ha.store
        elif config.ha.mode != "none":
            from meshmq.ha.controller import HaController
            from meshmq.ha.setup import create_backend

            backend = create_backend(config)
            fence = backend
            self.ha = HaController(backend, config.ha, mode=config.ha.mode,
                                   on_lost=self._on_deposed)
        if store is None:
            from meshmq.store.factory import create_store

            store = create_store(config, fence=fence)
        self.store = store
        self.broker = Broker(config, self.store,
                             credentials=credential_source(config.auth))
        # Dispatch marks (store.base.MarkDispatched) only where they survive a restart.
        self.broker.dispatch_marks = store.keeps_dispatch_marks
        # Every "confirm once durable" (receipts, MQTT acks, bridge acks) goes through here.
        self.durability = Durability(self.write_ops, self.store.sync,
                                     self.trace_barrier)
        # Pages of paged-out messages the core asks for (core/paging.py).
        self.pages = PageReader(self.broker, self.store, self.request_pump)
        # Outcomes waiting for a dispatch mark to be durable, in pump order; a group
        # with no gate waits only for the groups before it.
        self._held: deque[tuple[_Gate | None, list[Outcome]]] = deque()
        self._mark_syncs: set[asyncio.Task[None]] = set()
        # Peer brokers' client URIs, pushed to clients on connect (transport/topology.py).
        self.topology = Topology(config.advertised_peer_list, enabled=config.push_topology,
                                 push_to=push_families((lst.protocol, lst.update_cluster_clients)
                                                       for lst in config.listeners))
        self._push_listeners = frozenset(lst.name for lst in config.listeners
                                         if lst.update_cluster_clients)
        self.sessions: dict[str, Session] = {}  # by broker connection id
        self._all_sessions: set[Session] = set()
        self._to_flush: dict[Session, None] = {}
        self._pump_scheduled = False
        self._servers: list[asyncio.Server] = []
        self.addresses: dict[str, tuple[str, int]] = {}  # listener name -> bound address
        self._timer: asyncio.TimerHandle | None = None
        self._trace_timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopped = asyncio.Event()
        self._store_failure_logged = False
        self._management: object | None = None
        self.mqtt = MqttService(self)  # MQTT sessions, wills and teardowns
        self._sys_timer: asyncio.TimerHandle | None = None
        self._store_closed = False
        self._limits: dict[str, int] = {}  # listener -> max_connections
        self._counts: dict[str, int] = {}  # listener -> open connections
        self.started = False
        from meshmq.network.manager import NetworkManager

        self.network = NetworkManager(self)
        # Linked brokers' client URIs (from the bridge handshake) reach failover clients.
        self.topology.set_provider("network", self.network.peer_client_uris)
        self.trace_sink: TraceSink | None = None
        self._trace_flush_at = 0.0
        self._heartbeat_at = 0.0
        self._trace_boot = ""
        self._trace_exact = False
        self._trace_unflushed = False  # events in the sink's buffer, not yet at the OS
        self._heartbeat_file: HeartbeatFile | None = None
        # Read by GET /metrics (management/metrics.py) at scrape time.
        self.trace_events_written = 0
        self.trace_events_dropped = 0
        self.sync_seconds = sync_histogram()

    # ------------------------------------------------------------ trace
    def _start_trace(self) -> None:
        """Open the trace sink, then record the start and every recovered message."""
        cfg = self.config.trace
        if not cfg.enabled:
            return
        from meshmq.core.trace import BROKER_STARTED, Tracer, start_reason
        from meshmq.transport.trace_files import HeartbeatFile, JsonLinesSink, open_sink

        boot = format(time.time_ns() // 1_000_000, "x")
        self.trace_sink = open_sink(self.config.trace_directory, self.config.broker_name, boot,
                                    fmt=cfg.format, max_file_bytes=cfg.max_file_bytes,
                                    roll_interval_ms=cfg.roll_interval_ms,
                                    max_files=cfg.max_files)
        if cfg.exact and cfg.format != "jsonl":
            log.warning("trace.exact needs trace.format = \"jsonl\": an unfinished Parquet "
                        "file is lost with a crash whatever is flushed")
        self._trace_boot = boot
        self._heartbeat_file = HeartbeatFile(self.config.trace_directory,
                                             self.config.broker_name)
        # Only exact JSON lines can be relied on to hold everything confirmed.
        self._trace_exact = cfg.exact and isinstance(self.trace_sink, JsonLinesSink)
        tracer = Tracer(self.config.broker_name, sample_rate=cfg.sample_rate)
        self.broker.tracer = tracer
        tracer.broker_event(BROKER_STARTED, start_reason(
            heartbeat_ms=cfg.heartbeat_interval_ms, exact=self._trace_exact,
            previous=self._heartbeat_file.read()))
        recovered = self.broker.trace_recovered()
        log.info("tracing messages to %s (%s, sample rate %s); %d stored messages recorded",
                 self.config.trace_directory, cfg.format, cfg.sample_rate, recovered)
        self._write_trace()
        self.trace_sink.tick()
        self._heartbeat(time.monotonic())

    def _write_trace(self) -> None:
        tracer = self.broker.tracer
        if tracer is not None and tracer.events and self.trace_sink is not None:
            events = tracer.take()
            try:
                self.trace_sink.write(events)
            except OSError as exc:  # a full disk must not stop message traffic
                self.trace_events_dropped += len(events)
                log.error("trace write failed (events dropped): %s", exc)
            else:
                self.trace_events_written += len(events)
                self._trace_unflushed = True

    def trace_barrier(self) -> None:
        """In exact trace mode: every event recorded so far reaches the OS before the
        caller confirms anything (so a crash cannot lose what a client was told). Events
        written to the sink's buffer earlier, without a flush, count too."""
        if self._trace_exact and self.trace_sink is not None:
            self._write_trace()
            if self._trace_unflushed:
                self._trace_unflushed = False
                try:
                    self.trace_sink.flush()
                except OSError as exc:
                    log.error("trace flush failed: %s", exc)

    def _heartbeat(self, now: float) -> None:
        """Record a flushed ``heartbeat`` (and keep it in the heartbeat file): the audit
        bounds a crash of this run by the last one."""
        from meshmq.core.trace import HEARTBEAT

        interval = self.config.trace.heartbeat_interval_ms
        tracer = self.broker.tracer
        if interval <= 0 or tracer is None or self.trace_sink is None:
            return
        self._heartbeat_at = now + interval / 1000
        tracer.broker_event(HEARTBEAT)
        ts_us = tracer.events[-1][0] // 1000
        self._write_trace()
        try:
            self.trace_sink.flush()
            self._trace_unflushed = False
            if self._heartbeat_file is not None:
                self._heartbeat_file.write(self._trace_boot, ts_us)
        except OSError as exc:
            log.error("trace heartbeat failed: %s", exc)

    def _tick_trace(self, now: float) -> None:
        if self.trace_sink is None:
            return
        if now >= self._heartbeat_at:
            self._heartbeat(now)
        if now >= self._trace_flush_at:
            self._trace_flush_at = now + self.config.trace.flush_interval_ms / 1000
            try:
                self.trace_sink.tick()
                self._trace_unflushed = False
            except OSError as exc:
                log.error("trace flush failed: %s", exc)

    def _trace_interval(self) -> float:
        """How often (s) the trace needs a flush or a heartbeat; the housekeeping timer
        alone would stretch intervals shorter than its own to TIMER_INTERVAL."""
        cfg = self.config.trace
        if self.trace_sink is None:
            return TIMER_INTERVAL
        wanted = [cfg.flush_interval_ms] + ([cfg.heartbeat_interval_ms]
                                            if cfg.heartbeat_interval_ms > 0 else [])
        return min(wanted) / 1000

    def _on_trace_timer(self) -> None:
        assert self._loop is not None
        self._trace_timer = self._loop.call_later(self._trace_interval(), self._on_trace_timer)
        self._write_trace()
        self._tick_trace(time.monotonic())

    def _stop_trace(self) -> None:
        if self.trace_sink is None:
            return
        from meshmq.core.trace import BROKER_STOPPED

        assert self.broker.tracer is not None
        self.broker.tracer.broker_event(BROKER_STOPPED)
        ts_us = self.broker.tracer.events[-1][0] // 1000
        self._write_trace()
        self.trace_sink.close()
        if self._heartbeat_file is not None:
            with contextlib.suppress(OSError):
                self._heartbeat_file.write(self._trace_boot, ts_us)
        self.trace_sink = None
        self.broker.tracer = None

    # ------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        if self.ha is not None:
            # The management endpoint comes up first so a slave's role is visible; client
            # connectors wait until this broker holds the lease.
            try:
                await self._start_management()
                acquired = await self.ha.acquire()
            except BaseException as exc:
                # A bind failure (management, replication) leaves nothing bound or locked.
                with contextlib.suppress(Exception):
                    await self._stop_management()
                with contextlib.suppress(Exception):
                    await self.ha.stop()
                self._stopped.set()
                if isinstance(exc, OSError):
                    raise self._store_unusable(exc) from None
                raise
            if not acquired:
                await self._stop_management()
                self._stopped.set()
                return
            if not self.config.ha.implicit:  # a lone <kahaDB> broker is no pair
                log.info("master: recovering the store and starting all connectors")
        t0 = time.monotonic()
        try:
            recovery = self.store.open()
        except OSError as exc:
            await self._abort_start()
            raise self._store_unusable(exc) from None
        except StoreError as exc:
            await self._abort_start()
            if exc.code != "store-locked":
                raise
            raise StoreError(f"{exc.message}: give each broker its own data directory "
                             "(--data DIR, or data_directory in the configuration)",
                             code=exc.code, retriable=exc.retriable) from None
        self.broker.recover(recovery)
        if self.config.network_connectors or any(
                lst.protocol in ("tcp", "ssl", "nio") for lst in self.config.listeners):
            # Linked to other brokers: re-forwards of what they sent before the restart
            # must find the stored copies in the duplicate window.
            self.broker.remember_stored_network_messages(recovery)
        loop = asyncio.get_running_loop()

        def space_changed() -> None:  # from the store's writer thread
            loop.call_soon_threadsafe(self._check_store_space)

        self.store.space_listener = space_changed
        self._check_store_space()
        self._start_trace()
        self.pump()
        # $SYS statistics are regenerated, not recovered (stores of older versions
        # hold them): they are not the operator's messages.
        keys = [info for key, info in recovery.keys.items()
                if not key.startswith(RETAINED_PREFIX + SYS_PREFIX)]
        log.info("store recovered %d messages in %d destinations in %.2fs",
                 sum(info.count for info in keys), len(keys), time.monotonic() - t0)
        if self.broker.auth.open:
            log.info("authentication is off (no users configured): any login is accepted "
                     "as anonymous")
        try:
            await self._start_listeners()
        except BaseException:
            await self._abort_start()
            raise
        self._timer = self._loop.call_later(TIMER_INTERVAL, self._on_timer)
        if self._trace_interval() < TIMER_INTERVAL:
            self._trace_timer = self._loop.call_later(self._trace_interval(),
                                                      self._on_trace_timer)
        self.started = True
        await self.network.start_connectors()
        if self.config.mqtt.sys_interval_ms > 0 and any(
                lst.protocol in ("mqtt", "mqtt+ssl", "ws", "wss")
                for lst in self.config.listeners):
            self._publish_sys()
        if self.ha is not None:
            self.broker.advise_master_broker(self.ha.status())
            self.pump()
        from meshmq.build import describe

        log.info("meshmq broker %r started (%s)", self.config.broker_name, describe())
        if self._stop_requested or self.deposed:
            await self.stop()

    def _index(self, listener: ListenerConfig) -> int:
        return next((i for i, lst in enumerate(self.config.listeners) if lst is listener), 0)

    def _store_unusable(self, exc: OSError) -> StoreError:
        """The data directory cannot be used (a file, not writable, a full disk)."""
        where = exc.filename or self.config.data_directory
        reason = exc.strerror or str(exc)
        return StoreError(f"cannot use {where} for the store ({reason.lower()}): change "
                          "--data DIR, or data_directory in the configuration "
                          "(activemq.xml: dataDirectory)")

    async def _start_listeners(self) -> None:
        for listener in self.config.listeners:
            try:
                await self._listen(listener)
            except OSError as exc:
                what, change = self._bind_advice(listener)
                raise describe_bind_failure(what, listener.host, listener.port, exc,
                                            change) from None
        await self._start_management()

    def _bind_advice(self, listener: ListenerConfig) -> tuple[str, str]:
        """What a listener is called in a bind failure, and where its address is set."""
        label = LISTENER_LABELS.get(listener.protocol, listener.protocol)
        flag = (f"--{listener.protocol} HOST:PORT (port 0: the OS chooses)"
                if listener.protocol in ("stomp", "mqtt") else "")
        source = self.config.source
        if source is None:
            return label, f"run with {flag}" if flag else "change the listener's address"
        if source.endswith(".xml"):
            where = f"change uri of <transportConnector name=\"{listener.name}\"> in {source}"
        else:
            where = (f"change url of the [[listeners]] entry named \"{listener.name}\" "
                     f"in {source}")
        return (f"{label} (listener \"{listener.name}\")",
                f"{where}, or run with {flag}" if flag else where)

    async def _abort_start(self) -> None:
        """Undo a start that failed half-way: nothing stays bound, the store is closed."""
        for server in self._servers:
            server.close()
        self._servers.clear()
        with contextlib.suppress(Exception):
            await self._stop_management()
        with contextlib.suppress(Exception):
            await self.network.stop()
        self._store_closed = True
        with contextlib.suppress(Exception):
            await self.store.close()
        if self.ha is not None:
            with contextlib.suppress(Exception):
                await self.ha.stop()
        self._stopped.set()

    async def _listen(self, listener: ListenerConfig) -> None:
        if listener.protocol in ("stomp", "stomp+ssl"):
            await self._listen_stomp(listener)
        elif listener.protocol in ("ws", "wss"):
            await self._listen_ws(listener)
        elif listener.protocol in ("mqtt", "mqtt+ssl"):
            await self._listen_mqtt(listener)
        elif listener.protocol in ("tcp", "ssl", "nio"):
            server = await self.network.listen(listener, self._ssl_context(listener))
            self._listening(listener, server)
            await self.network.advertise(listener, self.addresses[listener.name])
        else:
            log.warning("listener %s: %s:// is not a protocol this broker serves; ignored",
                        listener.name, listener.protocol)

    async def _start_management(self) -> None:
        if self.config.management.enabled and self._management is None:
            from meshmq.management.server import ManagementServer

            mgmt = ManagementServer(self)
            await mgmt.start()
            self._management = mgmt

    async def _stop_management(self) -> None:
        if self._management is not None:
            from meshmq.management.server import ManagementServer

            assert isinstance(self._management, ManagementServer)
            await self._management.stop()
            self._management = None

    def statistics(self) -> dict[str, object]:
        """``/api/stat``: the broker's figures plus its master/slave role."""
        stat = self.broker.statistics()
        stat["ha"] = self.ha.status() if self.ha is not None else {"mode": "none",
                                                                   "role": "standalone"}
        stat["network"] = self.network.summary()
        from meshmq.build import compiled

        stat["build"] = "compiled" if compiled() else "python"
        return stat

    def connections_by_listener(self) -> dict[str, int]:
        """Open client connections per listener name."""
        return dict(self._counts)

    def _on_deposed(self, why: str) -> None:
        """Another broker is master now (or our store refuses writes): close everything."""
        if self.deposed:
            return
        self.deposed = True
        if self._loop is not None:
            self._loop.create_task(self.stop())

    def _ssl_context(self, listener: ListenerConfig) -> ssl.SSLContext | None:
        if listener.protocol not in ("stomp+ssl", "mqtt+ssl", "wss", "ssl"):
            return None
        assert listener.ssl_certfile is not None  # the config loader requires it
        # A CA bundle for client certificates means they are required, unless the
        # listener says otherwise (config/model.py ListenerConfig.client_auth).
        auth = listener.client_auth or ("need" if listener.ssl_cafile else "none")
        try:
            ctx = server_context(listener.ssl_certfile, listener.ssl_keyfile,
                                 listener.ssl_cafile, auth, listener.ssl_ciphers)
        except TlsFileError as exc:  # not a bind failure
            raise ConfigError(str(exc), file=self.config.source,
                              option=f"listeners[{self._index(listener)}].{exc.option}"
                              ) from None
        return self.tls.register(f"listener {listener.name}", ctx, listener.ssl_certfile,
                                 listener.ssl_keyfile)

    async def check_password(self, login: str, passcode: str) -> Principal:
        """A user's password checked as the client listeners do (scrypt off the event
        loop), for broker links; raises ``AuthenticationError``."""
        from meshmq.transport.login import check_password

        return await check_password(self.broker.auth, login, passcode)

    def reload_tls(self) -> int:
        """Load every TLS certificate/key again (SIGHUP): new connections get the new
        pair, open ones keep theirs. Returns how many pairs were reloaded."""
        return self.tls.reload()

    async def _listen_stomp(self, listener: ListenerConfig) -> None:
        from meshmq.transport.stomp_server import StompProtocol

        assert self._loop is not None
        self._limits[listener.name] = listener.max_connections
        self._counts[listener.name] = 0
        server = await self._loop.create_server(
            lambda: StompProtocol(self, listener.name), listener.host, listener.port,
            ssl=self._ssl_context(listener), reuse_address=True, backlog=1024)
        self._listening(listener, server)

    async def _listen_ws(self, listener: ListenerConfig) -> None:
        """STOMP (and, with the MQTT work, MQTT) over WebSocket, chosen by subprotocol."""
        from meshmq.transport.stomp_server import StompProtocol
        from meshmq.transport.websocket import WebSocketOptions, start_websocket_listener

        assert self._loop is not None
        self._limits[listener.name] = listener.max_connections
        self._counts[listener.name] = 0

        def stomp() -> asyncio.Protocol:
            return StompProtocol(self, listener.name)

        def mqtt() -> asyncio.Protocol:
            from meshmq.transport.mqtt_server import MqttProtocol

            return MqttProtocol(self, listener.name)

        protocols = {"v12.stomp": stomp, "v11.stomp": stomp, "v10.stomp": stomp,
                     "stomp": stomp, "mqtt": mqtt}
        server = await start_websocket_listener(
            self._loop, listener.host, listener.port, protocols,
            ssl_context=self._ssl_context(listener),
            options=WebSocketOptions(max_message_size=self.config.stomp.max_frame_size))
        self._listening(listener, server)

    async def _listen_mqtt(self, listener: ListenerConfig) -> None:
        from meshmq.transport.mqtt_server import MqttProtocol

        assert self._loop is not None
        self._limits[listener.name] = listener.max_connections
        self._counts[listener.name] = 0
        server = await self._loop.create_server(
            lambda: MqttProtocol(self, listener.name), listener.host, listener.port,
            ssl=self._ssl_context(listener), reuse_address=True, backlog=1024)
        self._listening(listener, server)

    # ------------------------------------------------------------ $SYS
    def _publish_sys(self) -> None:
        """Mosquitto-style $SYS/broker/... statistics as retained messages."""
        from meshmq.core import destinations as dst
        from meshmq.core.message import Message

        broker = self.broker
        queues = list(broker.queues.values())
        received = sum(q.stats.enqueued for q in queues) + \
            sum(t.enqueued for t in broker.topics.values())
        sent = sum(q.stats.dispatched for q in queues) + \
            sum(t.dispatched for t in broker.topics.values())
        from meshmq import __version__

        values = {
            "version": f"meshmq {__version__}",
            "uptime": f"{(broker.now_ms() - broker.started_ms) // 1000} seconds",
            # Not the connections still being taken apart (see Broker.close_connection_step).
            "clients/connected": str(sum(not c.closed for c in broker.connections.values())),
            "messages/received": str(received),
            "messages/sent": str(sent),
            "store/messages/count": str(sum(q.depth for q in queues)),
            "heap/current": str(broker.usage.used),
        }
        for name, value in values.items():
            topic = "$SYS.broker." + name.replace("/", ".")
            msg = Message(message_id=self.broker.new_message_id("sys"),
                          destination=dst.topic(topic), body=value.encode(),
                          timestamp=self.broker.now_ms())
            self.broker.publish_internal(msg, retain=True, persist=False)
        self.pump()
        interval = self.config.mqtt.sys_interval_ms
        if interval > 0 and self._loop is not None and self.started:
            self._sys_timer = self._loop.call_later(interval / 1000, self._publish_sys)

    def _listening(self, listener: ListenerConfig, server: asyncio.Server) -> None:
        self._servers.append(server)
        sock = server.sockets[0].getsockname()
        self.addresses[listener.name] = (sock[0], sock[1])
        log.info("listening for %s on %s://%s:%d", listener.name, listener.protocol,
                 sock[0], sock[1])

    async def stop(self) -> None:
        if not self.started:
            if self.ha is not None and not self._stop_requested:
                # A slave, or a broker still starting: stop waiting for the lease. If it
                # is becoming master right now, start() finishes and then stops.
                self._stop_requested = True
                from meshmq.ha.roles import Role

                if self.ha.role in (Role.STARTING, Role.SLAVE):
                    await self.ha.stop()
            return
        self.started = False
        await self.network.stop()
        for server in self._servers:
            server.close()
        if self._timer is not None:
            self._timer.cancel()
        if self._trace_timer is not None:
            self._trace_timer.cancel()
        if self._sys_timer is not None:
            self._sys_timer.cancel()
        self.mqtt.stop()
        for session in list(self._all_sessions):
            session.close()
        await self._stop_management()
        for server in self._servers:
            await server.wait_closed()
        # Let connection_lost callbacks run (WebSocket close handshakes take a moment),
        # then persist what they produced.
        deadline = time.monotonic() + SHUTDOWN_DRAIN_S
        await asyncio.sleep(0)
        while self._all_sessions and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        self.mqtt.finish_teardowns()
        self.pump()
        self.pages.cancel()  # no page is wanted any more; the store closes next
        self._stop_trace()
        self._store_closed = True
        try:
            await self.store.close()
        except StoreError as exc:
            if not self.deposed:
                raise
            log.warning("store closed without a final sync: %s", exc.message)
        if self.ha is not None:
            # After the store is closed, so the next master recovers everything we wrote.
            await self.ha.stop()
        self._stopped.set()
        log.info("meshmq broker %r stopped", self.config.broker_name)

    async def wait_stopped(self) -> None:
        await self._stopped.wait()

    def install_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                loop.add_signal_handler(sig, self._on_signal, sig)
            except (NotImplementedError, RuntimeError):
                pass
        with contextlib.suppress(NotImplementedError, RuntimeError, AttributeError):
            loop.add_signal_handler(signal.SIGHUP, self._on_sighup)

    def _on_sighup(self) -> None:
        log.info("received SIGHUP, reloading TLS certificates")
        self.reload_tls()

    def _on_signal(self, sig: int) -> None:
        log.info("received %s, shutting down", signal.Signals(sig).name)
        self.shutdown_requested = True
        asyncio.get_running_loop().create_task(self._stop_on_signal())

    async def _stop_on_signal(self) -> None:
        # Whatever state the store is in, a signal stops the broker: a failed stop step is
        # logged, and the broker still reports itself stopped.
        try:
            await self.stop()
        except Exception as exc:
            log.error("broker stopped with an error: %s", exc)
        finally:
            self._stopped.set()

    # ------------------------------------------------------------ sessions
    def pushes_topology(self, listener: str | None) -> bool:
        """Whether clients of ``listener`` are told the peer brokers (its
        ``update_cluster_clients``)."""
        return listener is not None and listener in self._push_listeners

    def admit(self, listener: str) -> bool:
        """Count a new connection on ``listener``; False once it is at max_connections."""
        count = self._counts.get(listener, 0)
        if count >= self._limits.get(listener, 1 << 62):
            log.warning("listener %s refused a connection: max_connections (%d) reached",
                        listener, count)
            return False
        self._counts[listener] = count + 1
        return True

    def release(self, listener: str) -> None:
        self._counts[listener] = self._counts.get(listener, 1) - 1

    def accepted(self, session: Session) -> None:
        self._all_sessions.add(session)

    def forget(self, session: Session) -> None:
        self._all_sessions.discard(session)
        self._to_flush.pop(session, None)

    def register(self, session: Session) -> None:
        assert session.conn is not None
        self.sessions[session.conn.id] = session

    def unregister(self, session: Session) -> None:
        if session.conn is not None:
            self.sessions.pop(session.conn.id, None)

    def close_connection(self, connection_id: str) -> bool:
        """Close a client connection for an operator (the management API); the client is
        told so where its protocol can say it. False when no such connection is open."""
        session = self.sessions.get(connection_id)
        if session is None:
            return False
        log.info("connection %s closed by an administrator", connection_id)
        session.close_by_admin()
        return True

    def mark_flush(self, session: Session) -> None:
        self._to_flush[session] = None

    # ------------------------------------------------------------ pump
    def request_pump(self) -> None:
        if not self._pump_scheduled and self._loop is not None:
            self._pump_scheduled = True
            self._loop.call_soon(self.pump)

    def write_ops(self) -> None:
        ops = self.broker.take_ops()
        if ops:
            if self._store_closed:
                log.warning("store already closed at shutdown; %d late operations dropped",
                            len(ops))
                return
            try:
                self.store.write(ops)
            except StoreError as exc:
                if self.ha is None:
                    # A failed store: the sessions waiting for these operations to be
                    # durable are told so by store.sync(); the pump goes on serving
                    # everything that does not need the store.
                    if not self._store_failure_logged:
                        self._store_failure_logged = True
                        log.error("store refused a write (%s); operations that need it are "
                                  "failed", exc.message)
                    return
                # Fenced (another broker is master) or failed: a master that cannot
                # write must stop serving, so the slave can take over.
                log.error("store refused a write (%s); %d operations dropped, stopping",
                          exc.message, len(ops))
                self._on_deposed(exc.message)

    def pump(self) -> None:
        self._pump_scheduled = False
        broker = self.broker
        broker.dispatch_dirty()
        self.write_ops()
        loads = broker.take_page_loads()
        if loads and self.pages.read(loads):
            broker.dispatch_dirty()  # the pages read at once go out in this pump
            self.write_ops()
            if broker.has_page_loads:
                self.request_pump()
        marks, hold = broker.take_dispatch_marks()
        gate = self._sync_marks(marks) if marks or hold else None
        outcomes = broker.take_outcomes()
        if hold or self._held:
            # A delivery of this pump is beyond the last durable dispatch mark: nothing
            # leaves before the mark is on disk (one sync per mark window), and later
            # pumps' deliveries queue behind, so every consumer keeps its order.
            if outcomes:
                self._held.append((gate if hold else None, outcomes))
        else:
            self._deliver(outcomes)
        self._flush_sessions()
        if broker.tracer is not None:
            self._write_trace()
        if broker.has_deferred:
            self.request_pump()  # after the loop has done I/O (and maybe paused writers)

    def _deliver(self, outcomes: list[Outcome]) -> None:
        sessions = self.sessions
        for outcome in outcomes:
            session = sessions.get(outcome.consumer.connection_id)
            if session is not None:
                assert isinstance(outcome, Delivery | BrowseEnd)
                try:
                    session.deliver(outcome)
                except Exception:
                    # One connection's bug must not stall everyone's deliveries.
                    log.exception("delivery to connection %s failed; closing it",
                                  outcome.consumer.connection_id)
                    session.close()

    def _flush_sessions(self) -> None:
        if self._to_flush:
            if self._trace_exact:
                self.trace_barrier()
            to_flush, self._to_flush = self._to_flush, {}
            for session in to_flush:
                session.flush()

    def _sync_marks(self, marks: list[tuple[Queue, int]]) -> _Gate:
        """Sync the store (it holds ``marks`` and everything written before), then tell
        the queues their marks are durable and hand out the deliveries that waited."""
        gate = _Gate()
        assert self._loop is not None

        async def run() -> None:
            started = time.perf_counter()
            try:
                await self.store.sync()
                # One observation per mark window (not per message): GET /metrics.
                self.sync_seconds.observe(time.perf_counter() - started)
            except StoreError:
                # A failed store is reported where it is used; the deliveries go out
                # anyway (withholding them would not make anything durable).
                pass
            else:
                self.broker.dispatch_marks_durable(marks)
            gate.ready = True
            self._release_held()

        task = self._loop.create_task(run())
        self._mark_syncs.add(task)
        task.add_done_callback(self._mark_syncs.discard)
        return gate

    def _release_held(self) -> None:
        held = self._held
        while held:
            gate, outcomes = held[0]
            if gate is not None and not gate.ready:
                break
            held.popleft()
            self._deliver(outcomes)
        self._flush_sessions()

    def _on_timer(self) -> None:
        assert self._loop is not None
        # Rescheduled first: housekeeping that fails (a broken store) must not stop the
        # timeouts and expiry of every later tick.
        self._timer = self._loop.call_later(TIMER_INTERVAL, self._on_timer)
        now = time.monotonic()
        for session in list(self._all_sessions):
            session.check_timeouts(now)
        self.broker.tick()
        self.pump()
        self._tick_trace(now)
        # Reclaim journal space while idle too (the journal also compacts on writes).
        with contextlib.suppress(StoreError):  # reported where the store is used
            self.store.compact_step()
        self._check_store_space()

    def _check_store_space(self) -> None:
        """Refuse persistent messages while the store says it has no room for them."""
        reason = self.store.persistent_refusal()
        if reason != self.broker.persistent_refusal:
            if reason is not None:
                log.warning("refusing persistent messages: %s", reason)
            else:
                log.info("store has room again: accepting persistent messages")
            self.broker.persistent_refusal = reason


GC_YOUNG_THRESHOLD = 10_000


def tune_gc() -> None:
    """Garbage-collector settings for a broker process.

    Each message allocates a handful of short-lived objects (frame, message, entry,
    delivery) that reference counting frees, yet every 700 allocations CPython's default
    runs a young collection, and every 100 of those a full one over every queued message.
    Collecting the young generation every 10,000 allocations and moving the objects that
    exist after startup (modules, config) out of the collector's sight saves ~10% CPU per
    message (bench/hotpath.py) and keeps full collections off a large in-memory backlog.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, 20, 20)


EXIT_DEPOSED = 3  # `meshmq broker` exit status of a master deposed without restarting


async def run_broker(config: BrokerConfig) -> int:
    """Run a broker until SIGTERM/SIGINT (the ``meshmq broker`` command). A deposed master
    (HA) starts again as a slave when ``ha.restart_when_deposed``, else it exits with
    ``EXIT_DEPOSED`` so a supervisor sees it. ``[ha] role = "witness"`` runs a witness."""
    if config.ha.mode == "replicated" and config.ha.role == "witness":
        from meshmq.ha.replica_store import run_witness

        return await run_witness(config)
    tune_gc()
    while True:
        runtime = BrokerRuntime(config)
        runtime.install_signal_handlers()
        await runtime.start()
        await runtime.wait_stopped()
        if not runtime.deposed or runtime.shutdown_requested:
            return 0
        if not config.ha.restart_when_deposed:
            return EXIT_DEPOSED
        log.info("restarting as a slave after losing the master role")
