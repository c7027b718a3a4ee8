"""Client-id claims between the shards of one node (network/shard_clients.py), with no
links: three ``ClientClaims`` whose ``INTEREST`` bodies the test carries between them in
order, as one link per pair would, and drops when it takes a shard's links down. One
holder per client id node-wide, MQTT take-over and STOMP refusal as on one broker, a
restarted owner told again who holds its ids, and the MQTT session record kept by the
owner and handed to the shard that resumes it: each change confirmed only once the owner
has stored it, held while the owner is away, and the session's expiry run by the
owner. A STOMP claim of an id held on another shard waits for that shard to say whether
its connection still exists (its release may still be on the way), so a client that
leaves and comes back at once through another shard is never refused."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from meshmq.core.shards import ShardIdentity, client_owner
from meshmq.errors import MeshmqError
from meshmq.network.shard_clients import ClientClaims

COUNT = 3


@dataclass
class _Peer:
    index: int
    label: str
    down: bool = False
    link: object | None = "up"  # the link to it, when up


@dataclass
class _Broker:
    records: dict[str, tuple[int, bytes]] = field(default_factory=dict)
    clock: int = 1_000_000

    def now_ms(self) -> int:
        return self.clock

    def put_record(self, name: str, body: bytes) -> None:
        self.records[name] = (0, body)

    def drop_record(self, name: str) -> None:
        self.records.pop(name, None)


class _Durability:
    """The owner's store: what waits for its sync, synced by ``Mesh.sync``."""

    def __init__(self) -> None:
        self.waiting: list[Callable[[], None]] = []

    def when_durable(self, on_durable: Callable[[], None], fail: Callable[[str], None],
                     who: str, *, owners: bool = True) -> None:
        self.waiting.append(on_durable)


class _Host:
    def __init__(self) -> None:
        self.durability = _Durability()

    def request_pump(self) -> None:
        return


class _Peers:
    """What ``ClientClaims`` uses of ``ShardPeers``."""

    def __init__(self, index: int) -> None:
        self.identity = ShardIdentity(index=index, count=COUNT, node="node", run_dir="/x",
                                      token="t")
        self.boot = f"boot{index}"
        self.peers = {k: _Peer(k, f"node#{k}") for k in range(COUNT) if k != index}
        self.broker = _Broker()
        self.host = _Host()


class Mesh:
    def __init__(self) -> None:
        self.wire: list[tuple[int, int, dict[str, Any]]] = []
        self.later: list[Callable[[], None]] = []  # what waits for a pump
        self.up = set(range(COUNT))
        self.shards = [self._claims(k) for k in range(COUNT)]
        self.moved: list[tuple[int, str]] = []
        self.expired: list[tuple[int, str]] = []
        self.auto_sync = True  # every store syncs as soon as asked

    def _claims(self, k: int) -> ClientClaims:
        mesh = self

        class Carried(ClientClaims):
            def _queue(self, peer: Any, body: dict[str, Any]) -> None:
                # As ShardPeers.queue: output for a peer without a link is dropped.
                if k in mesh.up and peer.index in mesh.up and peer.link is not None:
                    mesh.wire.append((k, peer.index, body))

            def _after_pump(self, call: Callable[[], None]) -> None:
                mesh.later.append(call)

        claims = Carried(_Peers(k))  # type: ignore[arg-type]
        claims.session_moved = lambda cid: self.moved.append((k, cid))

        def expired(cid: str) -> None:
            self.expired.append((k, cid))
            claims._drop_here(cid)

        claims.session_expired = expired
        return claims

    def run(self) -> None:
        """Carry everything sent (the session changes of this turn first), syncing
        every store as asked unless ``auto_sync`` is off."""
        while True:
            for shard in self.shards:
                shard._send_changes()
            if self.auto_sync:
                self.sync()
            later, self.later = self.later, []
            for call in later:
                call()
            if not self.wire and not later:
                return
            while self.wire:
                src, dst, body = self.wire.pop(0)
                target = self.shards[dst]
                target.on_interest(target.peers.peers[src], body)  # type: ignore[arg-type]

    def sync(self, k: int | None = None) -> None:
        for j, shard in enumerate(self.shards):
            if k is None or j == k:
                durability = shard.peers.host.durability  # type: ignore[attr-defined]
                waiting, durability.waiting = durability.waiting, []
                for then in waiting:
                    then()

    def restart(self, k: int) -> None:
        """Shard ``k`` dies (its links with it) and starts again, empty but for its
        stored records."""
        self.kill(k)
        self.start(k)

    def kill(self, k: int) -> None:
        self.up.discard(k)
        self.wire = [w for w in self.wire if k not in (w[0], w[1])]
        for j, other in enumerate(self.shards):
            if j != k:
                other.peers.peers[k].link = None  # type: ignore[attr-defined]
                other.link_down(other.peers.peers[k])  # type: ignore[arg-type]
        self.shards[k].stop()

    def start(self, k: int) -> None:
        old = self.shards[k].peers.broker
        self.shards[k] = self._claims(k)
        self.shards[k].peers.broker.records.update(old.records)  # what its store had
        self.shards[k].peers.broker.clock = old.clock
        self.shards[k].start()
        self.up.add(k)
        for j, other in enumerate(self.shards):
            if j != k:
                other.peers.peers[k].link = "up"  # type: ignore[attr-defined]
        for j, other in enumerate(self.shards):
            if j != k:
                other.link_up(other.peers.peers[k])  # type: ignore[arg-type]
        self.run()


