"""A `ws://` listener from the broker configuration serves STOMP over WebSocket."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from websockets.sync.client import connect

from meshmq.config.model import ListenerConfig
from meshmq.protocol.stomp import StompParser, encode_frame
from tests.support.brokers import ThreadBroker, make_config


def test_configured_ws_listener_carries_stomp(tmp_path: Path) -> None:
    config = dataclasses.replace(make_config(tmp_path / "data"), listeners=(
        ListenerConfig(name="stomp", protocol="stomp", host="127.0.0.1", port=0),
        ListenerConfig(name="ws", protocol="ws", host="127.0.0.1", port=0)))
    broker = ThreadBroker(config).start()
    try:
        assert broker.runtime is not None
        port = broker.runtime.addresses["ws"][1]
        with connect(f"ws://127.0.0.1:{port}/", subprotocols=["v12.stomp"],
                     open_timeout=10) as ws:
            assert ws.subprotocol == "v12.stomp"
            parser = StompParser(version="1.2")
            ws.send(encode_frame("CONNECT", [("accept-version", "1.2"), ("host", "x")]))
            ws.send(encode_frame("SUBSCRIBE", [("destination", "/queue/ws"), ("id", "1"),
                                               ("receipt", "sub")]))
            ws.send(encode_frame("SEND", [("destination", "/queue/ws")], b"over ws"))
            frames: list = []  # type: ignore[type-arg]
            while not any(f.command == "MESSAGE" for f in frames):
                data = ws.recv(timeout=10)
                frames += parser.feed(data if isinstance(data, bytes) else data.encode())
            assert [f.command for f in frames][:2] == ["CONNECTED", "RECEIPT"]
            assert [f.body for f in frames if f.command == "MESSAGE"] == [b"over ws"]
    finally:
        broker.stop()
