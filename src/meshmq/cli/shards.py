"""``meshmq shards rebalance``: change a stopped node's shard count or placement
(node/rebalance.py)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from meshmq.config.model import SHARD_PLACEMENTS
from meshmq.errors import ConfigError


def add_parser(sub: Any) -> None:
    group = sub.add_parser("shards", help="operate on a node's shard stores (broker stopped)")
    inner = group.add_subparsers(dest="shards_command", required=True)
    r = inner.add_parser(
        "rebalance", help="change the number of shards (or their placement), moving "
        "stored destinations",
        description="Move every stored destination whose owning shard changes under N "
        "shards (and --placement) to its new owner's store, then record them (in "
        "shards.json, or in the "
        "PostgreSQL store's <prefix>node table). Run with the node "
        "stopped; a run that was interrupted is finished by the next one.")
    r.add_argument("--data", metavar="DIR", help="the node's data directory")
    r.add_argument("--config", metavar="FILE",
                   help="take the data (and store) directory, or the PostgreSQL "
                   "store, from this configuration")
    r.add_argument("--to", type=int, required=True, metavar="N", help="the new shard count")
    r.add_argument("--placement", choices=SHARD_PLACEMENTS,
                   help="how the node places destinations from now on ([shards] "
                   "placement): by default the configuration's with --config, else the "
                   "one the stores have")
    r.set_defaults(func=cmd_rebalance)


def cmd_rebalance(args: argparse.Namespace) -> int:
    from meshmq.node.rebalance import rebalance

    store_dir: Path | None = None
    node = "meshmq"
    placement: str | None = args.placement
    postgres: tuple[str, str] | None = None
    if args.config:
        from meshmq.config.load import load_config

        config = load_config(Path(args.config))
        data = config.data_directory
        store_dir = config.store.directory
        node = config.broker_name
        placement = placement or config.sharding.placement
        if config.store.kind == "postgres":
            assert config.store.dsn is not None  # the loader requires it
            postgres = (config.store.dsn, config.store.table_prefix)
        elif config.store.kind != "journal":
            raise ConfigError(f"store kind {config.store.kind!r} has nothing to rebalance "
                              "(only the journal and PostgreSQL stores keep data per shard)")
    elif args.data:
        data = Path(args.data)
    else:
        raise ConfigError("give the node's data directory: --data DIR or --config FILE")
    if args.data:
        data = Path(args.data)
    from meshmq.core.shards import PLACEMENTS

    report = rebalance(data, args.to, store_directory=store_dir, node=node,
                       postgres=postgres,
                       placement=None if placement is None else PLACEMENTS[placement])
    for line in report.lines():
        print(line)
    return 0
