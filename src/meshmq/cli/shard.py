"""``python -m meshmq.cli.shard``: the process a node's supervisor starts for each shard
(meshmq/node/shard.py). It reads its spec from the supervisor's pipe, routes its log as
``[logging]`` says with the shard's number in every line, and serves."""

from __future__ import annotations

import asyncio
import logging
import sys

from meshmq.cli.logsetup import apply_logging, enable_stack_dumps, start_logging
from meshmq.errors import MeshmqError
from meshmq.node.shard import EXIT_START_FAILED, read_spec, serve_shard


class _ShardPrefix(logging.Filter):
    def __init__(self, label: str) -> None:
        super().__init__()
        self.prefix = f"[{label}] "

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith(self.prefix):
            record.msg = self.prefix + str(record.msg)
        return True


def main() -> int:
    start_logging("INFO")
    enable_stack_dumps()
    spec = read_spec()
    try:
        apply_logging(spec.config.logging, spec.log_level, spec.config.source)
    except MeshmqError as exc:
        print(f"error {exc.code} {exc}", flush=True)
        return EXIT_START_FAILED
    prefix = _ShardPrefix(f"shard {spec.identity.index}")
    for handler in logging.getLogger().handlers:
        handler.addFilter(prefix)
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    return asyncio.run(serve_shard(spec))


if __name__ == "__main__":
    sys.exit(main())
