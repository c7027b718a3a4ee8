"""Helpers for the MQTT interop suite: a broker with STOMP, MQTT and WebSocket
listeners, a paho-mqtt 2.x wrapper that records what it receives, a raw-socket MQTT
client built on meshmq's own codec (exact wire checks, bad input), and a small
STOMP-over-WebSocket client.

Nothing here sleeps to wait for something: every wait is a condition wait, a socket
read or a poll with a deadline, and it fails loudly when the deadline passes.
Absence is proven with a round trip: a PINGREQ/PINGRESP on the same raw connection
(the broker answers in order), or a marker message published after on the same topic.
"""

from __future__ import annotations

import dataclasses
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as PahoProperties
from paho.mqtt.subscribeoptions import SubscribeOptions
from websockets.sync.client import ClientConnection
from websockets.sync.client import connect as ws_connect

from meshmq.config.model import AuthConfig, BrokerConfig, ListenerConfig, MqttConfig
from meshmq.protocol.mqtt import PROTOCOL_LEVEL_5
from meshmq.protocol.stomp import Frame, StompParser, encode_frame
from tests.interop.stomp_helpers import Client
from tests.support.brokers import ThreadBroker, make_config, poll
from tests.support.mqtt_client_ops import (
    LEVELS,
    TIMEOUT,
    ClosedError,
    ErrorLog,
    MqttClientOps,
    uid,
)
from tests.support.ws_stomp import WsStomp as BaseWsStomp


def mqtt_config(data_dir: Path, *, mqtt: MqttConfig | None = None,
                auth: AuthConfig | None = None, **changes: Any) -> BrokerConfig:
    """STOMP, MQTT and WebSocket listeners on OS-chosen ports, journal in ``data_dir``."""
    config = dataclasses.replace(make_config(data_dir), listeners=(
        ListenerConfig(name="stomp", protocol="stomp", port=0),
        ListenerConfig(name="mqtt", protocol="mqtt", port=0),
        ListenerConfig(name="ws", protocol="ws", port=0)), **changes)
    if mqtt is not None:
        config = dataclasses.replace(config, mqtt=mqtt)
    if auth is not None:
        config = dataclasses.replace(config, auth=auth)
    return config


# ---------------------------------------------------------------------------- raw sockets


