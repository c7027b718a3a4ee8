"""What ``commit()`` raises when the broker answers COMMIT with an ERROR, against a
scripted STOMP peer without sockets: meshmq's ``meshmq-outcome`` header decides
(``unknown``: TransactionInDoubtError, ``rolled-back``: TransactionRolledBackError),
never the message text; an ERROR without it is the broker's refusal (BrokerError)."""

from __future__ import annotations

import pytest
from tests.support.memory_failover import ClientDialer
from tests.support.memory_network import MemoryNetwork
from tests.unit.client.test_failover_stomp import PEER, client, scripted

from meshmq.client import BrokerError, TransactionInDoubtError, TransactionRolledBackError
from meshmq.errors import MeshmqError

IN_DOUBT_TEXT = ("transaction 't' may have committed: its outcome is unknown because "
                 "shard node#1, which commits all of it, did not answer within 10 s")


@pytest.mark.parametrize(("outcome", "message", "raised"), [
    ("unknown", "the store could not say", TransactionInDoubtError),
    ("rolled-back", "shard node#1 did not prepare its part", TransactionRolledBackError),
    # The words alone change nothing: another broker's ERROR is its refusal.
    (None, IN_DOUBT_TEXT, BrokerError),
    ("something-new", "a refusal", BrokerError),
])
def test_a_commit_answered_with_an_error_raises_what_its_outcome_header_says(
        dialer: ClientDialer, network: MemoryNetwork, outcome: str | None, message: str,
        raised: type[MeshmqError]) -> None:
    peer = scripted(dialer, lambda frame, n: "error" if frame.command == "COMMIT"
                    else "answer")
    peer.error_message = message
    if outcome is not None:
        peer.error_headers = [("meshmq-outcome", outcome)]

    async def main() -> None:
        async with client(dialer, PEER) as c:
            tx = await c.begin()
            await c.send("/queue/x", "in tx", transaction=tx)
            with pytest.raises(MeshmqError) as info:
                await c.commit(tx)
            assert type(info.value) is raised
            assert message in str(info.value)  # the broker's reason, as it gave it
            await c.send("/queue/x", "after")  # the client reconnected and goes on
    network.loop.run_until_complete(main())
    assert peer.connections == 2
