"""Replicated master/slave over mutual TLS (``ha.ssl_*``): a pair and a witness
replicate and fail over; a would-be node without a trusted certificate, or without TLS,
is refused with one line per cause and disturbs nothing."""

from __future__ import annotations

import asyncio
import socket
import ssl
from pathlib import Path

import pytest

from meshmq.client import FailoverClient, Message
from meshmq.protocol.wire import MAGIC, FrameType, encode_json
from tests.client.test_client_features import run
from tests.support.brokers import poll
from tests.support.pki import Pki
from tests.support.replicated import Cluster, make_cluster, wait_caught_up

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


def _tls_cluster(tmp_path: Path, pki: Pki) -> Cluster:
    cluster = make_cluster(tmp_path, ("A", "B"), witness=True)
    certs = {"A": pki.broker("a"), "B": pki.broker("b"), "W": pki.broker("a")}
    for m in cluster.members:
        cert, key = certs[m.name]
        m.node.ha.update(ssl_certfile=str(cert), ssl_keyfile=str(key), ssl_cafile=str(pki.ca))
    return cluster


def test_a_pair_and_witness_over_mutual_tls_replicate_and_fail_over(
        tmp_path: Path, pki: Pki) -> None:
    cluster = _tls_cluster(tmp_path, pki).start()
    try:
        master = cluster.wait_master()
        slave = next(m for m in cluster.data if m is not master)
        uri = cluster.failover_uri()

        async def send() -> None:
            async with FailoverClient(uri) as producer:
                for i in range(5):
                    await producer.send("/queue/tls.repl", f"m{i}", persistent=True)

        run(send())
        wait_caught_up(master, slave)
        master.kill9()
        assert cluster.wait_master(exclude=(master.name,)) is slave

        async def receive() -> list[str]:
            got: list[str] = []
            async with FailoverClient(uri) as consumer:
                done = asyncio.Event()

                def on_message(msg: Message) -> None:
                    got.append(msg.text)
                    if len(got) == 5:
                        done.set()

                await consumer.subscribe("/queue/tls.repl", callback=on_message)
                async with asyncio.timeout(30):
                    await done.wait()
            return got

        assert sorted(run(receive())) == [f"m{i}" for i in range(5)]
        assert "does not trust" not in slave.log()
    finally:
        cluster.close()


def _intrude(port: int, ctx: ssl.SSLContext | None) -> bytes:
    """Dial a replication port as a would-be member: TLS with ``ctx`` or plaintext, then
    a replication HELLO. Returns what came back before the node closed the link."""
    hello = MAGIC + encode_json(FrameType.HELLO, {"replication": 1, "node": "intruder"})
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        conn: socket.socket = raw
        try:
            if ctx is not None:
                conn = ctx.wrap_socket(raw, server_hostname="127.0.0.1")
            conn.sendall(hello)
            data = b""
            while chunk := conn.recv(4096):
                data += chunk
            return data
        except (ssl.SSLError, ConnectionError):
            return b""
        finally:
            conn.close()


def test_a_node_without_a_trusted_certificate_or_tls_is_refused(tmp_path: Path,
                                                                pki: Pki) -> None:
    cluster = _tls_cluster(tmp_path, pki).start()
    try:
        master = cluster.wait_master()
        port = master.repl
        stranger = ssl.create_default_context(cafile=str(pki.ca))
        stranger.load_cert_chain(*pki.stranger("broker"))
        no_cert = ssl.create_default_context(cafile=str(pki.ca))
        for _ in range(3):  # nodes retry: each cause is logged once
            assert _intrude(port, None) == b""
            assert _intrude(port, stranger) == b""
            assert _intrude(port, no_cert) == b""

        def refusals() -> list[str]:
            return [line for line in master.log().splitlines()
                    if "replication: refused a link from" in line]

        poll(lambda: len(refusals()) >= 3, 10, "three refusals logged")
        lines = refusals()
        assert len(lines) == 3, lines
        assert any("the node speaks plaintext" in line for line in lines)
        assert sum("CERTIFICATE" in line.upper() for line in lines) == 2
        assert "Traceback" not in master.log()
        assert cluster.masters() == [master]  # nothing else was disturbed
    finally:
        cluster.close()