@dataclass
class Conn:
    """One client connection's claim: closed by the owner's take-over, or not."""

    mesh: Mesh
    shard: int
    client_id: str
    proto: str = "mqtt"
    closed: bool = False
    answer: asyncio.Future[bytes | None] | None = None
    release: Callable[[], None] | None = None
    open: bool = True  # False: the client ended it, its shard has not read that yet

    def claim(self) -> Conn:
        self.answer, self.release = self.mesh.shards[self.shard].claim(
            self.client_id, self.proto, self.close, lambda: self.open)
        return self

    def close(self) -> None:
        self.closed = True
        assert self.release is not None
        self.release()

    @property
    def granted(self) -> bool:
        assert self.answer is not None
        return self.answer.done() and not self.answer.cancelled() \
            and self.answer.exception() is None


def _owned(k: int, prefix: str = "dev") -> str:
    for n in itertools.count():
        if client_owner(f"{prefix}-{n}", COUNT) == k:
            return f"{prefix}-{n}"
    raise AssertionError("unreachable")


@pytest.fixture
def mesh() -> Iterator[Mesh]:
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        # ``claim`` makes its future on the running loop: run each test inside it.
        yield loop.run_until_complete(_in_loop(Mesh))
    finally:
        asyncio.set_event_loop(None)
        loop.close()


async def _in_loop(make: Callable[[], Mesh]) -> Mesh:
    return make()


def _run(body: Callable[[], None]) -> None:
    async def go() -> None:
        body()
    asyncio.get_event_loop().run_until_complete(go())


@pytest.mark.parametrize("owner", range(COUNT))
def test_mqtt_take_over_from_shard_to_shard_leaves_one_connection(mesh: Mesh,
                                                                  owner: int) -> None:
    def body() -> None:
        cid = _owned(owner)
        conns = []
        for shard in (0, 1, 2, 0):
            conns.append(Conn(mesh, shard, cid).claim())
            mesh.run()
            assert conns[-1].granted
        assert [c.closed for c in conns] == [True, True, True, False]
        assert mesh.shards[owner].table[cid].shard == 0
    _run(body)


def test_two_take_overs_at_once_still_leave_one_connection(mesh: Mesh) -> None:
    def body() -> None:
        cid = _owned(2)
        first = Conn(mesh, 2, cid).claim()
        mesh.run()
        rivals = [Conn(mesh, 0, cid).claim(), Conn(mesh, 1, cid).claim()]
        mesh.run()
        assert all(c.granted for c in rivals)
        assert first.closed
        assert sorted(c.closed for c in rivals) == [False, True]
        [live] = [c for c in rivals if not c.closed]
        assert mesh.shards[2].table[cid].shard == live.shard
    _run(body)


