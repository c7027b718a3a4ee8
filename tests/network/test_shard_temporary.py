"""Request/reply across the shards of a node: a temporary queue lives on the shard of
the connection that made it, and a reply sent to its name from another shard reaches
it (over real links between two in-process shards, real STOMP clients)."""

from __future__ import annotations

from pathlib import Path

from tests.support.brokers import poll
from tests.support.shard_pair import ShardPair


def test_a_reply_from_another_shard_reaches_the_requesters_temporary_queue(
        tmp_path: Path) -> None:
    pair = ShardPair(tmp_path).start()
    try:
        pair.wait_linked()
        requests = pair.owned_by(0, "requests")
        service = pair[0].client()
        service.send_frame("SUBSCRIBE", [("destination", f"/queue/{requests}"), ("id", "s")])
        service.receipt_roundtrip()
        requester = pair[1].client()
        requester.send_frame("SUBSCRIBE", [("destination", "/temp-queue/replies"),
                                           ("id", "r")])
        requester.receipt_roundtrip()
        requester.send_frame("SEND", [("destination", f"/queue/{requests}"),
                                      ("reply-to", "/temp-queue/replies")], b"ping")
        request, _ = service.read_until("MESSAGE")
        reply_to = request.get("reply-to")
        assert reply_to is not None and reply_to.startswith("/remote-temp-queue/")
        service.send_frame("SEND", [("destination", reply_to), ("receipt", "sent")], b"pong")
        service.read_until_receipt("sent")
        reply, _ = requester.read_until("MESSAGE")
        assert reply.body == b"pong"
        # Once the requester's connection closes its queue is gone: a late reply is
        # dropped by the shard that made it, not kept (the replier is not told, as
        # for a reply forwarded over a network bridge).
        requester.close()
        owner = pair[1].runtime
        assert owner is not None

        def temporary() -> list[str]:
            return pair[1].run(lambda: [str(d) for d in owner.broker.state.queues
                                        if d.is_temporary])
        poll(lambda: not temporary(), what="the temporary queue gone with its connection")
        service.send_frame("SEND", [("destination", reply_to), ("receipt", "late")], b"x")
        service.read_until_receipt("late")
        assert not temporary()
        service.close()
    finally:
        pair.stop()
