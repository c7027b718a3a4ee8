"""The error hierarchy: one root, and every error says whose fault it was.

``LocalProtocolError``: we (this side) were asked to do something the protocol
forbids. ``RemoteProtocolError``: the peer sent something invalid. Each error
carries a short machine-readable ``code`` and a ``retriable`` flag so clients can
decide whether trying again may help.
"""

from __future__ import annotations


class MeshmqError(Exception):
    """Root of every error meshmq raises on purpose."""

    code: str = "error"
    retriable: bool = False

    def __init__(self, message: str, *, code: str | None = None,
                 retriable: bool | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        if retriable is not None:
            self.retriable = retriable


class ProtocolError(MeshmqError):
    code = "protocol-error"


class LocalProtocolError(ProtocolError):
    """We tried to do something the protocol does not allow."""


class RemoteProtocolError(ProtocolError):
    """The peer sent bytes or a frame the protocol does not allow."""


class FrameTooLargeError(RemoteProtocolError):
    code = "frame-too-large"


class AuthenticationError(MeshmqError):
    code = "authentication-failed"


class AuthorizationError(MeshmqError):
    code = "not-authorized"


class DestinationError(MeshmqError):
    """An invalid destination name (syntax, unknown prefix, wildcard where none allowed)."""

    code = "invalid-destination"


class SelectorError(MeshmqError):
    """An invalid JMS selector expression."""

    code = "invalid-selector"


class ResourceLimitError(MeshmqError):
    """A configured limit (memory, connections, frame size) was reached."""

    code = "resource-limit"
    retriable = True


class TransactionError(MeshmqError):
    code = "transaction-error"


class ConfigError(MeshmqError):
    """A configuration problem, located as precisely as the source allows."""

    code = "config-error"

    def __init__(self, message: str, *, file: str | None = None, line: int | None = None,
                 option: str | None = None) -> None:
        self.file = file
        self.line = line
        self.option = option
        where = []
        if file is not None:
            where.append(file if line is None else f"{file}:{line}")
        if option is not None:
            where.append(f"option {option!r}")
        full = f"{', '.join(where)}: {message}" if where else message
        super().__init__(full)
        self.reason = message


class StoreError(MeshmqError):
    code = "store-error"


class CorruptStoreError(StoreError):
    """On-disk data failed validation (bad magic, version, checksum or structure)."""

    code = "store-corrupt"


class ListenError(MeshmqError):
    """A listener could not bind its address (in use, not permitted, no such address)."""

    code = "listen-failed"


def describe_bind_failure(what: str, host: str, port: int, exc: OSError,
                          change: str) -> ListenError:
    """One line for a failed bind: what could not listen where, why, and what to change."""
    import errno
    import os

    if exc.errno == errno.EADDRINUSE:
        reason = "address already in use: another process, another broker perhaps, has it"
    elif isinstance(exc.errno, int) and exc.errno > 0:
        reason = os.strerror(exc.errno).lower()  # not the event loop's long wording
    else:
        reason = exc.strerror or str(exc)  # name resolution: "Name or service not known"
    return ListenError(f"cannot listen for {what} on {host}:{port} ({reason}): {change}")