def test_a_stomp_client_id_is_refused_while_held_and_granted_once_released(
        mesh: Mesh) -> None:
    def body() -> None:
        cid = _owned(1, "durable")
        first = Conn(mesh, 0, cid, "stomp").claim()
        mesh.run()
        assert first.granted
        for shard, proto in ((2, "stomp"), (2, "mqtt"), (0, "stomp")):
            refused = Conn(mesh, shard, cid, proto).claim()
            mesh.run()
            assert refused.answer is not None and refused.answer.done()
            exc = refused.answer.exception()
            assert isinstance(exc, MeshmqError) and exc.code == "client-id-in-use"
        assert not first.closed
        first.close()
        mesh.run()
        later = Conn(mesh, 2, cid, "stomp").claim()
        mesh.run()
        assert later.granted
    _run(body)


def test_an_unreachable_owner_refuses_claims_retriably(mesh: Mesh) -> None:
    def body() -> None:
        cid = _owned(1)
        mesh.up.discard(1)
        waiting = Conn(mesh, 0, cid).claim()
        mesh.run()
        assert waiting.answer is not None and not waiting.answer.done()  # it waits
        peer = mesh.shards[0].peers.peers[1]
        peer.down = True  # type: ignore[attr-defined]
        mesh.shards[0].owner_down(peer)  # type: ignore[arg-type]
        exc = waiting.answer.exception()
        assert isinstance(exc, MeshmqError) and exc.code == "shard-unreachable" \
            and exc.retriable
        at_once = Conn(mesh, 0, cid).claim()
        assert at_once.answer is not None and at_once.answer.done()
        assert isinstance(at_once.answer.exception(), MeshmqError)
    _run(body)


def test_a_restarted_owner_is_told_again_who_holds_its_client_ids(mesh: Mesh) -> None:
    def body() -> None:
        cid = _owned(0)
        holder = Conn(mesh, 1, cid).claim()
        mesh.run()
        mesh.restart(0)
        assert mesh.shards[0].table[cid].shard == 1
        newer = Conn(mesh, 2, cid).claim()
        mesh.run()
        assert newer.granted and holder.closed
    _run(body)


def test_the_owner_keeps_the_session_record_and_hands_it_to_the_resuming_shard(
        mesh: Mesh) -> None:
    def body() -> None:
        cid = _owned(2)
        made = Conn(mesh, 0, cid).claim()
        mesh.run()
        mesh.shards[0].put_session(cid, b'{"expiry": 60, "subs": ["mqtt1:a/b"]}')
        made.close()
        mesh.run()
        assert f"mqtt-session/{cid}" in mesh.shards[2].peers.broker.records
        back = Conn(mesh, 1, cid).claim()
        mesh.run()
        assert back.answer is not None
        record = back.answer.result()
        assert record is not None and b'"mqtt1:a/b"' in record and b'"shard": 0' in record
        assert mesh.moved == [(0, cid)]  # shard 0 forgets its copy
        mesh.shards[1].drop_session(cid)
        mesh.run()
        assert f"mqtt-session/{cid}" not in mesh.shards[2].peers.broker.records
    _run(body)


def test_claims_go_out_as_the_links_json_frames() -> None:
    from meshmq.network import shard_clients, shards
    assert shard_clients._FRAME == shards._FRAME


def _puts(mesh: Mesh) -> list[dict[str, Any]]:
    return [body for _, _, body in mesh.wire if body["op"] == "session-put"]


def test_a_session_change_is_confirmed_once_the_owner_has_stored_it(mesh: Mesh) -> None:
    """What a PUBREC or PUBCOMP waits for: the owner's answer, after its sync; the
    changes of one turn go as one record and are confirmed by one answer."""
    def body() -> None:
        cid = _owned(2)
        Conn(mesh, 0, cid).claim()
        mesh.run()
        mesh.auto_sync = False
        shard = mesh.shards[0]
        kept = [shard.put_session(cid, b'{"expiry": 60, "in": [%d]}' % n) for n in (1, 2, 3)]
        shard._send_changes()
        [put] = _puts(mesh)  # one record for the turn's three changes: the latest
        assert '"in": [3]' in put["record"]
        mesh.run()
        assert b'"in": [3]' in mesh.shards[2].peers.broker.records[f"mqtt-session/{cid}"][1]
        assert not any(f is not None and f.done() for f in kept)  # not synced yet
        mesh.sync(2)
        mesh.run()
        assert all(f is not None and f.done() and f.exception() is None for f in kept)
        assert not shard.unstored
        # On the owner itself the local sync covers it: nothing more to wait for.
        assert mesh.shards[2].put_session(cid, b'{"expiry": 60}') is None
    _run(body)


