"""A STOMP client id across two shards of one node, over real Unix-socket links with
real clients: as on one broker, a client that leaves (DISCONNECT, or its socket
dropped) and connects again at once with the same ``client-id`` is accepted, even when
it lands on the other shard and the id's owning shard has not yet heard of the release
(network/shard_clients.py asks the holder); a live connection still keeps the id."""

from __future__ import annotations

import pytest

from meshmq.core.shards import client_owner
from tests.interop.stomp_helpers import RawClient
from tests.support.brokers import poll
from tests.support.shard_pair import ShardPair

ROUNDS = 50


def _owned(k: int, prefix: str) -> str:
    """A client id whose owning shard (of two) is ``k``."""
    n = 0
    while client_owner(f"{prefix}-{n}", 2) != k:
        n += 1
    return f"{prefix}-{n}"


def _connect(pair: ShardPair, shard: int, client_id: str) -> RawClient:
    client = RawClient(pair[shard])
    client.connect(extra=[("client-id", client_id)])
    return client


@pytest.mark.parametrize("owner", [0, 1])
@pytest.mark.parametrize("leave", ["disconnect", "drop"])
def test_a_client_id_is_free_at_once_on_the_other_shard_after_its_connection_ends(
        pair: ShardPair, owner: int, leave: str) -> None:
    client_id = _owned(owner, f"reuse-{leave}")
    client = _connect(pair, 0, client_id)
    for n in range(1, ROUNDS + 1):
        if leave == "disconnect":
            client.send_frame("DISCONNECT", [("receipt", f"bye-{n}")])
            client.read_until_receipt(f"bye-{n}")
        client.close()
        client = _connect(pair, n % 2, client_id)  # never refused "already connected"
    client.close()


def test_a_live_connection_on_the_other_shard_still_keeps_its_client_id(
        pair: ShardPair) -> None:
    for owner in (0, 1):
        client_id = _owned(owner, "live")
        holder = _connect(pair, owner, client_id)
        for shard in (1 - owner, owner, 1 - owner):  # the owner asks the holder
            rival = RawClient(pair[shard])
            rival.send_frame("CONNECT", [("accept-version", "1.2"), ("host", "localhost"),
                                         ("client-id", client_id)])
            error = rival.expect_error_and_close()
            assert error.get("message") == f"Broker: node - Client: {client_id} already " \
                "connected"
            rival.close()
        holder.receipt_roundtrip()  # untouched
        holder.close()
        poll(lambda cid=client_id: _free(pair, cid), what="the release")


def _free(pair: ShardPair, client_id: str) -> bool:
    k = client_owner(client_id, 2)
    shard = pair[k]
    assert shard.runtime is not None and shard.runtime.shard_peers is not None
    clients = shard.runtime.shard_peers.clients
    return shard.run(lambda: client_id not in clients.table)
