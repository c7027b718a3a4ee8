"""What both ends of a link share: routing frames to the forwarding and receiving
halves once the handshake is done, and tearing them down with the link."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from meshmq.config.model import NetworkConnectorConfig
from meshmq.errors import RemoteProtocolError
from meshmq.protocol.wire import (
    FrameType,
    WireFrame,
    decode_ack_ranges,
    decode_acks,
    decode_json,
    decode_messages,
)

#: The cause of a link the remote closed with BYE (an orderly shutdown, not a crash).
BYE_CAUSE = "the remote broker said goodbye"

if TYPE_CHECKING:
    from meshmq.network.forwarder import Forwarder
    from meshmq.network.link import WireLink
    from meshmq.network.receiver import Receiver

# Connector properties the initiator sends in HELLO, so a duplex responder forwards
# with the same rules (ActiveMQ propagates its configuration the same way). Secrets and
# this broker's own TLS files stay here.
MIRRORED = tuple(f.name for f in dataclasses.fields(NetworkConnectorConfig)
                 if f.name not in ("uri", "username", "password", "verify_hostname")
                 and not f.name.startswith("ssl_"))


def mirror_json(config: NetworkConnectorConfig) -> dict[str, Any]:
    return {name: getattr(config, name) for name in MIRRORED}


def client_uris_of(body: dict[str, Any]) -> tuple[str, ...]:
    uris = body.get("client_uris", [])
    if not isinstance(uris, list) or not all(isinstance(u, str) for u in uris):
        raise RemoteProtocolError("client_uris must be a list of strings")
    return tuple(uris)


def management_url_of(body: dict[str, Any]) -> str | None:
    """The peer's management URL (optional: older brokers and brokers without a management
    endpoint send none)."""
    url = body.get("management_url")
    if url is not None and not isinstance(url, str):
        raise RemoteProtocolError("management_url must be a string")
    return url or None


def mirror_config(data: object) -> NetworkConnectorConfig:
    if not isinstance(data, dict):
        raise RemoteProtocolError("HELLO config must be an object")
    defaults = NetworkConnectorConfig(uri="duplex:")
    changes: dict[str, Any] = {}
    for name in MIRRORED:
        if name not in data:
            continue
        value, default = data[name], getattr(defaults, name)
        if isinstance(default, tuple):
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise RemoteProtocolError(f"HELLO config {name} must be a list of strings")
            value = tuple(value)
        elif default is None:  # message_ttl, consumer_ttl: an int or None
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise RemoteProtocolError(f"HELLO config {name} has a bad type")
        elif isinstance(default, bool):
            if not isinstance(value, bool):
                raise RemoteProtocolError(f"HELLO config {name} must be a boolean")
        elif isinstance(default, int | float):
            # Counts and times must be ints (they size windows and compare with
            # lengths); only float settings take a fraction.
            whole = isinstance(default, int)
            if isinstance(value, bool) or not isinstance(value, int if whole else int | float):
                raise RemoteProtocolError(f"HELLO config {name} must be "
                                          f"{'an integer' if whole else 'a number'}")
        elif not isinstance(value, type(default)):
            raise RemoteProtocolError(f"HELLO config {name} has a bad type")
        changes[name] = value
    return dataclasses.replace(defaults, **changes)


class LinkEnd:
    forwarder: Forwarder | None = None
    receiver: Receiver | None = None
    remote_client_uris: tuple[str, ...] = ()  # where the remote broker's clients connect
    remote_management_url: str | None = None  # where the remote's management API answers

    def on_synced(self) -> None:
        """The remote's first full interest sync arrived."""

    def on_refused(self, code: str, message: str) -> None:
        """The remote explained why it is closing the link."""

    def route(self, link: WireLink, frame: WireFrame) -> None:
        ftype = frame.type
        if ftype is FrameType.MESSAGES or ftype is FrameType.MESSAGES_AGAIN:
            if self.receiver is None:
                raise RemoteProtocolError(f"{ftype.name} on a link that does not receive")
            self.receiver.on_messages(decode_messages(frame),
                                      again=ftype is FrameType.MESSAGES_AGAIN)
        elif ftype is FrameType.ACKS:
            if self.forwarder is None:
                raise RemoteProtocolError("ACKS on a link that does not forward")
            self.forwarder.on_acks(decode_acks(frame))
        elif ftype is FrameType.ACK_RANGES:
            if self.forwarder is None:
                raise RemoteProtocolError("ACK_RANGES on a link that does not forward")
            self.forwarder.on_ack_ranges(decode_ack_ranges(frame))
        elif ftype is FrameType.INTEREST:
            if self.forwarder is None:
                raise RemoteProtocolError("INTEREST on a link that does not forward")
            body = decode_json(frame)
            op = body.get("op")
            if op not in ("sync", "update", "hold", "release"):
                raise RemoteProtocolError(
                    f"INTEREST op must be sync, update, hold or release, not {op!r}")
            first = not self.forwarder.synced
            self.forwarder.apply_interest(op, body)
            if first and op == "sync":
                self.on_synced()
        elif ftype is FrameType.REFUSE:
            body = decode_json(frame)
            self.on_refused(str(body.get("code", "refused")), str(body.get("message", "")))
            link.close(f"refused by the remote: {body.get('code')}: {body.get('message')}")
        elif ftype is FrameType.BYE:
            reason = decode_json(frame).get("reason") or "no reason given"
            link.close(f"{BYE_CAUSE} ({reason})")
        else:
            raise RemoteProtocolError(f"unexpected {ftype.name} frame")

    def on_writable(self, link: WireLink) -> None:
        if self.forwarder is not None:
            self.forwarder.on_writable()

    def teardown(self) -> None:
        forwarder, self.forwarder = self.forwarder, None
        receiver, self.receiver = self.receiver, None
        if forwarder is not None:
            forwarder.close()
        if receiver is not None:
            receiver.close()