def test_changes_made_while_the_owner_is_away_are_held_and_sent_when_it_is_back(
        mesh: Mesh) -> None:
    def body() -> None:
        cid = _owned(2)
        Conn(mesh, 0, cid).claim()
        mesh.run()
        shard = mesh.shards[0]
        shard.put_session(cid, b'{"expiry": 60, "in": [1]}')
        mesh.run()
        mesh.kill(2)
        waiting = shard.put_session(cid, b'{"expiry": 60, "in": [1, 2]}')
        mesh.run()
        assert waiting is not None and not waiting.done()  # the PUBREC waits
        # Away for owner_wait: the answer fails (the connection is closed unconfirmed)
        # and the change stays held.
        peer = shard.peers.peers[2]
        peer.down = True  # type: ignore[attr-defined]
        shard.owner_down(peer)  # type: ignore[arg-type]
        exc = waiting.exception()
        assert isinstance(exc, MeshmqError) and exc.code == "shard-unreachable"
        at_once = shard.put_session(cid, b'{"expiry": 60, "in": [1, 2, 3]}')
        assert at_once is not None and isinstance(at_once.exception(), MeshmqError)
        assert cid in shard.unstored
        peer.down = False  # type: ignore[attr-defined]
        mesh.start(2)
        mesh.run()
        record = mesh.shards[2].peers.broker.records[f"mqtt-session/{cid}"][1]
        assert b'"in": [1, 2, 3]' in record
        assert not shard.unstored
    _run(body)


def test_a_record_from_a_shard_the_client_id_has_left_is_ignored(mesh: Mesh) -> None:
    def body() -> None:
        cid = _owned(2)
        Conn(mesh, 1, cid).claim()
        mesh.run()
        mesh.shards[1].put_session(cid, b'{"expiry": 60, "in": [7]}')
        mesh.run()
        stale = mesh.shards[0].put_session(cid, b'{"expiry": 60, "in": []}')
        mesh.run()
        assert stale is not None and stale.done()  # answered all the same
        assert b'"in": [7]' in mesh.shards[2].peers.broker.records[f"mqtt-session/{cid}"][1]
    _run(body)


def test_the_owner_runs_a_session_expiry_and_arms_it_again_after_a_restart(
        mesh: Mesh) -> None:
    def body() -> None:
        cid = _owned(2)
        owner = mesh.shards[2]
        made = Conn(mesh, 0, cid).claim()
        mesh.run()
        mesh.shards[0].put_session(cid, b'{"expiry": 5, "subs": []}')
        mesh.run()
        assert cid not in owner.expiries  # held: no expiry runs
        made.close()
        mesh.run()
        loop = asyncio.get_running_loop()
        due = owner.expiries[cid].when() - loop.time()
        assert 4.5 < due <= 5
        # Resumed through another shard: the timer stops; ended again: it runs again.
        back = Conn(mesh, 1, cid).claim()
        mesh.run()
        assert back.granted and cid not in owner.expiries
        mesh.shards[1].put_session(cid, b'{"expiry": 5, "ended": 1000000}')
        back.close()
        # The connection's last record reaches the owner before its release.
        assert [body["op"] for _, _, body in mesh.wire] == ["session-put", "client-release"]
        mesh.run()
        assert cid in owner.expiries
        # The owner restarts 2 s later: armed again for what is left, from its store.
        mesh.shards[2].peers.broker.clock += 2000
        mesh.restart(2)
        owner = mesh.shards[2]
        due = owner.expiries[cid].when() - loop.time()
        assert 2.5 < due <= 3
        owner._expire(cid)
        mesh.run()
        assert mesh.expired == [(2, cid)]
        assert f"mqtt-session/{cid}" not in owner.peers.broker.records
        assert (1, cid) in mesh.moved  # the shard that ran it last forgets its copy
    _run(body)


