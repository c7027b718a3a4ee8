"""Races of client-id claims that wait at their owner (network/shard_clients.py), on the
link-less three-shard mesh of test_shard_clients.py, each carried message by message to
the moment the race needs:

* a connection that ends while the owner's take-over for its claim is still closing the
  old holder: its release withdraws the claim, so the id is not granted to a claim
  nobody holds;
* two claims of one id on one shard, the older still waiting: the newer one withdraws
  it, so the owner's table never ends up naming the older one;
* a claim on a shard whose move (of a handed connection) is still unanswered: the move
  is withdrawn and undone at the owner, so the connection left on the offering shard is
  still known there and taken over;
* a claimer's link lost while its claim waits: the owner forgets that claim, so a
  connection that ended meanwhile (its release lost with the link) is not granted the
  id later.

After each, one connection at most holds the id, and the owner's table names it."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable

import pytest
from tests.unit.network.test_shard_client_moves import CutMesh, _hand, _holder
from tests.unit.network.test_shard_clients import COUNT, Conn, Mesh, _owned, _run, mesh

__all__ = ["mesh"]  # the fixture


def _carry_until(mesh: Mesh, done: Callable[[], bool]) -> None:
    """Deliver what is on the wire (and what waits for a pump) one at a time, in
    order, until ``done``."""
    for _ in range(100):
        if done():
            return
        for shard in mesh.shards:
            shard._send_changes()
        if mesh.wire:
            src, dst, body = mesh.wire.pop(0)
            target = mesh.shards[dst]
            target.on_interest(target.peers.peers[src], body)  # type: ignore[arg-type]
        elif mesh.later:
            mesh.later.pop(0)()
        else:
            break
    assert done(), "the race's moment never came"


def _closing(mesh: Mesh, owner: int) -> bool:
    """Is a take-over waiting for a holder to close, on the owner?"""
    return any(mesh.shards[owner]._closing.values())


def _one_holder(mesh: Mesh, owner: int, cid: str, conns: list[Conn]) -> None:
    live = [c for c in conns if not c.closed and c.granted]
    assert len(live) <= 1, [(c.shard, c.closed) for c in live]
    if live:
        held = mesh.shards[live[0].shard].held[cid]
        assert _holder(mesh, owner, cid) == (live[0].shard, held.claim)
    else:
        assert _holder(mesh, owner, cid) is None


TRIOS = [c for c in itertools.product(range(COUNT), repeat=3) if c[0] != c[1]]


@pytest.mark.parametrize(("old", "new", "owner"), TRIOS)
def test_a_connection_that_ends_while_its_take_over_is_pending_frees_the_id(
        mesh: Mesh, old: int, new: int, owner: int) -> None:
    def body() -> None:
        cid = _owned(owner)
        first = Conn(mesh, old, cid).claim()
        mesh.run()
        rival = Conn(mesh, new, cid).claim()
        _carry_until(mesh, lambda: _closing(mesh, owner))
        rival.close()  # its client left before the CONNACK
        mesh.run()
        assert first.closed  # (the take-over was under way)
        assert rival.answer is not None and rival.answer.cancelled()
        _one_holder(mesh, owner, cid, [first, rival])
        # The id is free: a STOMP client-id is accepted anywhere, and held.
        again = Conn(mesh, old, cid, "stomp").claim()
        mesh.run()
        assert again.granted
        _one_holder(mesh, owner, cid, [first, rival, again])
    _run(body)


@pytest.mark.parametrize(("old", "new", "owner"), TRIOS)
def test_a_newer_claim_on_the_same_shard_withdraws_the_waiting_one(
        mesh: Mesh, old: int, new: int, owner: int) -> None:
    def body() -> None:
        cid = _owned(owner)
        first = Conn(mesh, old, cid).claim()
        mesh.run()
        older = Conn(mesh, new, cid).claim()
        _carry_until(mesh, lambda: _closing(mesh, owner))
        first.close()  # the old holder leaves while the take-over closes it
        newer = Conn(mesh, new, cid).claim()  # and the client tries again, same shard
        mesh.run()
        assert older.answer is not None and older.answer.exception() is not None
        assert newer.granted and not newer.closed
        older.closed = True  # refused: its connection is closed by its shard
        _one_holder(mesh, owner, cid, [first, older, newer])
        # Released, the id is free (not held by the older claim).
        newer.close()
        mesh.run()
        assert _holder(mesh, owner, cid) is None
    _run(body)


@pytest.mark.parametrize(("old", "new", "owner"), [t for t in TRIOS if t[1] != t[2]])
def test_a_claim_that_overtakes_a_move_on_its_shard_takes_over_the_connection_left(
        mesh: Mesh, old: int, new: int, owner: int) -> None:
    def body() -> None:
        cid = _owned(owner)
        first = Conn(mesh, old, cid).claim()
        mesh.run()
        handed = _hand(mesh, first, new)
        assert handed is not None
        # (The adopting shard is not the owner: the move waits for its answer.)
        rival = Conn(mesh, new, cid).claim()  # before the owner's answer to the move
        assert handed.settle(mesh) is False  # so the connection stays where it was
        mesh.run()
        assert rival.granted and first.closed  # taken over, as any other holder
        _one_holder(mesh, owner, cid, [first, handed.new, rival])
    _run(body)


def test_a_claimers_lost_link_withdraws_its_waiting_claim() -> None:
    async def go() -> None:
        mesh = CutMesh()
        cid = _owned(2)
        first = Conn(mesh, 0, cid).claim()
        mesh.run()
        rival = Conn(mesh, 1, cid).claim()
        _carry_until(mesh, lambda: _closing(mesh, 2))
        mesh.cut_link(1, 2)
        rival.close()  # its release goes nowhere: the link is down
        mesh.mend_link(1, 2)
        mesh.run()
        assert first.closed
        _one_holder(mesh, 2, cid, [first, rival])
    asyncio.run(go())
