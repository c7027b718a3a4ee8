"""CONNECT-time negotiation (version, heart-beats) and per-command required headers."""

from __future__ import annotations

from meshmq.errors import RemoteProtocolError

from .frames import Frame

__all__ = [
    "REQUIRED_HEADERS",
    "SUPPORTED_VERSIONS",
    "missing_headers",
    "negotiate_heartbeat",
    "negotiate_version",
    "parse_heartbeat",
]

SUPPORTED_VERSIONS = ("1.0", "1.1", "1.2")  # ascending: the last common one wins

# Java brokers parse heart-beats as ints; larger values are garbage, not intent.
_MAX_HEARTBEAT_MS = 2**31 - 1

_TX = ("transaction",)
_COMMON_11: dict[str, tuple[str, ...]] = {
    # CONNECT/STOMP: the spec wants accept-version and host for 1.1+, but like
    # ActiveMQ we accept a bare CONNECT and default to 1.0.
    "CONNECT": (), "STOMP": (), "DISCONNECT": (),
    "SEND": ("destination",),
    "SUBSCRIBE": ("destination", "id"),
    "UNSUBSCRIBE": ("id",),
    "BEGIN": _TX, "COMMIT": _TX, "ABORT": _TX,
    "CONNECTED": ("version",),
    "MESSAGE": ("destination", "message-id", "subscription"),
    "RECEIPT": ("receipt-id",),
    "ERROR": (),
}

REQUIRED_HEADERS: dict[str, dict[str, tuple[str, ...]]] = {
    "1.0": {
        "CONNECT": (), "STOMP": (), "DISCONNECT": (),
        "SEND": ("destination",),
        "SUBSCRIBE": ("destination",),
        # 1.0 UNSUBSCRIBE needs destination *or* id: the session checks that.
        "UNSUBSCRIBE": (),
        "ACK": ("message-id",),
        "BEGIN": _TX, "COMMIT": _TX, "ABORT": _TX,
        "CONNECTED": (),
        "MESSAGE": ("destination", "message-id"),
        "RECEIPT": ("receipt-id",),
        "ERROR": (),
    },
    "1.1": {
        **_COMMON_11,
        "ACK": ("message-id", "subscription"),
        "NACK": ("message-id", "subscription"),
    },
    "1.2": {
        **_COMMON_11,
        "ACK": ("id",),
        "NACK": ("id",),
    },
}


def negotiate_version(accept_version: str | None) -> str | None:
    """Highest version in a comma-separated ``accept-version`` that we support.

    No header means a 1.0 client. Returns None when nothing overlaps (including
    an empty header), to be answered with an ERROR frame.
    """
    if accept_version is None:
        return "1.0"
    offered = {item.strip() for item in accept_version.split(",")}
    for version in reversed(SUPPORTED_VERSIONS):
        if version in offered:
            return version
    return None


def _heartbeat_ms(text: str, value: str) -> int:
    text = text.strip()
    if not (text.isascii() and text.isdigit()) or len(text) > 10:
        raise RemoteProtocolError(f"invalid heart-beat header {value[:64]!r}")
    ms = int(text)
    if ms > _MAX_HEARTBEAT_MS:
        raise RemoteProtocolError(f"invalid heart-beat header {value[:64]!r}")
    return ms


def parse_heartbeat(value: str | None) -> tuple[int, int]:
    """Parse a ``heart-beat: cx,cy`` header (milliseconds); None means ``(0, 0)``."""
    if value is None:
        return (0, 0)
    first, sep, second = value.partition(",")
    if not sep:
        raise RemoteProtocolError(f"invalid heart-beat header {value[:64]!r}")
    return (_heartbeat_ms(first, value), _heartbeat_ms(second, value))


def negotiate_heartbeat(client: tuple[int, int],
                        server: tuple[int, int]) -> tuple[int, int]:
    """Return ``(send_interval_ms, receive_interval_ms)`` from the server's side.

    ``client`` is the CONNECT ``heart-beat`` (cx, cy), ``server`` what the server
    offers in CONNECTED (sx, sy). Per STOMP 1.1: the server sends every
    ``max(sx, cy)`` unless either is 0, and expects something from the client
    every ``max(cx, sy)`` unless either is 0 (0 = no heart-beating that way).
    """
    client_cx, client_cy = client
    server_cx, server_cy = server
    send = max(server_cx, client_cy) if server_cx and client_cy else 0
    receive = max(client_cx, server_cy) if client_cx and server_cy else 0
    return (send, receive)


def missing_headers(frame: Frame, version: str) -> list[str]:
    """Names of the headers ``version`` requires for ``frame.command`` that it lacks.

    Presence is what counts: an empty value is not "missing". Unknown commands
    require nothing here (the session rejects them).
    """
    try:
        required = REQUIRED_HEADERS[version].get(frame.command, ())
    except KeyError:
        raise ValueError(f"unsupported STOMP version {version!r}") from None
    if not required:
        return []
    present = {name for name, _ in frame.headers}
    return [name for name in required if name not in present]