def test_an_expiry_run_before_the_last_shards_link_is_up_reaches_it_with_the_link(
        mesh: Mesh) -> None:
    """A restarted owner runs the expiries it stored at once when they are due, maybe
    before its link to the shard that ran the session last is up: that shard still
    forgets its in-memory copy (or a later CONNECT there would find it present)."""
    def body() -> None:
        cid = _owned(2)
        made = Conn(mesh, 1, cid).claim()
        mesh.run()
        mesh.shards[1].put_session(cid, b'{"expiry": 5, "subs": []}')
        mesh.run()
        made.close()
        mesh.run()
        mesh.restart(2)
        owner = mesh.shards[2]
        to_last = owner.peers.peers[1]
        to_last.link = None  # type: ignore[attr-defined]
        owner._expire(cid)
        mesh.run()
        assert mesh.expired == [(2, cid)]
        assert (1, cid) not in mesh.moved
        to_last.link = "up"  # type: ignore[attr-defined]
        owner.link_up(to_last)  # type: ignore[arg-type]
        mesh.run()
        assert (1, cid) in mesh.moved
    _run(body)


def test_a_restarted_owner_does_not_expire_a_session_a_shard_still_holds(
        mesh: Mesh) -> None:
    def body() -> None:
        cid = _owned(2)
        Conn(mesh, 0, cid).claim()
        mesh.run()
        mesh.shards[0].put_session(cid, b'{"expiry": 5}')
        mesh.run()
        mesh.restart(2)  # shard 0 announces its claim again with the link
        assert mesh.shards[2].table[cid].shard == 0
        assert cid not in mesh.shards[2].expiries
    _run(body)


# ------------------------------------------------------------------ a STOMP id reused
def _ops(mesh: Mesh) -> list[str]:
    return [body["op"] for _, _, body in mesh.wire]


def _carry_one(mesh: Mesh) -> str:
    """Carry the first message on the wire alone; its op."""
    src, dst, body = mesh.wire.pop(0)
    target = mesh.shards[dst]
    target.on_interest(target.peers.peers[src], body)  # type: ignore[arg-type]
    return str(body["op"])


def _refused(conn: Conn) -> bool:
    assert conn.answer is not None and conn.answer.done()
    exc = conn.answer.exception()
    return isinstance(exc, MeshmqError) and exc.code == "client-id-in-use" \
        and exc.message == f"Broker: node - Client: {conn.client_id} already connected"


@pytest.mark.parametrize("claimer", [1, 2])  # on the owner itself, or a link away
def test_a_stomp_claim_that_overtakes_a_release_asks_the_holder_and_is_granted(
        mesh: Mesh, claimer: int) -> None:
    def body() -> None:
        cid = _owned(1, "reuse")
        first = Conn(mesh, 0, cid, "stomp").claim()
        mesh.run()
        first.close()
        assert _ops(mesh) == ["client-release"]
        release, mesh.wire = mesh.wire, []  # still on its way
        again = Conn(mesh, claimer, cid, "stomp").claim()
        mesh.run()
        assert again.granted
        assert mesh.shards[1].table[cid].shard == claimer
        mesh.wire = release
        mesh.run()  # the late release changes nothing
        assert mesh.shards[1].table[cid].shard == claimer
    _run(body)


@pytest.mark.parametrize("holder", [0, 1])  # on another shard, or on the owner itself
def test_a_connection_ended_but_not_yet_read_no_longer_holds_its_stomp_id(
        mesh: Mesh, holder: int) -> None:
    def body() -> None:
        cid = _owned(1, "dropped")
        first = Conn(mesh, holder, cid, "stomp").claim()
        mesh.run()
        first.open = False  # the client dropped it; its shard has not read the end
        again = Conn(mesh, 2, cid, "stomp").claim()
        mesh.run()
        assert again.granted and not first.closed
        first.close()  # its end, read at last: the new holder keeps the id
        mesh.run()
        assert mesh.shards[1].table[cid].shard == 2
    _run(body)


