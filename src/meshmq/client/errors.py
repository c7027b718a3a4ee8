"""Errors of the failover client; all are :class:`meshmq.errors.MeshmqError`.

``retriable`` says whether doing the same thing again may succeed.
"""

from __future__ import annotations

from meshmq.errors import MeshmqError, TransactionError

__all__ = [
    "AuthenticationFailedError",
    "BrokerError",
    "CertificateError",
    "ClientClosedError",
    "ClientError",
    "ConnectionFailedError",
    "ConnectionLostError",
    "OperationTimeoutError",
    "ProtocolVersionRefusedError",
    "TlsSetupError",
    "TransactionInDoubtError",
    "TransactionRolledBackError",
]


class ClientError(MeshmqError):
    code = "client-error"


class BrokerError(ClientError):
    """The broker refused an operation (a STOMP ERROR frame, an MQTT failure reason code).

    Re-sending the same thing elsewhere would be refused the same way: not retried.
    """

    code = "broker-error"


class ProtocolVersionRefusedError(BrokerError):
    """The broker does not speak the MQTT level we offered (a 3.1.1-only broker asked
    for MQTT 5); the client retries with 3.1.1 when ``mqtt_version`` is automatic."""

    code = "protocol-version-refused"


class ConnectionLostError(ClientError):
    """One broker connection dropped (internal: the failover layer retries)."""

    code = "connection-lost"
    retriable = True


class ConnectionFailedError(ClientError):
    """Every endpoint failed and the reconnect budget is spent (maxReconnectAttempts)."""

    code = "connection-failed"


class OperationTimeoutError(ClientError):
    """The failover ``timeout`` (or an operation's own) passed while disconnected or waiting
    for the broker's confirmation. The client keeps reconnecting."""

    code = "timeout"
    retriable = True


class AuthenticationFailedError(BrokerError, ConnectionFailedError):
    """The broker refused the login (a STOMP ERROR in reply to CONNECT that names
    authentication, an MQTT CONNACK "bad user name or password" / "not authorized").

    Permanent: the client stops reconnecting (unless ``give_up_on_auth_failure=False``),
    emits a ``FAILED`` event carrying this error, and every operation raises it."""

    code = "authentication-failed"


class CertificateError(ConnectionFailedError):
    """TLS: the broker's certificate failed verification (unknown CA, wrong host name,
    expired), or the broker refused ours. The text names the endpoint, the cause and
    what to pass. Permanent like a refused login: the client stops reconnecting
    (unless ``give_up_on_auth_failure=False``)."""

    code = "certificate-error"


class TlsSetupError(ClientError):
    """A CA file, client certificate or key given to the client cannot be used."""

    code = "tls-setup"


class ClientClosedError(ClientError):
    code = "client-closed"


class TransactionRolledBackError(TransactionError):
    """The connection dropped before COMMIT was sent, so the broker discarded the
    transaction, or the broker answered COMMIT by rolling it back (an ERROR with
    ``meshmq-outcome: rolled-back``: on a node of shards, a shard it touches was
    unreachable or did not prepare in time). Nothing of it happened; redo it in a new
    transaction."""

    code = "transaction-rolled-back"
    retriable = True


class TransactionInDoubtError(TransactionError):
    """The connection dropped after COMMIT was sent and before its receipt, or the broker
    answered COMMIT saying its outcome is unknown (an ERROR with ``meshmq-outcome:
    unknown``: on a node of shards, the shard that commits it did not answer in time):
    the broker may or may not have committed. The application must decide (idempotent
    sends with a ``dedup-id`` make redoing the sends safe on meshmq)."""

    code = "transaction-in-doubt"
