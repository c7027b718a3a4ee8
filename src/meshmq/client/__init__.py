"""meshmq's clients: the failover client (asyncio and blocking, STOMP and MQTT), the
Python Cartridge Agent compatibility layer (:mod:`meshmq.client.agent`) and the small
single-socket STOMP client the CLI uses (:mod:`meshmq.client.simple_stomp`).

Public: the names in ``__all__`` below (``FailoverClient`` for asyncio code,
``BlockingClient`` for threads, ``parse_failover`` for ``failover:(...)`` URIs, the
``ClientError`` hierarchy) and :mod:`meshmq.client.agent`. The other submodules are the
implementation; ``simple_stomp`` is the CLI's one-socket client. tests/unit/test_public_api.py pins
the set.
"""

from .aio import FailoverClient, Subscription, Transaction
from .blocking import BlockingClient, BlockingSubscription
from .errors import (
    AuthenticationFailedError,
    BrokerError,
    CertificateError,
    ClientClosedError,
    ClientError,
    ConnectionFailedError,
    ConnectionLostError,
    OperationTimeoutError,
    TlsSetupError,
    TransactionInDoubtError,
    TransactionRolledBackError,
)
from .options import Endpoint, FailoverOptions, FailoverSpec, parse_failover
from .types import AckMode, Event, EventKind, Message

__all__ = [
    "AckMode",
    "AuthenticationFailedError",
    "BlockingClient",
    "BlockingSubscription",
    "BrokerError",
    "CertificateError",
    "ClientClosedError",
    "ClientError",
    "ConnectionFailedError",
    "ConnectionLostError",
    "Endpoint",
    "Event",
    "EventKind",
    "FailoverClient",
    "FailoverOptions",
    "FailoverSpec",
    "Message",
    "OperationTimeoutError",
    "Subscription",
    "TlsSetupError",
    "Transaction",
    "TransactionInDoubtError",
    "TransactionRolledBackError",
    "parse_failover",
]
