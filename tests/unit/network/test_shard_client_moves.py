"""Moving a client id's claim with a connection handed to another shard
(network/shard_clients.py: ``movable``, ``move``, ``handed``, ``kept``), on the
link-less three-shard mesh of test_shard_clients.py. The owner switches its table from
the old holder to the new one in one step: the id is never free meanwhile, the old
shard's release frees nothing, a second CONNECT anywhere takes over (MQTT) or is refused
(STOMP) as before, and a move that fails leaves the connection where it was, holding
the id. A Hypothesis state machine mixes moves, claims (several waiting on one shard
included), releases (of claims still waiting too) and lost links in any order and
checks that one connection at most holds each id, and that the owner's table names it
(test_shard_claim_races.py names each race it found)."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, rule
from tests.unit.network.test_shard_clients import COUNT, Conn, Mesh, _owned, _run, mesh

from meshmq.errors import MeshmqError

__all__ = ["mesh"]  # the fixture


class CutMesh(Mesh):
    """The mesh with single links that can be cut and mended."""

    def __init__(self) -> None:
        self.cut: set[frozenset[int]] = set()
        super().__init__()

    def _claims(self, k: int) -> Any:
        claims = super()._claims(k)
        carry = claims._queue

        def queue(peer: Any, body: dict[str, Any]) -> None:
            if frozenset((k, peer.index)) not in self.cut:
                carry(peer, body)

        claims._queue = queue  # type: ignore[method-assign]
        return claims

    def cut_link(self, a: int, b: int) -> None:
        self.cut.add(frozenset((a, b)))
        self.wire = [w for w in self.wire if {w[0], w[1]} != {a, b}]
        for x, y in ((a, b), (b, a)):
            peer = self.shards[x].peers.peers[y]
            peer.link = None  # type: ignore[attr-defined]
            self.shards[x].link_down(peer)  # type: ignore[arg-type]

    def mend_link(self, a: int, b: int) -> None:
        self.cut.discard(frozenset((a, b)))
        for x, y in ((a, b), (b, a)):
            self.shards[x].peers.peers[y].link = "up"  # type: ignore[attr-defined]
        for x, y in ((a, b), (b, a)):
            self.shards[x].link_up(self.shards[x].peers.peers[y])  # type: ignore[arg-type]


@dataclass
class Handed:
    """A connection handed from shard ``old.shard`` to ``new.shard``: the offering
    shard learns the adopting shard's answer (taken or not) as the handoff channel
    would tell it, after the owner's answer."""

    old: Conn
    new: Conn
    claim: str

    def settle(self, mesh: Mesh) -> bool | None:
        """Apply the answer once there is one: True handed, False kept, None waiting."""
        answer = self.new.answer
        assert answer is not None
        if not answer.done():
            return None
        taken = not answer.cancelled() and answer.exception() is None
        claims = mesh.shards[self.old.shard]
        if taken:
            claims.handed(self.old.client_id, self.claim)
            self.old.closed = True  # gone from the offering shard, nothing released
        else:
            claims.kept(self.old.client_id, self.claim)
        return taken


def _hand(mesh: Mesh, conn: Conn, to: int) -> Handed | None:
    claims = mesh.shards[conn.shard]
    claim = claims.movable(conn.client_id)
    if claim is None:
        return None
    new = Conn(mesh, to, conn.client_id, conn.proto)
    moved = mesh.shards[to].move(conn.client_id, conn.proto, conn.shard, claim, new.close)
    if moved is None:
        return None
    new.answer, new.release = moved
    return Handed(conn, new, claim)


def _holder(mesh: Mesh, owner: int, cid: str) -> tuple[int, str] | None:
    entry = mesh.shards[owner].table.get(cid)
    return None if entry is None else (entry.shard, entry.claim)


CASES = [c for c in itertools.product(range(COUNT), repeat=3) if c[0] != c[1]]


@pytest.mark.parametrize(("old", "new", "owner"), CASES)
def test_a_moved_claim_names_the_new_shard_and_the_old_release_frees_nothing(
        mesh: Mesh, old: int, new: int, owner: int) -> None:
    def body() -> None:
        cid = _owned(owner)
        first = Conn(mesh, old, cid).claim()
        mesh.run()
        handed = _hand(mesh, first, new)
        assert handed is not None
        mesh.run()
        assert handed.settle(mesh) is True
        assert _holder(mesh, owner, cid) == (new, mesh.shards[new].held[cid].claim)
        assert cid not in mesh.shards[old].held
        assert first.release is not None
        first.release()  # the old shard's connection ends later: nothing is freed
        mesh.run()
        assert _holder(mesh, owner, cid) is not None
        assert _holder(mesh, owner, cid) == (new, mesh.shards[new].held[cid].claim)
        # A second MQTT connection, on any shard, takes the handed one over.
        rival = Conn(mesh, old, cid).claim()
        mesh.run()
        assert rival.granted and handed.new.closed
        assert _holder(mesh, owner, cid) == (old, mesh.shards[old].held[cid].claim)
    _run(body)


