"""network/shards.py ``Inbound``: which sends arriving from a peer shard may be re-sends
of ones this shard already took (checked) and which are first sends (not checked)."""

from __future__ import annotations

from meshmq.network.shards import Inbound


def test_a_greeting_bounds_the_resends_and_a_new_run_forgets_the_old_numbers() -> None:
    inbound = Inbound()
    inbound.greeted({"boot": "a", "sent": 0})
    assert inbound.resent_upto == 0  # a fresh run: everything that follows is new
    inbound.upto = 40
    inbound.gaps.add(7)
    # The same run again (a new link): numbers up to 25 may have been sent before.
    inbound.greeted({"boot": "a", "sent": 25})
    assert (inbound.resent_upto, inbound.upto, inbound.gaps) == (25, 40, {7})
    # Another run of that shard numbers from 1 again: nothing it sends was taken here.
    inbound.greeted({"boot": "b", "sent": 3})
    assert (inbound.resent_upto, inbound.upto, inbound.gaps) == (3, 0, set())


def test_a_greeting_without_the_numbers_makes_every_send_a_possible_resend() -> None:
    inbound = Inbound()
    inbound.upto = 9
    inbound.greeted({"sent": True})
    assert inbound.boot is None and inbound.upto == 0
    assert inbound.resent_upto >= 1 << 62
