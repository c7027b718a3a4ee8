"""The public API is what the package docstrings list; this pins it name by name.

A failure here means a public name was added, removed or renamed: update the expected
set (and the docs) only as a deliberate decision.
"""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

PUBLIC = {
    "meshmq": {"__version__"},
    "meshmq.client": {
        "AckMode", "AuthenticationFailedError", "BlockingClient", "BlockingSubscription",
        "BrokerError", "CertificateError", "ClientClosedError", "ClientError",
        "ConnectionFailedError", "ConnectionLostError", "Endpoint", "Event", "EventKind",
        "FailoverClient", "FailoverOptions", "FailoverSpec", "Message",
        "OperationTimeoutError", "Subscription", "TlsSetupError", "Transaction",
        "TransactionInDoubtError", "TransactionRolledBackError", "parse_failover",
    },
    "meshmq.client.agent": {
        "Agent", "AgentConfig", "EventPublisher", "TopicSubscriber", "load_agent_conf",
        "parse_agent_conf",
    },
}


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_public_names_are_pinned(module: str) -> None:
    mod = importlib.import_module(module)
    assert set(mod.__all__) == PUBLIC[module]
    assert len(mod.__all__) == len(set(mod.__all__))
    for name in mod.__all__:
        assert getattr(mod, name) is not None, name


def test_client_errors_share_one_root() -> None:
    from meshmq import client
    from meshmq.errors import MeshmqError

    errors = [getattr(client, n) for n in client.__all__ if n.endswith("Error")]
    assert errors and all(issubclass(e, MeshmqError) for e in errors)


def test_import_meshmq_is_cheap() -> None:
    """``import meshmq`` loads neither asyncio adapters nor pyspark (its docstring)."""
    code = ("import sys, meshmq; print(sorted(m for m in ('asyncio', 'pyspark', 'aiohttp',"
            " 'meshmq.transport', 'meshmq.core', 'meshmq.client') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60)
    assert out.stdout.strip() == "[]"
