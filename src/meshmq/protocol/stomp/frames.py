"""The STOMP frame value type, the client's frames as typed subclasses, and the command
sets of STOMP 1.0, 1.1 and 1.2."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

__all__ = [
    "CLIENT_COMMANDS", "CLIENT_FRAME_TYPES", "OUTCOME_HEADER", "SERVER_COMMANDS", "Abort",
    "Ack", "Begin", "Commit", "Connect", "Disconnect", "Frame", "Nack", "Send",
    "Subscribe", "Unsubscribe",
]

CLIENT_COMMANDS: Final[frozenset[str]] = frozenset({
    "CONNECT", "STOMP", "SEND", "SUBSCRIBE", "UNSUBSCRIBE", "ACK", "NACK",
    "BEGIN", "COMMIT", "ABORT", "DISCONNECT",
})
SERVER_COMMANDS: Final[frozenset[str]] = frozenset({"CONNECTED", "MESSAGE", "RECEIPT", "ERROR"})
# meshmq's header on the ERROR that answers a COMMIT the broker could not confirm:
# ``rolled-back`` (nothing of the transaction happened) or ``unknown`` (it may have
# committed). Clients read it, never the message text.
OUTCOME_HEADER: Final = "meshmq-outcome"


@dataclass(slots=True, init=False, eq=False)  # hand-written __init__ and __eq__: compiled by mypyc
class Frame:
    """One STOMP frame.

    ``headers`` keeps wire order and repeated entries (already un-escaped): the
    broker may need to forward them verbatim, while lookups follow the STOMP 1.2
    rule that the first occurrence of a repeated header wins.
    """

    command: str
    headers: list[tuple[str, str]]
    body: bytes = b""

    def __init__(self, command: str, headers: list[tuple[str, str]], body: bytes = b"") -> None:
        self.command = command
        self.headers = headers
        self.body = body

    def __eq__(self, other: object) -> bool:
        # The typed subclass follows from the command, so equal commands, headers and
        # body mean equal frames, whichever class a caller built.
        if not isinstance(other, Frame):
            return NotImplemented
        return (self.command == other.command and self.headers == other.headers
                and self.body == other.body)

    __hash__ = None  # type: ignore[assignment]  # mutable, like the dataclass it was

    def get(self, name: str, default: str | None = None) -> str | None:
        """Value of the first header called ``name``, else ``default``."""
        for key, value in self.headers:
            if key == name:
                return value
        return default

    def header_map(self) -> dict[str, str]:
        """Headers as a dict in wire order; the first occurrence of a repeated name wins."""
        result: dict[str, str] = {}
        for key, value in self.headers:
            if key not in result:
                result[key] = value
        return result


# The client's frames as typed events: the parser builds the class its command names
# (one dict lookup, no extra object), so a handler can match on the type.
class Connect(Frame):
    """CONNECT, or its STOMP 1.2 alias STOMP."""


class Send(Frame):
    """SEND: a message for a destination."""


class Subscribe(Frame):
    """SUBSCRIBE."""


class Unsubscribe(Frame):
    """UNSUBSCRIBE."""


class Ack(Frame):
    """ACK."""


class Nack(Frame):
    """NACK (STOMP 1.1 and later)."""


class Begin(Frame):
    """BEGIN a transaction."""


class Commit(Frame):
    """COMMIT a transaction."""


class Abort(Frame):
    """ABORT a transaction."""


class Disconnect(Frame):
    """DISCONNECT."""


CLIENT_FRAME_TYPES: Final[dict[str, type[Frame]]] = {
    "CONNECT": Connect, "STOMP": Connect, "SEND": Send, "SUBSCRIBE": Subscribe,
    "UNSUBSCRIBE": Unsubscribe, "ACK": Ack, "NACK": Nack, "BEGIN": Begin,
    "COMMIT": Commit, "ABORT": Abort, "DISCONNECT": Disconnect,
}
