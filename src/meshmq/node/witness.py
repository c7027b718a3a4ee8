"""A witness for a replicated cluster of nodes of shards: ``meshmq witness --config FILE``
where ``[broker] shards`` is above 1 (docs/ha.md, "A node of shards in replicated mode").

Two nodes and a witness make a majority of three with two copies of the data, as for one
broker. The witness plays a node's two parts in one process and stores no messages:

* for each shard k, a stream witness on the port after ``listen`` plus k (what shard k of
  a data node listens on): it acknowledges the master shard's heartbeats and records the
  position of each batch, as ``ReplicatedHa`` does for a one-broker witness;
* the node's election listener on ``listen``: a ``NodeElection`` that never campaigns
  (``can_be_master = false``) and votes from those recorded positions, so a candidate
  missing a batch that the witness helped confirm on any shard is refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import signal
from typing import Any

from meshmq.config.model import BrokerConfig
from meshmq.ha.replica_node import NodeElection, shard_ha
from meshmq.ha.replication import ReplicatedHa

log = logging.getLogger("meshmq.ha")


def stream_witness_config(config: BrokerConfig, index: int) -> BrokerConfig:
    """Shard ``index``'s stream witness: its address and id as a data node's shard k,
    its term, vote and recorded position under ``<data>/shard-<k>/witness``."""
    ha = dataclasses.replace(shard_ha(config, index), role="witness")
    return dataclasses.replace(config, ha=ha,
                               data_directory=config.data_directory / f"shard-{index}")


class NodeWitness:
    """The stream witnesses of every shard and the node's election, in one process."""

    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.streams = [ReplicatedHa(stream_witness_config(config, k), on_lost=_ignore)
                        for k in range(config.shards)]
        voter = dataclasses.replace(config, ha=dataclasses.replace(
            config.ha, role="witness", can_be_master=False))
        self.election = NodeElection(voter, self._ask_streams, on_lost=_ignore)

    async def _ask_streams(self, adopt: int | None) -> list[dict[str, Any]]:
        """What a data node's supervisor asks its shards: every stream's state, after
        moving it to term ``adopt`` (from then on it refuses older masters' batches)."""
        op = "status" if adopt is None else "adopt"
        return [s.control({"id": 0, "op": op, "term": adopt}) for s in self.streams]

    async def run(self, stop: asyncio.Event) -> None:
        started: list[ReplicatedHa] = []
        voting: asyncio.Task[bool] | None = None
        try:
            for s in self.streams:  # states loaded and listeners open before any vote
                started.append(s)
                await s._start()
            log.info("witness: node of %d shards voting in elections of %s; stores no "
                     "messages", len(self.streams), ", ".join(self.config.ha.members))
            voting = asyncio.get_running_loop().create_task(self.election.acquire())
            await stop.wait()
        finally:
            await self.election.stop()
            if voting is not None:
                with contextlib.suppress(BaseException):
                    await voting
            for s in started:
                await s.stop()


def _ignore(why: str) -> None:
    return None


async def run_node_witness(config: BrokerConfig) -> int:
    """Run until SIGTERM or SIGINT; SIGHUP reloads the TLS certificates."""
    witness = NodeWitness(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    def reload() -> None:
        for ha in (witness.election, *witness.streams):
            ha.tls.reload()

    loop.add_signal_handler(signal.SIGHUP, reload)
    await witness.run(stop)
    log.info("witness %r stopped", config.broker_name)
    return 0
