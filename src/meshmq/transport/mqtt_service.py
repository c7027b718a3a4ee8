"""What MQTT keeps across its connections: live sessions by client id, persistent
sessions between connections, connections still being taken apart, and wills
waiting for their delay.

Why a service of its own: these outlive any one connection but are MQTT's alone, so
they belong neither to a connection's session nor to the runtime (which only creates
one ``MqttService`` and ends it at shutdown).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from meshmq.core.message import Message
    from meshmq.transport.host import SessionHost
    from meshmq.transport.mqtt_server import MqttSession, SessionState, SessionTeardown

RETAIN_PROPERTY = "ActiveMQ.Retain"  # ActiveMQ's name for an MQTT message's retain flag


class MqttService:
    """Owned by the runtime; every MQTT session of it receives the same one."""

    def __init__(self, host: SessionHost) -> None:
        self.host = host
        self.sessions: dict[str, MqttSession] = {}  # client id -> live session
        self.states: dict[str, SessionState] = {}  # persistent sessions
        # Client id -> the connection (or expired session) still being taken apart.
        self.teardowns: dict[str, SessionTeardown] = {}
        self._wills: dict[str, asyncio.TimerHandle] = {}
        clients = host.durability.clients
        if clients is not None:  # a node of shards: the owner ends expired sessions
            clients.session_expired = self.expire_session

    def schedule_will(self, client_id: str, message: Message, delay_s: int) -> None:
        """Publish an MQTT will now, or after its delay unless the client comes back."""
        retain = message.properties.get(RETAIN_PROPERTY) is True
        host = self.host

        def publish() -> None:
            self._wills.pop(client_id, None)
            host.broker.publish_internal(message, retain=retain)
            host.pump()

        self.cancel_will(client_id)
        if delay_s <= 0:
            publish()
        else:
            self._wills[client_id] = asyncio.get_running_loop().call_later(delay_s, publish)

    def cancel_will(self, client_id: str) -> None:
        handle = self._wills.pop(client_id, None)
        if handle is not None:
            handle.cancel()

    def forget_session(self, client_id: str) -> None:
        """On a node of shards: another shard resumed ``client_id``'s session, so the
        copy kept here ends without deleting anything (its expiry would end the session
        the other shard now runs)."""
        state = self.states.get(client_id)
        if state is not None and client_id not in self.sessions:
            if state.expiry_handle is not None:
                state.expiry_handle.cancel()
            del self.states[client_id]

    def expire_session(self, client_id: str) -> None:
        """On a node of shards, as the client id's owner: its session expired (no
        connection holds it), so its durable subscriptions go, here and on every other
        shard, then its record."""
        from meshmq.transport.mqtt_server import SessionTeardown

        state = self.states.pop(client_id, None)
        if state is not None and state.expiry_handle is not None:
            state.expiry_handle.cancel()
        pending = self.teardowns.get(client_id)
        if pending is not None:
            pending.drop_session()  # its connection is still being taken apart here
        else:
            SessionTeardown(self.host, client_id, None, drop_session=True).start()

    def stop(self) -> None:
        """Shutdown: wills still waiting are not published."""
        for handle in self._wills.values():
            handle.cancel()
        self._wills.clear()

    def finish_teardowns(self) -> None:
        """Shutdown: what clean sessions leave behind is deleted now, as ever."""
        for teardown in list(self.teardowns.values()):
            teardown.finish()
