"""The STOMP frame value type and the command sets of STOMP 1.0, 1.1 and 1.2."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CLIENT_COMMANDS", "SERVER_COMMANDS", "Frame"]

CLIENT_COMMANDS: frozenset[str] = frozenset({
    "CONNECT", "STOMP", "SEND", "SUBSCRIBE", "UNSUBSCRIBE", "ACK", "NACK",
    "BEGIN", "COMMIT", "ABORT", "DISCONNECT",
})
SERVER_COMMANDS: frozenset[str] = frozenset({"CONNECTED", "MESSAGE", "RECEIPT", "ERROR"})


@dataclass(slots=True, init=False)  # hand-written __init__: compiled by mypyc, one per frame
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
