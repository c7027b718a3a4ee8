"""Transactions: sends, ACKs and NACKs held until COMMIT, dropped on ABORT.

Owns BEGIN, COMMIT and ABORT of a connection's named transactions. During a
transaction, core/routing.py and core/acks.py only record sends and settlements on
the ``Transaction`` (core/state.py); COMMIT applies them in order -- sends first,
then ACKs, then NACKs -- so that their store writes land in one batch, which the
runtime writes atomically (on a shard of several, one that touches destinations other
shards own commits in two phases instead: core/shard_txn.py). A temporary
destination that went away meanwhile fails the whole COMMIT; a consumer that closed
meanwhile has its settlements skipped (its messages were already returned to their
queues).
"""

from __future__ import annotations

from meshmq.core.acks import Acks, select_lenient
from meshmq.core.routing import Router
from meshmq.core.shard_txn import ShardTransactions
from meshmq.core.state import Connection, CoreState, Transaction, find_transaction
from meshmq.errors import TransactionError


class Transactions:
    """BEGIN, COMMIT, ABORT (see the module docstring)."""

    def __init__(self, state: CoreState, router: Router, acks: Acks) -> None:
        self._state = state
        self._router = router
        self._acks = acks
        # One shard of several: transactions over other shards' destinations.
        self.shards = ShardTransactions(state, router, acks)

    def begin(self, conn: Connection, txn_id: str) -> None:
        if txn_id in conn.transactions:
            raise TransactionError(f"transaction {txn_id!r} is already started")
        conn.transactions[txn_id] = Transaction(txn_id)

    def commit(self, conn: Connection, txn_id: str) -> bool:
        """Apply the transaction; True when its writes need a store sync."""
        txn = find_transaction(conn, txn_id)
        del conn.transactions[txn_id]
        needs_sync = False
        for destinations, _ in txn.sends:
            for d in destinations:
                if d.is_temporary and not self._state.temp_exists(d):
                    raise TransactionError(f"temporary destination {d} no longer exists")
        if self._state.shard is not None and self.shards.remote_owners(txn):
            return self.shards.commit(conn, txn)  # two phases (core/shard_txn.py)
        for destinations, message in txn.sends:
            needs_sync |= self._router.route(conn, destinations, message)
        for consumer, tag, cumulative in txn.acks:
            if consumer.closed:
                continue
            needs_sync |= self._acks.settle(consumer,
                                            select_lenient(consumer, tag, cumulative), True)
        for consumer, tag, cumulative in txn.nacks:
            if consumer.closed:
                continue
            needs_sync |= self._acks.settle(consumer,
                                            select_lenient(consumer, tag, cumulative), False)
        return needs_sync

    def abort(self, conn: Connection, txn_id: str) -> None:
        find_transaction(conn, txn_id)
        del conn.transactions[txn_id]
