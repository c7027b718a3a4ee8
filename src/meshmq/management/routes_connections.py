"""``/api/connections`` and ``/api/subscriptions``: the client connections (STOMP, MQTT,
over TCP or WebSocket) with their subscriptions, closing one for an operator, and the
durable topic subscriptions, offline ones included, with deleting an offline one.

Broker links (protocol ``network``) are not client connections: ``/api/network`` shows
them, and stopping their connector is how an operator closes them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from aiohttp import web

from meshmq.core.state import LINK_PROTOCOLS
from meshmq.management.api import ApiError, reply, runtime_of
from meshmq.management.routes_broker import iso_ms

if TYPE_CHECKING:
    from meshmq.core.broker import Broker, Connection, TopicSubscription
    from meshmq.core.consumer import Consumer

routes = web.RouteTableDef()


def _clients(broker: Broker) -> list[Connection]:
    return [c for c in broker.connections.values()
            if not c.closed and c.protocol not in LINK_PROTOCOLS]


def _destinations(consumer: Consumer) -> str:
    return ",".join(str(d) for d in consumer.spec.destinations)


def _subscription(consumer: Consumer) -> dict[str, Any]:
    return {"id": consumer.subscription_id, "destination": _destinations(consumer),
            "selector": consumer.spec.selector, "ack": consumer.spec.ack_mode.value}


def connection_document(conn: Connection) -> dict[str, Any]:
    consumers = list(conn.consumers.values())
    return {
        "id": conn.id,
        "protocol": conn.protocol,
        "user": conn.principal.user,
        "address": conn.remote,
        "client_id": conn.client_id,
        "connected_at": iso_ms(conn.connected_ms),
        "subscriptions": [_subscription(c) for c in consumers],
        "messages_in": conn.sent,
        # Messages its current subscriptions were sent (those it closed are not counted).
        "messages_out": sum(c.dispatched_count for c in consumers),
    }


def _kind(consumer: Consumer) -> str:
    sub = consumer.topic_sub
    if sub is not None and sub.durable is not None:
        return "durable"
    return "topic" if any(d.is_topic for d in consumer.spec.destinations) else "queue"


def _active(conn: Connection, consumer: Consumer) -> dict[str, Any]:
    sub = consumer.topic_sub
    durable = sub.durable if sub is not None else None
    pending = sub.queue.depth if sub is not None else sum(q.depth for q in consumer.sources)
    return {"kind": _kind(consumer), "connection": conn.id, "client_id": conn.client_id,
            "name": durable.subscription_name if durable is not None
            else consumer.subscription_id,
            "destination": durable.destination if durable is not None
            else _destinations(consumer),
            "selector": consumer.spec.selector,
            # Messages waiting in what it reads from (a queue consumer shares its queues).
            "pending": pending,
            "dispatched": len(consumer.dispatched),  # sent to it, not yet acknowledged
            "active": True}


def _offline(client_id: str, name: str, sub: TopicSubscription) -> dict[str, Any]:
    durable = sub.durable
    return {"kind": "durable", "connection": None, "client_id": client_id, "name": name,
            "destination": durable.destination if durable is not None else "",
            "selector": sub.selector_text, "pending": sub.queue.depth, "dispatched": 0,
            "active": False}


@routes.get("/api/connections")
async def list_connections(request: web.Request) -> web.Response:
    broker = runtime_of(request).broker
    conns = sorted(_clients(broker), key=lambda c: (c.connected_ms, c.id))
    return reply({"connections": [connection_document(c) for c in conns]})


@routes.delete("/api/connections/{id}")
async def close_connection(request: web.Request) -> web.Response:
    runtime = runtime_of(request)
    conn_id = unquote(request.match_info["id"])
    conn = runtime.broker.connections.get(conn_id)
    if conn is not None and conn.protocol in LINK_PROTOCOLS:
        raise ApiError(409, f"connection {conn_id} is a broker link, not a client: stop its "
                       "network connector instead (POST /api/network/connectors/NAME/stop)")
    if conn is None or conn.closed or not runtime.close_connection(conn_id):
        raise ApiError(404, f"no open client connection {conn_id!r}: GET /api/connections "
                       "lists the open ones")
    return reply({"closed": conn_id})


@routes.get("/api/subscriptions")
async def list_subscriptions(request: web.Request) -> web.Response:
    broker = runtime_of(request).broker
    subs = [_active(conn, consumer)
            for conn in sorted(_clients(broker), key=lambda c: (c.connected_ms, c.id))
            for consumer in conn.consumers.values() if not consumer.spec.browser]
    subs += [_offline(cid, name, sub) for (cid, name), sub in sorted(broker.durables.items())
             if sub.consumer is None]
    return reply({"subscriptions": subs})


@routes.delete("/api/subscriptions/durable/{client_id}/{name}")
async def delete_durable(request: web.Request) -> web.Response:
    runtime = runtime_of(request)
    broker = runtime.broker
    key = (unquote(request.match_info["client_id"]), unquote(request.match_info["name"]))
    sub = broker.durables.get(key)
    if sub is None:
        raise ApiError(404, f"no durable subscription {key[1]!r} of client id {key[0]!r}: "
                       "GET /api/subscriptions lists them (kind \"durable\")")
    if sub.consumer is not None:
        raise ApiError(409, f"durable subscription {key[1]!r} of client id {key[0]!r} is "
                       f"active on connection {sub.connection_id}: close that connection "
                       "(DELETE /api/connections/ID) or have the client unsubscribe first",
                       connection=sub.connection_id)
    pending = sub.queue.depth
    broker.drop_durable(key)
    runtime.pump()  # the store ops that delete it and its messages
    return reply({"deleted": {"client_id": key[0], "name": key[1],
                              "messages_dropped": pending}})
