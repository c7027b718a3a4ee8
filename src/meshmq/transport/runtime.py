"""The broker's composition root: builds every component once, in dependency order, and
owns the broker's lifecycle (start, serve until stopped, stop) and its signals.

Built here, and only here (docs/design.md, "The composition root"): the TLS reloader,
master/slave (HA), the store, the core ``Broker``, the trace recorder, the pump (the
per-turn engine: transport/pump.py), the durability path, the page reader, the
topology, the MQTT service, the network manager, the listeners, the management
listener and the ``$SYS`` publisher. Each receives only what it uses; sessions see
this object as a ``SessionHost`` (transport/host.py), the network as a ``BrokerHost``
(network/host.py), management as a ``ManagementHost`` (management/host.py).

``start`` brings the components up in order, recording each in a ``Lifecycle``;
``stop`` (or a failure half-way through ``start``) takes them down newest first.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import socket
import time
from dataclasses import replace
from typing import TYPE_CHECKING

from meshmq.config.credential_files import credential_source
from meshmq.config.model import BrokerConfig
from meshmq.core.broker import RETAINED_PREFIX, SYS_PREFIX, Broker
from meshmq.core.shards import ShardIdentity
from meshmq.errors import StoreError
from meshmq.management.sys_topics import SysTopics
from meshmq.store.base import Recovery, Store, SyncsAtOnce
from meshmq.tls import CertificateReloader
from meshmq.transport.durability import Durability
from meshmq.transport.host import Session
from meshmq.transport.lifecycle import Lifecycle
from meshmq.transport.listeners import LISTENER_LABELS, Listeners, websocket_options
from meshmq.transport.mqtt_service import MqttService
from meshmq.transport.paging import PageReader
from meshmq.transport.pump import TIMER_INTERVAL, Pump
from meshmq.transport.push_back import PeerHolds, PushBack, ShardHolds
from meshmq.transport.stop_deadline import EXIT_STOP_OVERRAN, STOP_DEADLINE_S, StopDeadline
from meshmq.transport.topology import Topology, push_families
from meshmq.transport.trace_recorder import TraceRecorder

if TYPE_CHECKING:
    from prometheus_client import Histogram

    from meshmq.core.auth import Principal
    from meshmq.core.destinations import Destination
    from meshmq.ha.controller import HaController
    from meshmq.ha.replication import ReplicatedHa
    from meshmq.management.server import ManagementServer
    from meshmq.network.host import HoldPeer
    from meshmq.network.shards import ShardPeers
    from meshmq.store.fence import WriteFence
    from meshmq.transport.handoff import HandoffOffer, Handoffs
    from meshmq.transport.mqtt_server import MqttProtocol
    from meshmq.transport.stomp_server import StompProtocol

__all__ = ["EXIT_DEPOSED", "EXIT_STOP_OVERRAN", "LISTENER_LABELS", "SHUTDOWN_DRAIN_S",
           "STOP_DEADLINE_S", "TIMER_INTERVAL", "BrokerRuntime", "run_broker", "tune_gc"]

log = logging.getLogger("meshmq.runtime")

SHUTDOWN_DRAIN_S = 3.0  # how long stop() waits for connections to finish closing
# Listener protocols whose clients can read $SYS topics.
_MQTT_PROTOCOLS = ("mqtt", "mqtt+ssl", "ws", "wss")


class BrokerRuntime:
    """One broker run: its components, and their start and stop."""

    def __init__(self, config: BrokerConfig, store: Store | None = None, *,
                 shard: ShardIdentity | None = None, fence: WriteFence | None = None
                 ) -> None:
        self.config = config
        # One shard of a node (docs/design.md, "Shards"); None: a whole broker, as always.
        self.shard = shard
        self.deposed = False  # lost the lease (or the store refused writes) while master
        self.shutdown_requested = False  # SIGTERM/SIGINT: do not restart as a slave
        self.started = False
        self._stop_requested = False
        self._ha_stopped = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._adoptions: set[asyncio.Task[None]] = set()  # handed-over connections starting
        self._stopped = asyncio.Event()
        self.lifecycle = Lifecycle()
        # A signal's stop ends the process within STOP_DEADLINE_S, done or not.
        self.stop_deadline = StopDeadline(self._still_stopping)
        # Every TLS context that presents a certificate, reloaded on SIGHUP.
        self.tls = CertificateReloader()
        # Master/slave (docs/ha.md): the lease backend is also the store's write fence.
        self.ha: HaController | ReplicatedHa | None = None
        # ``fence`` given: a shard of a master node, whose supervisor holds the lease.
        fenced = fence is not None
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
        self.broker = Broker(config, store, credentials=credential_source(config.auth))
        # Dispatch marks (store.base.MarkDispatched) only where they survive a restart.
        self.broker.dispatch_marks = store.keeps_dispatch_marks
        self.trace = TraceRecorder(config, self.broker)
        # A master whose store refuses a write stops, so its slave can take over.
        self.engine = Pump(self.broker, store, self.trace,
                           self._on_deposed if self.ha is not None or fenced else None)
        # Every "confirm once durable" (receipts, MQTT acks, bridge acks) goes through here.
        self.durability = Durability(
            self.engine.write_ops,
            store.sync_at_once if isinstance(store, SyncsAtOnce) else store.sync,
            self.trace.barrier, self.engine.request_pump)
        # A shard of several: the links to the other shards (network/shards.py) carry
        # what the core routes to destinations they own; confirmations wait for them.
        self.shard_peers: ShardPeers | None = None
        if shard is not None and shard.count > 1:
            from meshmq.network.shards import ShardPeers

            self.broker.use_shard(shard)
            self.shard_peers = ShardPeers(
                self, shard, owner_wait_s=config.sharding.owner_wait_ms / 1000)
            self.engine.shards = self.shard_peers
            self.durability.owners = self.shard_peers.owners
            self.durability.relays = self.shard_peers.opened
            self.durability.settles = self.shard_peers.settled
            self.durability.txns = self.shard_peers.committing
            self.durability.clients = self.shard_peers.clients
        # A shard hands plain STOMP connections to their destination's owner
        # (transport/handoff.py), so their messages do not cross shards.
        self.handoffs: Handoffs | None = None
        if self.shard_peers is not None and shard is not None and config.sharding.handoff:
            from meshmq.transport.handoff import Handoffs

            self.handoffs = Handoffs(shard, self.shard_peers.owner_up, self._adopt)
        # Pages of paged-out messages the core asks for (core/paging.py).
        self.pages = PageReader(self.broker, store, self.engine.request_pump)
        self.engine.pages = self.pages
        # Peer brokers' client URIs, pushed to clients on connect (transport/topology.py).
        self.topology = Topology(config.advertised_peer_list, enabled=config.push_topology,
                                 push_to=push_families((lst.protocol, lst.update_cluster_clients)
                                                       for lst in config.listeners))
        self._push_listeners = frozenset(lst.name for lst in config.listeners
                                         if lst.update_cluster_clients)
        self.mqtt = MqttService(self)  # MQTT sessions, wills and teardowns
        # Producers held back by slow consumers (transport/push_back.py).
        self.push_back = PushBack(self.broker)
        self.engine.push_back = self.push_back
        self.shard_holds: ShardHolds | None = None
        # Push-back carried back over bridges: a link's receiving half notes its
        # forwarder to hold a destination that is slow here (network/receiver.py).
        self.link_holds: PeerHolds[HoldPeer] = PeerHolds(self.push_back, _note_hold)
        if self.shard_peers is not None:  # a client's session resumed on another shard
            self.shard_peers.clients.session_moved = self.mqtt.forget_session
            # Push-back across shards: owners hold other shards' producers by a note.
            holds = self.shard_holds = ShardHolds(self.push_back,
                                                  self.shard_peers.note_hold)
            self.shard_peers.sends_routed = holds.routed
            self.shard_peers.hold_noted = holds.noted
            self.shard_peers.holds_lost = holds.link_lost
        from meshmq.network.manager import NetworkManager

        self.network = NetworkManager(self)
        # Linked brokers' client URIs (from the bridge handshake) reach failover clients.
        self.topology.set_provider("network", self.network.peer_client_uris)
        # One shard of several shares the client ports; the front shard alone takes
        # broker links and runs the network connectors (docs/design.md, "Shards").
        sharded = shard is not None and shard.count > 1
        self._front = shard is None or shard.is_front
        self.listeners = Listeners(config, self, self.engine, self.network, self.tls,
                                   reuse_port=sharded, links=self._front)
        self.listeners.handoffs = self.handoffs
        self._management: ManagementServer | None = None
        if config.management.enabled:
            from meshmq.management.server import ManagementServer

            # A shard serves management on its Unix socket; the node's supervisor
            # serves the node's endpoint and asks each shard.
            self._management = ManagementServer(
                self, unix_path=shard.management_socket(shard.index) if shard else None)
        self._management_up = False
        self.sys_topics = SysTopics(self.broker, config.mqtt.sys_interval_ms,
                                    self.engine.pump)

    # ------------------------------------------------------------ start
    async def start(self) -> None:
        """Start every component in order (a slave: management, then wait for the lease).
        A failure stops what had started, in reverse, and is raised."""
        loop = asyncio.get_running_loop()
        self._loop = loop
        self.engine.bind(loop)
        try:
            if self.ha is not None and not await self._become_master():
                await self.lifecycle.stop()
                return
            await self._start_serving(loop)
        except BaseException:
            await self.lifecycle.abort()
            raise
        finally:
            if not self.started:
                self._stopped.set()
        from meshmq.build import describe

        log.info("meshmq broker %r started (%s)", self.config.broker_name, describe())
        if self._stop_requested or self.deposed:
            await self.stop()

    async def _become_master(self) -> bool:
        """HA: the management endpoint comes up first so a slave's role is visible; the
        rest waits until this broker holds the lease (False: stopped before that)."""
        assert self.ha is not None
        self.lifecycle.started("ha", self._stop_ha)
        try:
            await self._start_management()
            acquired = await self.ha.acquire()
        except OSError as exc:  # a bind failure (management, replication)
            raise self._store_unusable(exc) from None
        if acquired and not self.config.ha.implicit:  # a lone <kahaDB> broker is no pair
            log.info("master: recovering the store and starting all connectors")
        return acquired

    async def _start_serving(self, loop: asyncio.AbstractEventLoop) -> None:
        t0 = time.monotonic()
        recovery = await self._open_store(loop)
        if self.ha is not None:
            self.trace.lease = (str(self.ha.status()["holder_id"]), self.ha.took_over_from)
        self.trace.start()
        self.lifecycle.started("trace", self.trace.stop)
        self.engine.pump()
        if self.shard_peers is not None:  # after the store, before any client
            await self.shard_peers.start()
            self.lifecycle.started("shards", self.shard_peers.stop)
        if self.handoffs is not None:
            self.handoffs.start(loop)
            self.lifecycle.started("handoffs", self.handoffs.stop)
        # $SYS statistics are regenerated, not recovered (stores of older versions
        # hold them): they are not the operator's messages.
        keys = [info for key, info in recovery.keys.items()
                if not key.startswith(RETAINED_PREFIX + SYS_PREFIX)]
        log.info("store recovered %d messages in %d destinations in %.2fs",
                 sum(info.count for info in keys), len(keys), time.monotonic() - t0)
        if self.broker.auth.open:
            log.info("authentication is off (no users configured): any login is accepted "
                     "as anonymous")
        await self.listeners.start(loop)
        self.lifecycle.started("listeners", self._stop_listeners)
        await self._start_management()
        self.engine.start_housekeeping()
        self.trace.start_timer(loop, TIMER_INTERVAL)
        self.lifecycle.started("housekeeping", self.engine.stop_housekeeping)
        self.started = True
        if self._front:
            await self.network.start_connectors()
            self.lifecycle.started("network", self.network.stop)
        if self.config.mqtt.sys_interval_ms > 0 and any(
                lst.protocol in _MQTT_PROTOCOLS for lst in self.config.listeners):
            self.sys_topics.start(loop)
            self.lifecycle.started("sys", self.sys_topics.stop)
        if self.ha is not None:
            self.broker.advise_master_broker(self.ha.status())
            self.engine.pump()

    async def _open_store(self, loop: asyncio.AbstractEventLoop) -> Recovery:
        """Open the store and recover the core from it; the store closes at stop."""
        try:
            recovery = self.store.open()
        except BaseException as exc:
            # A store that failed to open holds no lock nor file open after this.
            self.engine.store_closed = True
            with contextlib.suppress(Exception):
                await self.store.close()
            if isinstance(exc, OSError):
                raise self._store_unusable(exc) from None
            if isinstance(exc, StoreError) and exc.code == "store-locked":
                raise StoreError(f"{exc.message}: give each broker its own data directory "
                                 "(--data DIR, or data_directory in the configuration)",
                                 code=exc.code, retriable=exc.retriable) from None
            raise
        self.lifecycle.started("store", self._close_store)
        self.broker.recover(recovery)
        # Re-sends of what was stored before the restart but never confirmed (a bridge's
        # re-forwards, a failover producer's dedup-ids) must find the stored copies in
        # the duplicate window.
        self.broker.remember_stored_sends(recovery)

        def space_changed() -> None:  # from the store's writer thread
            loop.call_soon_threadsafe(self.engine.check_store_space)

        self.store.space_listener = space_changed
        self.engine.check_store_space()
        return recovery

    async def _start_management(self) -> None:
        """Start the management listener unless it is up; its stop is recorded here
        either way, so it stops before the listeners whether it started first (HA) or
        after them (stopping it twice is harmless)."""
        if self._management is None:
            return
        if not self._management_up:
            await self._management.start()
            self._management_up = True
        self.lifecycle.started("management", self._stop_management)

    async def _stop_management(self) -> None:
        if self._management is not None and self._management_up:
            self._management_up = False
            await self._management.stop()

    def _store_unusable(self, exc: OSError) -> StoreError:
        """The data directory cannot be used (a file, not writable, a full disk)."""
        where = exc.filename or self.config.data_directory
        reason = exc.strerror or str(exc)
        return StoreError(f"cannot use {where} for the store ({reason.lower()}): change "
                          "--data DIR, or data_directory in the configuration "
                          "(activemq.xml: dataDirectory)")

    # ------------------------------------------------------------ stop
    async def stop(self) -> None:
        """Stop every started component, newest first; a second call does nothing."""
        if not self.started:
            if self.ha is not None and not self._stop_requested:
                # A slave, or a broker still starting: stop waiting for the lease. If it
                # is becoming master right now, start() finishes and then stops.
                self._stop_requested = True
                from meshmq.ha.roles import Role

                if self.ha.role in (Role.STARTING, Role.SLAVE):
                    await self._stop_ha()
            return
        self.started = False
        try:
            await self.lifecycle.stop()
        finally:
            self._stopped.set()
        log.info("meshmq broker %r stopped", self.config.broker_name)

    async def _stop_listeners(self) -> None:
        """Stop accepting, close every session, let them finish closing (up to
        SHUTDOWN_DRAIN_S), then persist what their teardown produced."""
        self.listeners.close()
        self.mqtt.stop()
        self.engine.close_sessions()
        await self._stop_management()  # a console's open stream must not hold the drain
        await self.listeners.wait_closed()
        await self.engine.drain(SHUTDOWN_DRAIN_S)
        self.mqtt.finish_teardowns()
        self.engine.pump()

    async def _close_store(self) -> None:
        self.pages.cancel()  # no page is wanted any more; the store closes next
        self.engine.store_closed = True
        try:
            await self.store.close()
        except StoreError as exc:
            if not self.deposed:
                raise
            log.warning("store closed without a final sync: %s", exc.message)

    async def _stop_ha(self) -> None:
        """After the store is closed, so the next master recovers everything we wrote."""
        if self.ha is not None and not self._ha_stopped:
            self._ha_stopped = True
            await self.ha.stop()

    async def wait_stopped(self) -> None:
        """Serve until stopped (by stop(), a signal, or losing the master role)."""
        await self._stopped.wait()

    def _on_deposed(self, why: str) -> None:
        """Another broker is master now (or our store refuses writes): close everything."""
        if self.deposed:
            return
        self.deposed = True
        if self._loop is not None:
            self._loop.create_task(self.stop())

    # ------------------------------------------------------------ signals
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
        self.stop_deadline.arm()
        asyncio.get_running_loop().create_task(self._stop_on_signal())

    def _still_stopping(self) -> str:
        """What the stop waits for (read by the stop deadline's thread)."""
        step = self.lifecycle.stopping
        if step is not None:
            return step
        if self._stopped.is_set():
            return "the process's exit, which waits for a thread"
        return "the start (a slave waiting for the lease, or the store opening)" \
            if not self.started else "nothing yet (the loop did not run the stop)"

    async def _stop_on_signal(self) -> None:
        # Whatever state the store is in, a signal stops the broker: a failed stop step is
        # logged, and the broker still reports itself stopped.
        try:
            await self.stop()
        except Exception as exc:
            log.error("broker stopped with an error: %s", exc)
        finally:
            self._stopped.set()

    def reload_tls(self) -> int:
        """Load every TLS certificate/key again (SIGHUP): new connections get the new
        pair, open ones keep theirs. Returns how many pairs were reloaded."""
        return self.tls.reload()

    # ------------------------------------------------------------ management's view
    @property
    def addresses(self) -> dict[str, tuple[str, int]]:
        """Bound address of each listener (and ``management``), by name."""
        return self.listeners.addresses

    @property
    def sessions(self) -> dict[str, Session]:
        """Open sessions by broker connection id."""
        return self.engine.sessions

    @property
    def sync_seconds(self) -> Histogram:
        return self.engine.sync_seconds

    @property
    def trace_events_written(self) -> int:
        return self.trace.events_written

    @property
    def trace_events_dropped(self) -> int:
        return self.trace.events_dropped

    def _adopt(self, offer: HandoffOffer, sock: socket.socket
               ) -> bool | asyncio.Future[bool]:
        """A connection another shard handed here: admit it on its listener and serve
        it; False (declined, the offering shard keeps it) before anything is read. With
        a client id, a future: yes once the id's owner has moved its claim here."""
        loop = self._loop
        listener = next((lst for lst in self.config.listeners if lst.name == offer.listener),
                        None)
        clients = self.durability.clients
        websocket = offer.websocket
        parts: tuple[bytes, bytes] | None = (offer.pending, b"")
        if websocket is not None:
            from meshmq.transport.websocket import (
                STOMP_SUBPROTOCOLS,
                WebSocketProtocol,
                split_handoff,
            )

            speaks = STOMP_SUBPROTOCOLS if offer.protocol == "stomp" else {"mqtt"}
            # The session's pending bytes, then the WebSocket codec's.
            parts = split_handoff(offer.pending, websocket)
        if loop is None or offer.protocol not in ("stomp", "mqtt") or listener is None or \
                listener.protocol != ("ws" if websocket else offer.protocol) or \
                self.shutdown_requested or not self.started or \
                (offer.client_id and clients is None) or parts is None or \
                (websocket is not None and websocket["subprotocol"] not in speaks) or \
                not self.admit(listener.name):
            return False
        inner_offer = offer if websocket is None else replace(offer, pending=parts[0])
        protocol: StompProtocol | MqttProtocol
        if offer.protocol == "stomp":
            from meshmq.transport import stomp_server

            protocol = stomp_server.StompProtocol(self, listener.name, handoffs=None,
                                                  adopted=inner_offer)
        else:
            from meshmq.transport import mqtt_server

            protocol = mqtt_server.MqttProtocol(self, listener.name, adopted=inner_offer)
        served: asyncio.Protocol = protocol
        if websocket is not None:
            served = WebSocketProtocol.adopted(protocol, websocket, parts[1],
                                               websocket_options(self.config))
        if not offer.client_id:
            self._serve(served, sock)
            return True
        assert clients is not None
        moved = clients.move(offer.client_id, offer.protocol, offer.shard, offer.claim,
                             protocol.claim.close, protocol.claim.alive)
        if moved is None:
            self.release(listener.name)
            return False
        answer, protocol.claim.release = moved
        taken: asyncio.Future[bool] = loop.create_future()
        name = listener.name

        def answered(fut: asyncio.Future[bytes | None]) -> None:
            if fut.cancelled() or fut.exception() is not None:
                log.debug("a handed-over connection's client id did not move: %s",
                          "cancelled" if fut.cancelled() else fut.exception())
                self.release(name)
                taken.set_result(False)
                return
            self._serve(served, sock)
            taken.set_result(True)

        answer.add_done_callback(answered)
        return taken

    def _serve(self, protocol: asyncio.Protocol, sock: socket.socket) -> None:
        assert self._loop is not None
        task = self._loop.create_task(self._serve_adopted(protocol, sock))
        self._adoptions.add(task)
        task.add_done_callback(self._adoptions.discard)

    async def _serve_adopted(self, protocol: asyncio.Protocol, sock: socket.socket) -> None:
        assert self._loop is not None
        try:
            await self._loop.connect_accepted_socket(lambda: protocol, sock)
        except OSError as exc:  # the client is gone already
            log.debug("a handed-over connection could not be served: %s", exc)
            protocol.connection_lost(exc)
            sock.close()

    def shard_handoffs(self) -> dict[str, int] | None:
        return self.handoffs.stats.as_dict() if self.handoffs is not None else None

    def shard_links(self) -> list[dict[str, object]] | None:
        return self.shard_peers.summary() if self.shard_peers is not None else None

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
        return self.engine.connections_by_listener()

    def close_connection(self, connection_id: str) -> bool:
        """Close a client connection for an operator (the management API); the client is
        told so where its protocol can say it. False when no such connection is open."""
        return self.engine.close_connection(connection_id)

    # ------------------------------------------------------------ sessions' and network's view
    def pushes_topology(self, listener: str | None) -> bool:
        """Whether clients of ``listener`` are told the peer brokers (its
        ``update_cluster_clients``)."""
        return listener is not None and listener in self._push_listeners

    async def check_password(self, login: str, passcode: str) -> Principal:
        """A user's password checked as the client listeners do (scrypt off the event
        loop), for broker links; raises ``AuthenticationError``."""
        from meshmq.transport.login import check_password

        return await check_password(self.broker.auth, login, passcode)

    def request_pump(self) -> None:
        self.engine.request_pump()

    def pump(self) -> None:
        self.engine.pump()

    def write_ops(self) -> None:
        self.engine.write_ops()

    async def sync_with_owners(self) -> None:
        await self.durability.sync_after_writes(owners=True)

    def trace_barrier(self) -> None:
        self.trace.barrier()

    def admit(self, listener: str) -> bool:
        return self.engine.admit(listener)

    def release(self, listener: str) -> None:
        self.engine.release(listener)

    def accepted(self, session: Session) -> None:
        self.engine.accepted(session)

    def forget(self, session: Session) -> None:
        self.engine.forget(session)

    def register(self, session: Session) -> None:
        self.engine.register(session)

    def unregister(self, session: Session) -> None:
        self.engine.unregister(session)

    def mark_flush(self, session: Session) -> None:
        self.engine.mark_flush(session)


def _note_hold(peer: HoldPeer, dest: Destination, held: bool) -> None:
    peer.note_hold(dest, held)


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
