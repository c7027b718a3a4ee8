"""One shard of a node as a process of its own, for tests that kill a shard with
SIGKILL before the node's supervisor exists. Not a user command (no CLI lists it)::

    python -m meshmq.network.shards_main broker --config PATH --index K --count N \\
        --node NAME --run-dir DIR --token TOKEN

It runs ``BrokerRuntime(config, shard=ShardIdentity(...))`` until SIGTERM, logging as
``meshmq broker`` does, so a test reads the bound ports from its log.
"""

from __future__ import annotations

import argparse
import asyncio
import faulthandler
import logging
import signal
from pathlib import Path

from meshmq.config.load import load_config
from meshmq.core.shards import HASH_NAME, ShardIdentity
from meshmq.transport.runtime import BrokerRuntime


async def _run(runtime: BrokerRuntime) -> None:
    runtime.install_signal_handlers()
    await runtime.start()
    await runtime.wait_stopped()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m meshmq.network.shards_main")
    parser.add_argument("command", choices=["broker"])
    parser.add_argument("--config", required=True)
    parser.add_argument("--index", type=int, required=True)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--node", required=True)
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--token", required=True)
    parser.add_argument("--placement", default=HASH_NAME)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # as `meshmq broker` does
    shard = ShardIdentity(index=args.index, count=args.count, node=args.node,
                          run_dir=args.run_dir, token=args.token, placement=args.placement)
    asyncio.run(_run(BrokerRuntime(load_config(Path(args.config)), shard=shard)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