@pytest.mark.parametrize(("old", "new", "owner"), CASES)
def test_a_moved_stomp_client_id_is_still_refused_to_a_second_connection(
        mesh: Mesh, old: int, new: int, owner: int) -> None:
    def body() -> None:
        cid = _owned(owner, "stomp")
        first = Conn(mesh, old, cid, "stomp").claim()
        mesh.run()
        handed = _hand(mesh, first, new)
        assert handed is not None
        mesh.run()
        assert handed.settle(mesh) is True
        for shard in range(COUNT):
            rival = Conn(mesh, shard, cid, "stomp").claim()
            mesh.run()
            assert rival.answer is not None and rival.answer.done()
            exc = rival.answer.exception()
            assert isinstance(exc, MeshmqError) and exc.code == "client-id-in-use"
        assert not handed.new.closed
        # Released by its new shard, the id is free for the next connection.
        handed.new.close()
        mesh.run()
        assert _holder(mesh, owner, cid) is None
        again = Conn(mesh, old, cid, "stomp").claim()
        mesh.run()
        assert again.granted
    _run(body)


def test_a_move_is_refused_once_the_old_connection_released_the_id(mesh: Mesh) -> None:
    def body() -> None:
        cid = _owned(2)
        first = Conn(mesh, 0, cid).claim()
        mesh.run()
        handed = _hand(mesh, first, 1)
        assert handed is not None
        first.close()
        # Its release reaches the owner before the move (another link's message).
        mesh.wire.sort(key=lambda w: w[0] != 0)
        mesh.run()
        assert handed.settle(mesh) is False
        assert not handed.new.granted
        assert _holder(mesh, 2, cid) is None and cid not in mesh.shards[1].held
    _run(body)


def test_a_move_is_refused_while_a_take_over_closes_the_old_connection(mesh: Mesh) -> None:
    def body() -> None:
        cid = _owned(2)
        first = Conn(mesh, 0, cid).claim()
        mesh.run()
        rival = Conn(mesh, 2, cid).claim()  # on the owner: its client-close is sent now
        handed = _hand(mesh, first, 1)
        assert handed is not None
        mesh.run()
        assert handed.settle(mesh) is False
        assert first.closed and rival.granted and not handed.new.granted
        assert _holder(mesh, 2, cid) == (2, mesh.shards[2].held[cid].claim)
    _run(body)


def test_a_take_over_after_the_move_closes_the_adopted_connection_not_the_old(
        mesh: Mesh) -> None:
    def body() -> None:
        cid = _owned(2)
        first = Conn(mesh, 0, cid).claim()
        mesh.run()
        handed = _hand(mesh, first, 1)
        assert handed is not None
        mesh.run()  # moved; the offering shard has not heard yet
        rival = Conn(mesh, 2, cid).claim()
        mesh.run()
        assert rival.granted and handed.new.closed and not first.closed
        assert handed.settle(mesh) is True  # then the handoff answer reaches shard 0
        assert _holder(mesh, 2, cid) == (2, mesh.shards[2].held[cid].claim)
    _run(body)


def test_an_unclaimed_or_unstored_id_is_not_movable(mesh: Mesh) -> None:
    def body() -> None:
        cid = _owned(2)
        assert mesh.shards[0].movable(cid) is None
        conn = Conn(mesh, 0, cid).claim()
        assert mesh.shards[0].movable(cid) is None  # not granted yet
        mesh.run()
        assert mesh.shards[0].movable(cid) is not None
        # A session record not yet stored by the owner would arrive after the move
        # and be ignored: not movable. A drop is sent again by the adopting shard.
        mesh.shards[0].put_session(cid, b'{"expiry": 10}')
        assert mesh.shards[0].movable(cid) is None
        mesh.run()
        assert mesh.shards[0].movable(cid) is not None
        mesh.shards[0].drop_session(cid)
        assert mesh.shards[0].movable(cid) is not None
        assert conn.granted
        # The adopting shard already claims the id itself: no move is asked.
        Conn(mesh, 1, cid).claim()
        assert mesh.shards[1].move(cid, "mqtt", 0, "x", lambda: None) is None
    _run(body)


def test_the_owners_link_lost_mid_move_leaves_the_connection_holding_the_id() -> None:
    async def go() -> None:
        mesh = CutMesh()
        cid = _owned(2)
        first = Conn(mesh, 0, cid).claim()
        mesh.run()
        handed = _hand(mesh, first, 1)
        assert handed is not None
        for shard in mesh.shards:
            shard._send_changes()
        # The owner makes the move, then its link to the adopting shard is lost before
        # the answer: the owner undoes it, the adopting shard fails it.
        src, dst, msg = mesh.wire.pop(0)
        assert (src, dst, msg["op"]) == (1, 2, "client-move")
        mesh.shards[2].on_interest(mesh.shards[2].peers.peers[1], msg)  # type: ignore[arg-type]
        mesh.cut_link(1, 2)
        assert handed.settle(mesh) is False
        mesh.run()
        assert not first.closed
        assert _holder(mesh, 2, cid) == (0, handed.claim)
        mesh.mend_link(1, 2)
        mesh.run()
        assert _holder(mesh, 2, cid) == (0, handed.claim)
        assert cid not in mesh.shards[1].held
    asyncio.run(go())


