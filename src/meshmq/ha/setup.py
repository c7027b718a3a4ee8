"""Build the lease backend a configuration asks for."""

from __future__ import annotations

import os
import secrets
import socket

from meshmq.config.model import BrokerConfig
from meshmq.errors import ConfigError
from meshmq.ha.controller import LeaseBackend


def default_holder_id(config: BrokerConfig) -> str:
    """Unique per broker process: name, host, pid and a random tag (a restarted broker
    is a new holder, so a stale record of its previous life is never mistaken for it)."""
    tail = f"@{socket.gethostname()[:20]}:{os.getpid()}:{secrets.token_hex(3)}"
    return config.broker_name[:64 - len(tail)] + tail


def create_backend(config: BrokerConfig) -> LeaseBackend:
    ha = config.ha
    holder = ha.holder_id or default_holder_id(config)
    if ha.mode == "shared":
        from meshmq.ha.file_lease import FileLease

        return FileLease(config.store_directory, holder)
    if ha.mode == "database":
        from meshmq.ha.pg_lease import PgLease

        if not config.store.dsn:
            raise ConfigError("ha mode 'database' needs store.dsn", option="store.dsn")
        return PgLease(config.store.dsn, holder, lease_ms=ha.lease_ms,
                       table_prefix=config.store.table_prefix)
    raise ConfigError(f"unknown ha mode {ha.mode!r}", option="ha.mode")
