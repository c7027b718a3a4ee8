"""A bridge between two in-process brokers: demand forwarding end to end."""

from __future__ import annotations

from pathlib import Path

from tests.interop.stomp_helpers import uid
from tests.network.helpers import (
    bridges,
    connector,
    consumers_on,
    net_config,
    tcp_uri,
    wait_forwarding,
)
from tests.support.brokers import ThreadBroker, poll


def test_queue_messages_follow_a_remote_consumer(tmp_path: Path, client) -> None:
    b = ThreadBroker(net_config(tmp_path / "b", "B")).start()
    a = ThreadBroker(net_config(tmp_path / "a", "A", connector(f"static:({tcp_uri(b)})"))).start()
    try:
        wait_forwarding(a)
        q = f"/queue/{uid('fw')}"
        consumer = client(on=b)
        consumer.subscribe(q)
        poll(lambda: consumers_on(a, q.replace("/queue/", "queue://")) == 1,
             what="demand on A")
        producer = client(on=a)
        for i in range(20):
            producer.send(q, str(i), {"persistent": "true"})
        poll(lambda: len(consumer.listener.messages) == 20, what="20 forwarded messages")
        assert consumer.bodies() == [str(i) for i in range(20)]
        status = bridges(a)[0]
        assert status["remote_broker"] == "B" and status["forwarded"] == 20
        assert status["remote_client_uris"] == [f"stomp://127.0.0.1:{b.port}"]
        inbound = [s for s in bridges(b) if s["direction"] == "inbound"]
        assert inbound[0]["remote_client_uris"] == [f"stomp://127.0.0.1:{a.port}"]
        poll(lambda: bridges(a)[0]["acknowledged"] == 20, what="acks")
    finally:
        a.stop()
        b.stop()


def test_clients_learn_the_network_from_connected(tmp_path: Path, client) -> None:
    """Topology push (update_cluster_clients): a STOMP client of A is told where B's
    clients connect."""
    b = ThreadBroker(net_config(tmp_path / "b", "B", update_cluster_clients=True)).start()
    a = ThreadBroker(net_config(tmp_path / "a", "A", connector(f"static:({tcp_uri(b)})"),
                                update_cluster_clients=True)).start()
    try:
        wait_forwarding(a)
        c = client(on=a)
        peers = c.listener.connected[0].headers.get("meshmq-peers", "")
        assert f"stomp://127.0.0.1:{b.port}" in peers.split(",")
        c2 = client(on=b)  # the accepting side knows its peer too
        assert f"stomp://127.0.0.1:{a.port}" in \
            c2.listener.connected[0].headers.get("meshmq-peers", "").split(",")
    finally:
        a.stop()
        b.stop()


def test_a_peer_sending_garbage_interest_costs_only_its_link(tmp_path: Path) -> None:
    """A fake broker answers the handshake, then sends a malformed INTEREST: the bridge
    refuses it with a protocol error, backs off, and keeps retrying."""
    import json
    import socket
    import struct
    import threading

    from meshmq.protocol.wire import FrameType, WireDecoder, decode_json

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    refusals: list[dict[str, object]] = []

    def frame(ftype: FrameType, body: dict[str, object]) -> bytes:
        data = json.dumps(body).encode()
        return struct.pack(">IB", len(data) + 1, ftype) + data

    def serve() -> None:
        for _ in range(2):
            conn, _ = server.accept()
            with conn:
                decoder = WireDecoder(expect_magic=True)
                got: list = []
                while not got:
                    got = decoder.feed(conn.recv(65536))
                conn.sendall(frame(FrameType.WELCOME, {"version": 1, "broker": "FAKE"}) +
                             frame(FrameType.INTEREST, {"op": "sync", "items": "oops"}))
                frames: list = []
                while True:
                    data = conn.recv(65536)
                    if not data:
                        break
                    frames += decoder.feed(data)
                refusals.extend(decode_json(f) for f in frames
                                if f.type is FrameType.REFUSE)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    a = ThreadBroker(net_config(tmp_path / "a", "A", connector(
        f"static:(tcp://127.0.0.1:{port})"))).start()
    try:
        thread.join(20)
        assert not thread.is_alive(), "the bridge did not come back after the refusal"
        assert len(refusals) == 2
        assert refusals[0]["code"] == "protocol-error"
        assert "items must be a list" in str(refusals[0]["message"])
        poll(lambda: bridges(a)[0]["state"] in ("backing-off", "connecting"),
             what="the bridge backing off")
    finally:
        a.stop()
        server.close()

