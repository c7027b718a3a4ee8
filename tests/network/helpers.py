"""Networks of brokers in tests: brokers with a STOMP and a tcp:// (wire) listener,
started in-process (ThreadBroker) or as subprocesses (ProcessBroker)."""

from __future__ import annotations

import dataclasses
import json
import urllib.request
from pathlib import Path
from typing import Any

from meshmq.config.model import AuthConfig, ListenerConfig, NetworkConnectorConfig, User
from tests.support.brokers import ThreadBroker, make_config, poll

# Broker links are admitted only for a configured user: every test broker has this one
# (anonymous clients are still welcome) and connectors log in with it by default.
LINK_USER = User("link", "link-secret")
LINK_AUTH = AuthConfig(users=(LINK_USER,))


def net_config(data: Path, name: str, *connectors: NetworkConnectorConfig,
               update_cluster_clients: bool = False, **changes: Any):
    listeners = (ListenerConfig(name="stomp", protocol="stomp", host="127.0.0.1", port=0,
                                update_cluster_clients=update_cluster_clients),
                 ListenerConfig(name="tcp", protocol="tcp", host="127.0.0.1", port=0))
    changes.setdefault("auth", LINK_AUTH)
    return make_config(data, broker_name=name, listeners=listeners,
                       network_connectors=tuple(connectors), **changes)


def connector(uri: str, **kw: Any) -> NetworkConnectorConfig:
    if "username" not in kw and "ssl_certfile" not in kw:
        kw["username"], kw["password"] = LINK_USER.name, LINK_USER.password
    # Fast reconnects in tests: a failing bridge retries within 50-400 ms.
    kw.setdefault("initial_reconnect_delay_ms", 50)
    kw.setdefault("max_reconnect_delay_ms", 400)
    kw.setdefault("heartbeat_ms", 500)
    return NetworkConnectorConfig(uri=uri, **kw)


def tcp_uri(broker: ThreadBroker) -> str:
    assert broker.runtime is not None
    host, port = broker.runtime.addresses["tcp"]
    return f"tcp://{host}:{port}"


def bridges(broker: ThreadBroker) -> list[dict[str, Any]]:
    assert broker.runtime is not None
    return broker.run(broker.runtime.network.status)  # type: ignore[union-attr]


def stat_of(port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/stat", timeout=10) as resp:
        return json.loads(resp.read())  # type: ignore[no-any-return]


def wait_forwarding(broker: ThreadBroker, count: int = 1) -> None:
    poll(lambda: sum(b["state"] == "forwarding" and b["direction"] == "outbound"
                     for b in bridges(broker)) >= count, what=f"{count} bridges forwarding")


def consumers_on(broker: ThreadBroker, dest: str) -> int:
    """Consumers (local and network demand) on queue ``dest`` of ``broker``."""
    assert broker.runtime is not None

    def count() -> int:
        from meshmq.core.destinations import Destination
        q = broker.runtime.broker.queues.get(Destination.parse_uri(dest))  # type: ignore[union-attr]
        return len(q.consumers) if q is not None else 0
    return broker.run(count)


__all__ = ["LINK_AUTH", "LINK_USER", "bridges", "connector", "consumers_on", "dataclasses",
           "net_config", "stat_of", "tcp_uri", "wait_forwarding"]
