"""ActiveMQ advisories between two shards of one node, over real links with real STOMP
clients on each shard's own port: a subscriber of a queue's consumer or producer
advisory topic, on either shard, gets each advisory once, for consumers and producers
on either shard (raised by the queue's owner, a relayed consumer shown as its client's);
a subscriber of ``ActiveMQ.Advisory.Connection`` gets every shard's connections once."""

from __future__ import annotations

from meshmq.core.advisories import advisory_topic
from meshmq.core.destinations import Destination
from tests.interop.stomp_helpers import RawClient
from tests.support.raw_stomp import RawFrame
from tests.support.shard_pair import ShardPair


def _watch(client: RawClient, topic: str) -> None:
    client.send_frame("SUBSCRIBE", [("destination", f"/topic/{topic}"), ("id", "adv"),
                                    ("receipt", "adv")])
    client.read_until_receipt("adv")


def _until(client: RawClient, last: tuple[str, str]) -> list[RawFrame]:
    """The advisories ``client`` gets up to the one whose (advisoryType, consumerId or
    connectionId) is ``last``, that one included."""
    got: list[RawFrame] = []
    while True:
        frame, _ = client.read_until("MESSAGE")
        got.append(frame)
        if (frame.get("advisoryType"), frame.get("consumerId") or frame.get("connectionId")
                ) == last:
            return got


def _connection_id(pair: ShardPair, k: int, client_id: str) -> str:
    runtime = pair[k].runtime
    assert runtime is not None
    broker = runtime.broker
    local = pair[k].run(lambda: broker.client_ids[client_id])
    return f"s{k}-{local}"


def test_consumer_and_producer_advisories_of_a_queue_come_once_to_either_shard(
        pair: ShardPair) -> None:
    x = pair.owned_by(1, "adv")
    consumer_topic = advisory_topic("Consumer", Destination.parse_uri(f"queue://{x}")).name
    producer_topic = advisory_topic("Producer", Destination.parse_uri(f"queue://{x}")).name
    watchers = {}
    for k in (0, 1):
        for name, topic in (("consumer", consumer_topic), ("producer", producer_topic)):
            watcher = pair[k].client()
            _watch(watcher, topic)
            watchers[(k, name)] = watcher

    # A consumer on each shard (shard 0's is relayed to the owner), then a last one on
    # shard 0 that closes the sequence: anything raised twice would come before it.
    clients = []
    for k, sid, ack in ((0, "c0", "client"), (1, "c1", "auto"), (0, "c2", "auto")):
        client = RawClient(pair[k])
        client.connect(extra=[("client-id", f"app-{sid}")])
        client.send_frame("SUBSCRIBE", [("destination", f"/queue/{x}"), ("id", sid),
                                        ("ack", ack), ("receipt", sid),
                                        ("activemq.prefetchSize", "3")])
        client.read_until_receipt(sid)
        clients.append((k, sid, client))
    ids = {sid: (f"{_connection_id(pair, k, f'app-{sid}')}", f"app-{sid}")
           for k, sid, _ in clients}
    for k in (0, 1):
        got = _until(watchers[(k, "consumer")],
                     ("ConsumerAdded", f"{ids['c2'][0]}:c2"))
        assert [(f.get("advisoryType"), f.get("consumerId"), f.get("connectionId"),
                 f.get("clientId"), f.get("consumerCount"), f.get("ackMode"),
                 f.get("prefetchSize")) for f in got] == [
            ("ConsumerAdded", f"{ids[sid][0]}:{sid}", ids[sid][0], ids[sid][1], str(n), ack,
             "3")
            for n, (sid, ack) in enumerate((("c0", "client"), ("c1", "auto"),
                                            ("c2", "auto")), start=1)], k

    # A producer on each shard; the last, on shard 0, closes the sequence.
    producers = []
    for k in (0, 1, 0):
        producer = pair[k].client()
        for body in ("a", "b"):  # a second send is no new producer
            producer.send_frame("SEND", [("destination", f"/queue/{x}"),
                                         ("receipt", body)], body.encode())
            producer.read_until_receipt(body)
        producers.append((k, producer))
    last = producers[-1][1]
    assert last.sock is not None
    for k in (0, 1):
        got = _until(watchers[(k, "producer")], ("ProducerAdded", _last_id(pair, last)))
        assert [(f.get("advisoryType"), f.get("producerCount")) for f in got] == [
            ("ProducerAdded", "1"), ("ProducerAdded", "2"), ("ProducerAdded", "3")], k
        assert [f.get("connectionId", "").split("-")[0] for f in got] == ["s0", "s1", "s0"]

    # A relayed consumer that closes is removed once, by the owner, with the count.
    k, sid, client = clients[0]
    client.send_frame("UNSUBSCRIBE", [("id", sid), ("receipt", "u")])
    client.read_until_receipt("u")
    for k in (0, 1):
        [removed] = _until(watchers[(k, "consumer")],
                           ("ConsumerRemoved", f"{ids['c0'][0]}:c0"))
        assert removed.get("consumerCount") == "2"
    for _, _, client in clients:
        client.close()
    for _, producer in producers:
        producer.close()
    for watcher in watchers.values():
        watcher.close()


def _last_id(pair: ShardPair, client: RawClient) -> str:
    """The node's id of the connection of ``client`` on shard 0 (the newest there)."""
    runtime = pair[0].runtime
    assert runtime is not None and client.sock is not None
    port = client.sock.getsockname()[1]
    broker = runtime.broker
    local = pair[0].run(lambda: next(c.id for c in broker.connections.values()
                                     if c.remote.endswith(f":{port}")))
    return f"s0-{local}"


def test_connection_advisories_of_both_shards_come_once_to_either_shard(
        pair: ShardPair) -> None:
    watchers = [pair[k].client() for k in (0, 1)]
    for watcher in watchers:
        _watch(watcher, "ActiveMQ.Advisory.Connection")
    opened = []
    # Two on each shard: the second of each closes its shard's sequence (a shard's
    # advisories come in its order), so one raised twice would come before it.
    for name in ("conn-0", "conn-1", "last-0", "last-1"):
        k = int(name[-1])
        client = RawClient(pair[k])
        client.connect(extra=[("client-id", name)])
        opened.append(client)
    lasts = {_connection_id(pair, k, f"last-{k}") for k in (0, 1)}
    for watcher in watchers:
        got: list[RawFrame] = []
        while not lasts <= {f.get("connectionId") for f in got}:
            frame, _ = watcher.read_until("MESSAGE")
            got.append(frame)
        assert sorted(f.get("clientId") for f in got if f.get("clientId")) == [
            "conn-0", "conn-1", "last-0", "last-1"]
        assert all(f.get("advisoryType") == "ConnectionAdded" for f in got)
        assert {f.get("connectionId") for f in got if f.get("clientId") == "conn-1"} == {
            _connection_id(pair, 1, "conn-1")}
        assert all(f.get("protocol") != "shard" for f in got)
    for client in opened + watchers:
        client.close()
