"""The Spark source's and sink's broker connections: meshmq's failover client.

The ``url`` option is a failover URI (``failover:(stomp://a,stomp://b)?options``, as
docs/client.md describes) or plain addresses (``host:port``, ``stomp://host:port``,
``a:1,b:2``), which are read as a failover list of themselves. A broker that goes down
is left for the next one with the client's back-off; the client restores
subscriptions and re-sends unconfirmed sends with their ``dedup-id``.

A job must not wait for ever on a dead cluster, so unless the URI sets
``maxReconnectAttempts`` or ``startupMaxReconnectAttempts`` the job's clients give up
after :data:`JOB_RECONNECT_ATTEMPTS` passes over the list (about three minutes with
the default back-off). Every failure is a :class:`StompIOError` of one line.

Clients are created where they are used (Spark pickles readers and writers, never
their connections).
"""

from __future__ import annotations

import dataclasses
from types import TracebackType
from typing import Any

from meshmq.client import BlockingClient, BlockingSubscription, FailoverClient
from meshmq.client.errors import ClientError
from meshmq.client.options import FailoverSpec, parse_failover
from meshmq.client.types import Event, EventKind, Message
from meshmq.errors import MeshmqError
from meshmq.uri import CompositeURI, parse_uri

JOB_RECONNECT_ATTEMPTS = 15
_ATTEMPT_OPTIONS = ("maxReconnectAttempts", "startupMaxReconnectAttempts")


class StompIOError(MeshmqError):
    code = "stomp-io"
    retriable = True


def failover_text(url: str) -> str:
    """``url`` as a failover URI: plain addresses become ``failover:(stomp://...)``."""
    text = url.strip()
    if text.startswith("failover:"):
        return text
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts:
        raise ValueError(f"no broker address in url {url!r}")
    return "failover:(" + ",".join(p if "://" in p else f"stomp://{p}" for p in parts) + ")"


def build_spec(url: str, *, tls_only: bool = False,
               verify_host_name: bool = True) -> FailoverSpec:
    """The parsed failover spec of ``url``; ValueError (one line) when it is not one.

    ``tls_only``: every endpoint is TLS (a CA or client certificate was given)."""
    text = failover_text(url)
    try:
        spec = parse_failover(text, protocol="stomp")
        given = parse_uri(text)
    except (MeshmqError, ValueError) as exc:
        raise ValueError(f"meshmq option url: {exc}") from None
    options = spec.options
    named = given.options if isinstance(given, CompositeURI) else {}
    if not any(name in named for name in _ATTEMPT_OPTIONS):
        options = dataclasses.replace(options, maxReconnectAttempts=JOB_RECONNECT_ATTEMPTS)
    endpoints = tuple(dataclasses.replace(
        e, tls=e.tls or tls_only,
        verify_host_name=e.verify_host_name if e.verify_host_name is not None
        else (None if verify_host_name else False)) for e in spec.endpoints)
    return dataclasses.replace(spec, endpoints=endpoints, options=options)


def one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


@dataclasses.dataclass(frozen=True)
class ClientSettings:
    """Everything needed to open a client; plain data, so it pickles."""

    url: str
    login: str | None = None
    passcode: str | None = None
    trust_store: str | None = None
    key_store: str | None = None
    key_store_key: str | None = None
    key_store_password: str | None = None
    verify_host_name: bool = True

    def spec(self) -> FailoverSpec:
        return build_spec(self.url, tls_only=bool(self.trust_store or self.key_store),
                          verify_host_name=self.verify_host_name)

    def kwargs(self) -> dict[str, Any]:
        return {"spec": self.spec(), "login": self.login, "passcode": self.passcode,
                "ssl_cafile": self.trust_store, "ssl_certfile": self.key_store,
                "ssl_keyfile": self.key_store_key,
                "ssl_key_password": self.key_store_password}

    def asyncio_client(self) -> FailoverClient:
        """For the sink, which keeps many confirmed sends in flight."""
        try:
            return FailoverClient(self.url, **self.kwargs())
        except (MeshmqError, ValueError) as exc:
            raise StompIOError(one_line(exc), retriable=False) from None


class JobClient:
    """A connected blocking failover client whose failures are one-line StompIOErrors."""

    def __init__(self, settings: ClientSettings) -> None:
        self.url = settings.url
        self.failure: BaseException | None = None
        try:
            self.client = BlockingClient(settings.url, on_event=self._event,
                                         **settings.kwargs())
        except (MeshmqError, ValueError) as exc:
            raise StompIOError(one_line(exc), retriable=False) from None
        try:
            self.call(self.client.connect)
        except BaseException:
            self.client.close()
            raise

    def _event(self, event: Event) -> None:
        if event.kind is EventKind.FAILED:
            self.failure = event.error

    def call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` with the client's errors turned into StompIOError."""
        try:
            return fn(*args, **kwargs)
        except ClientError as exc:
            raise StompIOError(f"{self.url}: {one_line(exc)}", retriable=exc.retriable) \
                from None

    @property
    def connected(self) -> bool:
        return self.client.connected

    def subscribe(self, destination: str, **kwargs: Any) -> BlockingSubscription:
        sub: BlockingSubscription = self.call(self.client.subscribe, destination, **kwargs)
        return sub

    def next_message(self, sub: BlockingSubscription, timeout: float) -> Message | None:
        """The next message within ``timeout`` s, None if none; raises once the client
        gave up reconnecting."""
        msg = sub.poll(timeout)
        if msg is None and self.failure is not None:
            raise StompIOError(f"{self.url}: failover gave up: {one_line(self.failure)}",
                               retriable=False)
        return msg

    def ack(self, msg: Message) -> bool:
        acked: bool = self.call(self.client.ack, msg)
        return acked

    def close(self) -> None:
        try:
            self.client.close()
        except (MeshmqError, OSError):
            pass  # closing a client that lost its broker: nothing left to tell it

    def __enter__(self) -> JobClient:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