class MoveRaces(RuleBasedStateMachine):
    """Claims, moves, releases, the offering shard's answer and lost links of one
    MQTT client id, in any order; messages on each link in order, links interleaved.
    A connection may end, or a second claim come on its shard, while its claim (or
    move) still waits for the owner."""

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self.loop)
        self.mesh: CutMesh = self._in_loop(CutMesh)
        self.cid = _owned(1)
        self.conns: list[Conn] = []
        self.moves: list[Handed] = []

    def _in_loop(self, call: Callable[[], Any]) -> Any:
        async def go() -> Any:
            return call()
        return self.loop.run_until_complete(go())

    @rule(shard=st.integers(0, COUNT - 1))
    def connect(self, shard: int) -> None:
        conn = self._in_loop(lambda: Conn(self.mesh, shard, self.cid).claim())
        # A connection with the id on the same shard is taken over there, by the core
        # (one broker's rule): its release then frees nothing.
        for old in self.conns:
            if old.shard == shard and not old.closed and old.release is not None:
                self._in_loop(old.close)
        self.conns.append(conn)

    @rule(data=st.data(), to=st.integers(0, COUNT - 1))
    def hand(self, data: st.DataObject, to: int) -> None:
        live = [c for c in self.conns if self._live(c) and c.shard != to]
        if live:
            conn = data.draw(st.sampled_from(live))
            handed = self._in_loop(lambda: _hand(self.mesh, conn, to))
            if handed is not None:
                self.conns.append(handed.new)
                self.moves.append(handed)

    @rule(data=st.data())
    def disconnect(self, data: st.DataObject) -> None:
        # Granted or still waiting for the owner (a take-over under way, say).
        live = [c for c in self.conns if not c.closed and c.release is not None]
        if live:
            data.draw(st.sampled_from(live)).close()

    @rule(data=st.data())
    def carry_one(self, data: st.DataObject) -> None:
        """Deliver the first waiting message of one link."""
        mesh = self.mesh
        for shard in mesh.shards:
            shard._send_changes()
        heads: dict[tuple[int, int], int] = {}
        for i, (src, dst, _) in enumerate(mesh.wire):
            heads.setdefault((src, dst), i)
        if heads:
            i = data.draw(st.sampled_from(sorted(heads.values())))
            src, dst, msg = mesh.wire.pop(i)
            target = mesh.shards[dst]
            self._in_loop(lambda: target.on_interest(target.peers.peers[src], msg))  # type: ignore[arg-type]
        for call in mesh.later[:]:
            mesh.later.remove(call)
            self._in_loop(call)

    @rule()
    def answer_offers(self) -> None:
        for handed in self.moves[:]:
            if self._in_loop(lambda h=handed: h.settle(self.mesh)) is not None:
                self.moves.remove(handed)

    @rule(a=st.integers(0, COUNT - 1), b=st.integers(0, COUNT - 1))
    def lose_link(self, a: int, b: int) -> None:
        if a != b and frozenset((a, b)) not in self.mesh.cut:
            self._in_loop(lambda: self.mesh.cut_link(a, b))
            self._in_loop(lambda: self.mesh.mend_link(a, b))

    def _live(self, conn: Conn) -> bool:
        return not conn.closed and conn.answer is not None and conn.answer.done() \
            and not conn.answer.cancelled() and conn.answer.exception() is None

    def teardown(self) -> None:
        """Carried to the end, at most one connection holds the id, and the owner's
        table names it (or nobody when none does)."""
        try:
            self._in_loop(self._settle_all)
            if not self.moves:  # (else an answer waits for a link being mended)
                live = [c for c in self.conns if self._live(c)]
                assert len(live) <= 1, [(c.shard, c.closed) for c in live]
                holder = _holder(self.mesh, 1, self.cid)
                if live:
                    held = self.mesh.shards[live[0].shard].held.get(self.cid)
                    assert held is not None and holder == (live[0].shard, held.claim)
                else:
                    assert holder is None
        finally:
            for conn in self.conns:  # refusals nobody read are no error here
                if conn.answer is not None and conn.answer.done() \
                        and not conn.answer.cancelled():
                    conn.answer.exception()
            asyncio.set_event_loop(None)
            self.loop.close()

    def _settle_all(self) -> None:
        for _ in range(5):
            self.mesh.run()
            for handed in self.moves[:]:
                if handed.settle(self.mesh) is not None:
                    self.moves.remove(handed)
        self.mesh.run()


MoveRaces.TestCase.settings = settings(
    max_examples=150, stateful_step_count=25, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
test_move_races = MoveRaces.TestCase
