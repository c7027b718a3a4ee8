"""One internal destination grammar shared by every protocol.

A destination is a kind (queue, topic, temp-queue, temp-topic) plus a physical
name made of ``.``-separated segments. Wildcards follow ActiveMQ: ``*`` matches
exactly one segment, ``>`` matches one or more trailing segments (``A.>`` does
not match ``A``). STOMP names (``/queue/a``) and, later, MQTT filters translate
into this model; nothing in the core knows protocol syntax.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from functools import lru_cache
from typing import Final

from meshmq.errors import DestinationError

ANY_CHILD: Final = "*"
ANY_DESCENDANT: Final = ">"
SEPARATOR: Final = "."
MAX_NAME_LENGTH: Final = 1024


class DestKind(enum.StrEnum):  # StrEnum: C-level hashing on the hot path
    QUEUE = "queue"
    TOPIC = "topic"
    TEMP_QUEUE = "temp-queue"
    TEMP_TOPIC = "temp-topic"

    @property
    def is_queue(self) -> bool:
        return self in (DestKind.QUEUE, DestKind.TEMP_QUEUE)

    @property
    def is_topic(self) -> bool:
        return self in (DestKind.TOPIC, DestKind.TEMP_TOPIC)

    @property
    def is_temporary(self) -> bool:
        return self in (DestKind.TEMP_QUEUE, DestKind.TEMP_TOPIC)


# The kinds as Final constants: in the compiled build a Destination's kind tests are then
# pointer comparisons, where ``self.kind.is_topic`` is a property call on a Python enum.
_QUEUE: Final = DestKind.QUEUE
_TOPIC: Final = DestKind.TOPIC
_TEMP_QUEUE: Final = DestKind.TEMP_QUEUE
_TEMP_TOPIC: Final = DestKind.TEMP_TOPIC


@dataclass(frozen=True, slots=True, eq=False)
class Destination:
    kind: DestKind
    name: str

    # Hand-written: destinations are dict keys on every send, and the generated versions
    # build tuples. Identity first: protocol sessions reuse Destination objects.
    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if other.__class__ is not Destination:
            return NotImplemented
        assert isinstance(other, Destination)
        return self.name == other.name and self.kind is other.kind

    def __hash__(self) -> int:
        # The name alone (str caches its hash): a queue and a topic of the same name only
        # share a bucket, and equality still tells them apart.
        return hash(self.name)

    @property
    def is_queue(self) -> bool:
        kind = self.kind
        return kind is _QUEUE or kind is _TEMP_QUEUE

    @property
    def is_topic(self) -> bool:
        kind = self.kind
        return kind is _TOPIC or kind is _TEMP_TOPIC

    @property
    def is_temporary(self) -> bool:
        kind = self.kind
        return kind is _TEMP_QUEUE or kind is _TEMP_TOPIC

    @property
    def is_wildcard(self) -> bool:
        return is_wildcard_name(self.name)

    @property
    def is_advisory(self) -> bool:
        return self.is_topic and self.name.startswith("ActiveMQ.Advisory.")

    @property
    def is_broker_owned(self) -> bool:
        """Topics only the broker writes: advisories and the ``$SYS`` statistics (MQTT
        ``$SYS/...``). Clients may read them, never send to them."""
        return self.is_topic and (self.name.startswith("ActiveMQ.Advisory.")
                                       or self.name.startswith("$SYS."))

    def __str__(self) -> str:
        # The canonical text form, also used as a store key: "queue://a.b".
        return f"{self.kind.value}://{self.name}"

    @classmethod
    def parse_uri(cls, text: str) -> Destination:
        """Inverse of ``str(destination)``."""
        kind_text, sep, name = text.partition("://")
        if not sep:
            raise DestinationError(f"not a destination URI: {text!r}")
        try:
            kind = DestKind(kind_text)
        except ValueError:
            raise DestinationError(f"unknown destination kind in {text!r}") from None
        return make(kind, name)


def queue(name: str) -> Destination:
    return make(DestKind.QUEUE, name)


def topic(name: str) -> Destination:
    return make(DestKind.TOPIC, name)


def make(kind: DestKind, name: str) -> Destination:
    validate_name(name)
    return Destination(kind, name)


def validate_name(name: str) -> None:
    if not name:
        raise DestinationError("destination name is empty")
    if len(name) > MAX_NAME_LENGTH:
        raise DestinationError(f"destination name longer than {MAX_NAME_LENGTH} characters")
    if "\x00" in name:
        raise DestinationError("destination name contains NUL")
    if "," in name:
        raise DestinationError("destination name contains ',' (composites are split earlier)")
    segments = name.split(SEPARATOR)
    for i, seg in enumerate(segments):
        if seg == "":
            raise DestinationError(f"destination {name!r} has an empty segment")
        if seg == ANY_DESCENDANT and i != len(segments) - 1:
            raise DestinationError(f"'>' must be the last segment in {name!r}")
        if seg not in (ANY_CHILD, ANY_DESCENDANT) and (ANY_CHILD in seg or ANY_DESCENDANT in seg):
            raise DestinationError(f"wildcard must be a whole segment in {name!r}")


def is_wildcard_name(name: str) -> bool:
    return ANY_CHILD in name or ANY_DESCENDANT in name


@lru_cache(maxsize=4096)
def _segments(name: str) -> tuple[str, ...]:
    return tuple(name.split(SEPARATOR))


def name_matches(pattern: str, name: str) -> bool:
    """Whether concrete ``name`` matches wildcard ``pattern`` (ActiveMQ semantics)."""
    if pattern == name:
        return True
    if not is_wildcard_name(pattern):
        return False
    pat = _segments(pattern)
    segs = _segments(name)
    for i, p in enumerate(pat):
        if p == ANY_DESCENDANT:
            return len(segs) > i
        if i >= len(segs):
            return False
        if p != ANY_CHILD and p != segs[i]:
            return False
    return len(pat) == len(segs)


def matches(pattern: Destination, dest: Destination) -> bool:
    """Whether ``dest`` is covered by ``pattern`` (same family: queue or topic)."""
    if pattern.kind.is_queue != dest.kind.is_queue:
        return False
    if pattern.kind.is_temporary != dest.kind.is_temporary:
        return False
    return name_matches(pattern.name, dest.name)
