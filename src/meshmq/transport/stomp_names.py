"""ActiveMQ's STOMP destination names <-> the core destination model.

``/queue/a``, ``/topic/a``, ``/temp-queue/a``, ``/temp-topic/a`` (scoped to the
connection that names them), ``/remote-temp-queue/ID:...`` (someone else's
temporary destination, as it appears in ``reply-to``), and comma-separated
composites where a part without a prefix inherits the previous part's kind.
"""

from __future__ import annotations

from collections.abc import Callable

from meshmq.core import destinations as dst
from meshmq.core.destinations import Destination, DestKind
from meshmq.errors import DestinationError

PREFIXES: dict[str, DestKind] = {
    "/queue/": DestKind.QUEUE,
    "/topic/": DestKind.TOPIC,
    "/temp-queue/": DestKind.TEMP_QUEUE,
    "/temp-topic/": DestKind.TEMP_TOPIC,
    "/remote-temp-queue/": DestKind.TEMP_QUEUE,
    "/remote-temp-topic/": DestKind.TEMP_TOPIC,
}
_LOCAL_TEMP = ("/temp-queue/", "/temp-topic/")

# Resolves a connection-local temp name ("/temp-queue/replies" -> "replies") to
# the broker-wide temporary destination, creating it on first use.
TempResolver = Callable[[DestKind, str], Destination]


def parse(text: str, resolve_temp: TempResolver) -> tuple[Destination, ...]:
    if not text or not text.strip():
        raise DestinationError("empty destination")
    out: list[Destination] = []
    kind: DestKind | None = None
    for raw in text.split(","):
        part = raw.strip()
        prefix = next((p for p in PREFIXES if part.startswith(p)), None)
        if prefix is None:
            if kind is None or part.startswith("/"):
                raise DestinationError(
                    f"Illegal destination name: [{part}] -- STOMP destinations must begin "
                    "with one of: /queue/ /topic/ /temp-queue/ /temp-topic/")
            name = part
        else:
            kind = PREFIXES[prefix]
            name = part[len(prefix):]
            if prefix in _LOCAL_TEMP:
                dst.validate_name(name)
                out.append(resolve_temp(kind, name))
                continue
        if kind.is_temporary:
            if not name:
                raise DestinationError("empty temporary destination name")
            out.append(Destination(kind, name))
        else:
            out.append(dst.make(kind, name))
    if len(set(out)) != len(out):
        out = list(dict.fromkeys(out))
    return tuple(out)


def render(dest: Destination, local_names: dict[Destination, str] | None = None) -> str:
    """The STOMP form of ``dest`` as one particular connection should see it."""
    kind = dest.kind
    if kind is DestKind.QUEUE:
        return "/queue/" + dest.name
    if kind is DestKind.TOPIC:
        return "/topic/" + dest.name
    if local_names is not None:
        local = local_names.get(dest)
        if local is not None:
            return ("/temp-queue/" if kind is DestKind.TEMP_QUEUE else "/temp-topic/") + local
    return ("/remote-temp-queue/" if kind is DestKind.TEMP_QUEUE
            else "/remote-temp-topic/") + dest.name