class RawMqtt(MqttClientOps):
    """An MQTT client on a bare socket: packets out with meshmq's encoder, packets in
    through a client-side MqttDecoder, exactly as the broker sent them."""

    def __init__(self, port: int, level: int = 4, timeout: float = TIMEOUT, *,
                 source_port: int = 0) -> None:
        super().__init__(level)
        source = ("127.0.0.1", source_port) if source_port else None
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout,
                                             source_address=source)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.eof = False

    def send_bytes(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _read(self, deadline: float) -> bool:
        """Read once; False on EOF. Raises TimeoutError past ``deadline``."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError
        self.sock.settimeout(remaining)
        try:
            data = self.sock.recv(65536)
        except TimeoutError:
            raise
        except OSError:  # a reset or a broken pipe: the broker is gone
            data = b""
        if not data:
            self.eof = True
            return False
        self.pending.extend(self.decoder.feed(data))
        return True

    def _fill(self, deadline: float) -> bool:
        return not self.eof and self._read(deadline)

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def abort(self) -> None:
        """Close abruptly with a TCP reset (no DISCONNECT)."""
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00"
                                 b"\x00\x00\x00\x00")
        except OSError:
            pass
        self.close()


# ---------------------------------------------------------------------------- paho-mqtt


def paho_props(packet_type: int, **values: Any) -> PahoProperties:
    """paho Properties for ``packet_type`` (PacketTypes.PUBLISH, ...) from keywords
    named like paho's (``ContentType=...``, ``UserProperty=[(k, v)]``)."""
    props = PahoProperties(packet_type)
    for name, value in values.items():
        setattr(props, name, value)
    return props


class Paho:
    """A paho-mqtt 2.x client (callback API v2) on its own network thread; records the
    CONNACK, every message, SUBACK and DISCONNECT under one condition."""

    def __init__(self, port: int, *, level: int = 5, client_id: str = "", clean: bool = True,
                 transport: str = "tcp", ws_path: str = "/", keepalive: int = 60,
                 username: str | None = None, password: str | None = None,
                 will: tuple[str, bytes, int, bool] | None = None,
                 session_expiry: int | None = None,
                 connect_properties: dict[str, Any] | None = None,
                 expect_success: bool = True, bind_port: int = 0) -> None:
        self.level = level
        protocol = MQTTProtocolVersion.MQTTv5 if level == 5 else MQTTProtocolVersion.MQTTv311
        self.client = paho.Client(
            CallbackAPIVersion.VERSION2, client_id=client_id,
            clean_session=None if level == 5 else clean, protocol=protocol,
            transport=transport,  # type: ignore[arg-type]
            reconnect_on_failure=False)
        if transport == "websockets":
            self.client.ws_set_options(path=ws_path)
        if username is not None:
            self.client.username_pw_set(username, password)
        if will is not None:
            self.client.will_set(*will)
        self.cond = threading.Condition()
        self.messages: list[paho.MQTTMessage] = []
        self.connacks: list[tuple[Any, Any, Any]] = []  # (flags, reason code, properties)
        self.subacks: dict[int, list[Any]] = {}
        self.unsubacks: dict[int, Any] = {}
        self.disconnects: list[tuple[Any, Any]] = []  # (reason code, properties)
        self.on_message_hook: Callable[[paho.MQTTMessage], None] | None = None
        c = self.client
        c.on_connect = self._on_connect
        c.on_message = self._on_message
        c.on_subscribe = self._on_subscribe
        c.on_unsubscribe = self._on_unsubscribe
        c.on_disconnect = self._on_disconnect
        props = None
        if level == 5:
            values = dict(connect_properties or {})
            if session_expiry is not None:
                values["SessionExpiryInterval"] = session_expiry
            if values:
                props = paho_props(PacketTypes.CONNECT, **values)
        c.connect("127.0.0.1", port, keepalive, bind_port=bind_port,
                  clean_start=clean if level == 5 else paho.MQTT_CLEAN_START_FIRST_ONLY,
                  properties=props)
        c.loop_start()
        self.wait(lambda: self.connacks or self.disconnects, what="CONNACK")
        if expect_success:
            assert self.connacks and not self.reason_code.is_failure, \
                f"connection refused: {self.connacks or self.disconnects}"

    # -- callbacks (network thread) ------------------------------------------------
    def _notify(self, fn: Callable[[], None]) -> None:
        with self.cond:
            fn()
            self.cond.notify_all()

    def _on_connect(self, client: Any, userdata: Any, flags: Any, rc: Any, props: Any) -> None:
        self._notify(lambda: self.connacks.append((flags, rc, props)))

    def _on_message(self, client: Any, userdata: Any, msg: paho.MQTTMessage) -> None:
        self._notify(lambda: self.messages.append(msg))
        if self.on_message_hook is not None:
            self.on_message_hook(msg)

    def _on_subscribe(self, client: Any, userdata: Any, mid: int, codes: list[Any],
                      props: Any) -> None:
        self._notify(lambda: self.subacks.__setitem__(mid, codes))

    def _on_unsubscribe(self, client: Any, userdata: Any, mid: int, codes: Any,
                        props: Any) -> None:
        self._notify(lambda: self.unsubacks.__setitem__(mid, codes))

    def _on_disconnect(self, client: Any, userdata: Any, flags: Any, rc: Any,
                       props: Any) -> None:
        self._notify(lambda: self.disconnects.append((rc, props)))

    # -- waiting ---------------------------------------------------------------------------
    def wait(self, predicate: Callable[[], Any], timeout: float = TIMEOUT,
             what: str = "condition") -> Any:
        with self.cond:
            ok = self.cond.wait_for(predicate, timeout)
            if not ok:
                raise AssertionError(
                    f"timed out after {timeout}s waiting for {what}; have "
                    f"{[(m.topic, m.payload[:40]) for m in self.messages]}, "
                    f"disconnects={self.disconnects}")
            return ok

    @property
    def session_present(self) -> bool:
        return bool(self.connacks[-1][0].session_present)

    @property
    def reason_code(self) -> Any:
        return self.connacks[-1][1]

    @property
    def connack_properties(self) -> Any:
        return self.connacks[-1][2]

    def wait_messages(self, n: int, timeout: float = TIMEOUT) -> list[paho.MQTTMessage]:
        self.wait(lambda: len(self.messages) >= n, timeout, f"{n} messages")
        with self.cond:
            return list(self.messages)

    def wait_for(self, payload: bytes, timeout: float = TIMEOUT) -> list[paho.MQTTMessage]:
        """Everything received up to and including the first message with ``payload``."""
        def found() -> int | None:
            for i, m in enumerate(self.messages):
                if m.payload == payload:
                    return i + 1
            return None
        n = self.wait(found, timeout, f"message {payload!r}")
        with self.cond:
            return list(self.messages[:n])

    def payloads(self) -> list[bytes]:
        with self.cond:
            return [m.payload for m in self.messages]

    # -- actions ---------------------------------------------------------------------------
    def subscribe(self, topic: str, qos: int = 1, *, no_local: bool = False,
                  retain_as_published: bool = False, retain_handling: int = 0,
                  properties: PahoProperties | None = None) -> list[Any]:
        if self.level == 5:
            opts = SubscribeOptions(qos=qos, noLocal=no_local,
                                    retainAsPublished=retain_as_published,
                                    retainHandling=retain_handling)
            rc, mid = self.client.subscribe(topic, options=opts, properties=properties)
        else:
            rc, mid = self.client.subscribe(topic, qos)
        assert rc == 0 and mid is not None, rc
        codes = self.wait(lambda: self.subacks.get(mid), what=f"SUBACK {mid}")
        return list(codes)

    def unsubscribe(self, topic: str) -> Any:
        rc, mid = self.client.unsubscribe(topic)
        assert rc == 0 and mid is not None
        return self.wait(lambda: mid in self.unsubacks and (self.unsubacks[mid],),
                         what=f"UNSUBACK {mid}")[0]

    def publish(self, topic: str, payload: bytes = b"", qos: int = 1, retain: bool = False,
                properties: PahoProperties | None = None, *, wait: bool = True
                ) -> paho.MQTTMessageInfo:
        info = self.client.publish(topic, payload, qos, retain, properties)
        assert info.rc == 0, info.rc
        if wait:
            info.wait_for_publish(TIMEOUT)
            assert info.is_published(), f"{topic} not acknowledged in time"
        return info

    def disconnect(self) -> None:
        if self.client.is_connected():
            self.client.disconnect()
            self.wait(lambda: self.disconnects, what="the DISCONNECT to complete")
        self.client.loop_stop()

    def close(self) -> None:
        try:
            self.disconnect()
        except Exception:
            self.client.loop_stop()


# ---------------------------------------------------------------------------- STOMP over WS


class WsStomp(BaseWsStomp):
    """STOMP 1.2 over a websockets connection (subprotocol ``v12.stomp``), connected as
    it is made (with ``login``/``passcode``, from ``source_port`` if given)."""

    def __init__(self, port: int, path: str = "/", *, login: str | None = None,
                 passcode: str | None = None, source_port: int = 0) -> None:
        source = ("127.0.0.1", source_port) if source_port else None
        sock = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT,
                                        source_address=source)
        self.ws: ClientConnection = ws_connect(
            f"ws://127.0.0.1:{port}{path}", sock=sock, subprotocols=["v12.stomp"],  # type: ignore[list-item]
            compression=None, proxy=None, open_timeout=TIMEOUT, close_timeout=TIMEOUT,
            max_size=None, ping_interval=None)
        self.parser = StompParser(version="1.2")
        self.pending: list[Frame] = []
        credentials = [("login", login), ("passcode", passcode or "")] if login else []
        self.send("CONNECT", [("accept-version", "1.2"), ("host", "/"), *credentials])
        self.next("CONNECTED")

    def send(self, command: str, headers: Iterable[tuple[str, str]], body: bytes = b"") -> None:
        self.ws.send(encode_frame(command, list(headers), body))

    def next(self, command: str | None = None, timeout: float = TIMEOUT) -> Frame:
        deadline = time.monotonic() + timeout
        while not self.pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"no STOMP frame within {timeout}s")
            try:
                data = self.ws.recv(timeout=remaining)
            except TimeoutError:
                raise AssertionError(f"no STOMP frame within {timeout}s") from None
            raw = data.encode() if isinstance(data, str) else data
            self.pending.extend(f for f in self.parser.feed(raw) if f.command)
        frame = self.pending.pop(0)
        assert command is None or frame.command == command, (frame.command, frame.headers)
        return frame

    def close(self) -> None:
        try:
            self.ws.close()
        except Exception:
            pass


