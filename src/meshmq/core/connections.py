"""Client and bridge connections, and the temporary destinations they own.

Owns opening a connection (its id, the client-id's uniqueness, whether its rights are
checked, the ConnectionAdded advisory), closing it in steps (consumers first, a budget
per call so a client with very many subscriptions does not stall the loop; then its
transactions, temporary destinations, ProducerRemoved and ConnectionRemoved), and
temporary destinations: creating them (named after the broker, its boot and the
connection), deleting them with their connection, and adopting a remote broker's
temporary destination for a bridge.

Unsubscribing is core/subscriptions.py's; this module only asks it to.
"""

from __future__ import annotations

import itertools
from typing import Final

from meshmq.core import destinations as dst
from meshmq.core.access import Access
from meshmq.core.advisories import kind_topic
from meshmq.core.auth import Principal
from meshmq.core.authorization import Right
from meshmq.core.destinations import Destination, DestKind
from meshmq.core.routing import Router
from meshmq.core.state import LINK_PROTOCOLS, Connection, CoreState, TopicStats
from meshmq.core.subscriptions import Subscriptions
from meshmq.errors import MeshmqError

CONNECTION_TOPIC: Final = "ActiveMQ.Advisory.Connection"


class Connections:
    """Opening and closing connections; temporary destinations."""

    def __init__(self, state: CoreState, access: Access, router: Router,
                 subscriptions: Subscriptions) -> None:
        self._state = state
        self._access = access
        self._router = router
        self._subscriptions = subscriptions
        self._conn_seq = itertools.count(1)
        self._temp_seq = itertools.count(1)
        self.client_connections_opened = 0  # since start; broker links not counted

    def open(self, principal: Principal, client_id: str | None, remote: str,
             protocol: str) -> Connection:
        state = self._state
        if client_id is not None and client_id in state.client_ids:
            raise MeshmqError(f"Broker: {state.name} - Client: {client_id} already connected",
                              code="client-id-in-use", retriable=True)
        conn = Connection(id=f"c{next(self._conn_seq)}", principal=principal,
                          client_id=client_id, remote=remote, protocol=protocol,
                          connected_ms=state.now_ms(),
                          checked=self._access.authz is not None and not principal.internal)
        state.connections[conn.id] = conn
        if protocol not in LINK_PROTOCOLS:
            self.client_connections_opened += 1
        if client_id is not None:
            state.client_ids[client_id] = conn.id
        if protocol != "shard":  # (a node's links between its shards are no clients)
            self._router.advise(dst.topic(CONNECTION_TOPIC), "ConnectionAdded", {
                "connectionId": self._router.node_id(conn.id), "clientId": client_id,
                "userName": principal.user, "remoteAddress": remote, "protocol": protocol})
        return conn

    def close_step(self, conn: Connection, budget: int | None) -> bool:
        """Close ``conn``, unsubscribing at most ``budget`` consumers per call (None: all).

        Returns False while consumers remain: call again (on a later event-loop turn, so
        that a client with 100,000 subscriptions does not stall everybody else). From the
        first call on, nothing is dispatched to the connection's consumers.
        """
        state = self._state
        if not conn.closed:
            conn.closed = True
            for consumer in conn.consumers.values():
                consumer.paused = True
        if conn.consumers:
            if budget is not None and len(conn.consumers) > budget:
                for consumer in list(itertools.islice(conn.consumers.values(), budget)):
                    self._subscriptions.unsubscribe(conn, consumer)
                return False
            for consumer in list(conn.consumers.values()):
                self._subscriptions.unsubscribe(conn, consumer)
        elif conn.id not in state.connections:
            return True  # already closed
        conn.transactions.clear()
        for temp in list(conn.temp_destinations):
            self._delete_temp(conn, temp)
        for pd in conn.producer_destinations:
            self._router.producer_changed(conn, pd, added=False)
        state.connections.pop(conn.id, None)
        if conn.client_id is not None and state.client_ids.get(conn.client_id) == conn.id:
            del state.client_ids[conn.client_id]
        if conn.protocol != "shard":
            self._router.advise(dst.topic(CONNECTION_TOPIC), "ConnectionRemoved", {
                "connectionId": self._router.node_id(conn.id), "clientId": conn.client_id})
        return True

    # ------------------------------------------------------------ temporary destinations
    def create_temp(self, conn: Connection, kind: DestKind) -> Destination:
        assert kind.is_temporary
        state = self._state
        dest = Destination(kind,
                           f"ID:{state.name}-{state.boot}-{conn.id}:{next(self._temp_seq)}")
        if self._access.authz is not None:
            self._access.authorize(conn, Right.ADMIN, dest)
        conn.temp_destinations.add(dest)
        if kind is DestKind.TEMP_QUEUE:
            state.get_queue(dest)
        else:
            state.topics.setdefault(dest, TopicStats())
        self._router.advise(kind_topic(kind), "TempDestinationAdded",
                            {"destination": str(dest),
                             "connectionId": self._router.node_id(conn.id)})
        return dest

    def _delete_temp(self, conn: Connection, dest: Destination) -> None:
        state = self._state
        conn.temp_destinations.discard(dest)
        queue = state.queues.pop(dest, None)
        if queue is not None:
            queue.purge()
            queue.deleted = True
        state.topics.pop(dest, None)
        self._router.advise(kind_topic(dest.kind), "TempDestinationRemoved",
                            {"destination": str(dest),
                             "connectionId": self._router.node_id(conn.id)})

    def adopt_temp(self, conn: Connection, dest: Destination) -> None:
        """Make a remote broker's temporary destination exist here, owned by the bridge
        connection ``conn`` (bridgeTempDestinations): replies sent here to it can then
        cross the network; it goes away with the bridge."""
        state = self._state
        if state.temp_exists(dest):
            return
        conn.temp_destinations.add(dest)
        if dest.kind is DestKind.TEMP_QUEUE:
            state.get_queue(dest)
        else:
            state.topics.setdefault(dest, TopicStats())
