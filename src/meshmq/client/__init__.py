"""meshmq's clients: the failover client (asyncio and blocking, STOMP and MQTT), the
Python Cartridge Agent compatibility layer (:mod:`meshmq.client.agent`) and the small
single-socket STOMP client the CLI uses (:mod:`meshmq.client.simple_stomp`)."""

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