# ---------------------------------------------------------------------------- the broker


class MqttEnv:
    """A ThreadBroker with STOMP, MQTT and WS listeners plus client factories; every
    client made here is closed by :meth:`close`, which also fails the test if the broker
    logged an error meanwhile (an exception in its pump, an internal error)."""

    def __init__(self, data_dir: Path, **config: Any) -> None:
        self.errors = ErrorLog()
        logging.getLogger().addHandler(self.errors)
        self.broker = ThreadBroker(mqtt_config(data_dir, **config)).start()
        self._closers: list[Callable[[], None]] = []

    @property
    def runtime(self) -> Any:
        assert self.broker.runtime is not None
        return self.broker.runtime

    @property
    def mqtt_port(self) -> int:
        return int(self.runtime.addresses["mqtt"][1])

    @property
    def ws_port(self) -> int:
        return int(self.runtime.addresses["ws"][1])

    def raw(self, level: int = 4) -> RawMqtt:
        r = RawMqtt(self.mqtt_port, level)
        self._closers.append(r.close)
        return r

    def raw_connected(self, level: int = 4, client_id: str | None = None, **kw: Any) -> RawMqtt:
        r = self.raw(level)
        r.connect(uid("raw") if client_id is None else client_id, **kw)
        return r

    def paho(self, level: int = 5, **kw: Any) -> Paho:
        kw.setdefault("client_id", uid("paho"))
        port = self.ws_port if kw.get("transport") == "websockets" else self.mqtt_port
        p = Paho(port, level=level, **kw)
        self._closers.append(p.close)
        return p

    def stomp(self, version: str = "1.2", **kw: Any) -> Client:
        c = Client(self.broker, version, **kw)
        self._closers.append(c.disconnect)
        return c

    def ws_stomp(self, login: str | None = None, passcode: str | None = None) -> WsStomp:
        w = WsStomp(self.ws_port, login=login, passcode=passcode)
        self._closers.append(w.close)
        return w

    def durables(self, client_id: str) -> list[str]:
        """Names of the durable subscriptions the broker holds for ``client_id``."""
        rt = self.runtime
        return self.broker.run(lambda: sorted(
            name for cid, name in rt.broker.durables if cid == client_id))

    def assert_healthy(self, bystander: Paho | None = None) -> None:
        """Nothing else is affected: a connected client still round-trips and the broker
        still accepts new MQTT connections at both levels."""
        if bystander is not None:
            topic = uid("health/")
            bystander.subscribe(topic, 1)
            payload = uid("alive-").encode()
            bystander.publish(topic, payload, 1)
            bystander.wait_for(payload)
        for level in LEVELS:
            r = RawMqtt(self.mqtt_port, level)
            try:
                r.connect(uid("fresh"))
                assert r.ping() == []
            finally:
                r.close()

    def close(self) -> None:
        for closer in reversed(self._closers):
            try:
                closer()
            except Exception:
                pass
        self.broker.stop()
        logging.getLogger().removeHandler(self.errors)
        assert self.errors.records == [], f"the broker logged errors: {self.errors.messages()}"


__all__ = [
    "LEVELS", "PROTOCOL_LEVEL_5", "TIMEOUT", "ClosedError", "MqttEnv", "Paho", "RawMqtt",
    "WsStomp", "mqtt_config", "paho_props", "poll", "uid",
]