@pytest.mark.parametrize("holder", [0, 1])
def test_a_live_stomp_holder_keeps_its_id_after_the_owner_asked(
        mesh: Mesh, holder: int) -> None:
    def body() -> None:
        cid = _owned(1, "live")
        first = Conn(mesh, holder, cid, "stomp").claim()
        mesh.run()
        for shard, proto in ((2, "stomp"), (2, "mqtt"), (1 - holder, "stomp")):
            if shard == holder:
                continue
            rival = Conn(mesh, shard, cid, proto).claim()
            mesh.run()
            assert _refused(rival)
            assert not first.closed and mesh.shards[1].table[cid].shard == holder
        mqtt_holder = _owned(1, "mqtt-live")
        mqtt = Conn(mesh, holder, mqtt_holder).claim()  # an MQTT holder is asked too
        mesh.run()
        stomp = Conn(mesh, 2, mqtt_holder, "stomp").claim()
        mesh.run()
        assert _refused(stomp) and not mqtt.closed
    _run(body)


def test_the_owner_asks_a_remote_holder_once_for_claims_made_together(
        mesh: Mesh) -> None:
    def body() -> None:
        cid = _owned(1, "twice")
        first = Conn(mesh, 0, cid, "stomp").claim()
        mesh.run()
        rivals = [Conn(mesh, 2, cid, "stomp").claim(), Conn(mesh, 1, cid, "stomp").claim()]
        sent: list[str] = []
        while mesh.wire:
            sent.append(_carry_one(mesh))
        assert sent.count("client-check") == 1
        assert all(_refused(r) for r in rivals) and not first.closed
        first.close()
        mesh.run()
        later = [Conn(mesh, 2, cid, "stomp").claim(), Conn(mesh, 1, cid, "stomp").claim()]
        mesh.run()
        [kept] = [c for c in later if c.granted]  # one holder, as ever
        [other] = [c for c in later if c is not kept]
        assert _refused(other) and mesh.shards[1].table[cid].shard == kept.shard
    _run(body)


def test_a_holder_lost_while_asked_frees_the_id_and_a_claimer_gone_takes_nothing(
        mesh: Mesh) -> None:
    def body() -> None:
        cid = _owned(1, "lost")
        Conn(mesh, 0, cid, "stomp").claim()
        mesh.run()
        waiting = Conn(mesh, 2, cid, "stomp").claim()
        _carry_one(mesh)  # the claim reaches the owner, which asks shard 0
        assert _ops(mesh) == ["client-check"]
        mesh.kill(0)  # the holder's shard dies before it answers
        mesh.run()
        assert waiting.granted and mesh.shards[1].table[cid].shard == 2
        # A claimer that goes while the owner asks is not given the id.
        mesh.start(0)
        other = _owned(1, "gone")
        holder = Conn(mesh, 0, other, "stomp").claim()
        mesh.run()
        gone = Conn(mesh, 2, other, "stomp").claim()
        _carry_one(mesh)
        gone.close()  # its release reaches the owner before the holder's answer
        holder.close()
        mesh.run()
        assert other not in mesh.shards[1].table
    _run(body)


@pytest.mark.parametrize("holder", [0, 1, 2])  # another shard, the owner, the claimer's
def test_an_mqtt_connection_that_ended_no_longer_holds_its_id_for_a_stomp_claim(
        mesh: Mesh, holder: int) -> None:
    """As on one broker: once the MQTT client has left (its end not read yet, or its
    release still waiting for its teardown), a STOMP CONNECT with the id is accepted at
    once, wherever it lands; while it lives, the STOMP CONNECT is refused at once."""
    def body() -> None:
        cid = _owned(1, "mqtt-gone")
        mqtt = Conn(mesh, holder, cid).claim()
        mesh.run()
        live = Conn(mesh, 2, cid, "stomp").claim()
        mesh.run()
        assert _refused(live) and not mqtt.closed
        mqtt.open = False  # the client left; its release has not been made yet
        stomp = Conn(mesh, 2, cid, "stomp").claim()
        mesh.run()
        assert stomp.granted and not mqtt.closed
        assert mesh.shards[1].table[cid].shard == 2 and mesh.shards[1].table[cid].proto \
            == "stomp"
        mqtt.close()  # its teardown done at last: the STOMP connection keeps the id
        mesh.run()
        assert mesh.shards[1].table[cid].shard == 2
        assert mesh.shards[2].held[cid].proto == "stomp"
    _run(body)
