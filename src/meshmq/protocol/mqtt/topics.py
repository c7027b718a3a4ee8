r"""MQTT topic names and filters: validation, shared subscriptions, and the
mapping to meshmq's (ActiveMQ's) destination names.

Validation
==========
* :func:`validate_topic_name`: at least one character, no ``+``, ``#`` or U+0000
  -> :class:`TopicError` with reason code 0x90 (Topic Name invalid).
* :func:`validate_topic_filter`: at least one character, no U+0000, ``#`` only as
  the whole last level, ``+`` only as a whole level; for MQTT 5 a
  ``$share/{group}/{filter}`` needs a non-empty group without ``+ # /`` and a
  valid filter -> :class:`TopicError` with reason code 0x8F (Topic Filter invalid).
* :func:`is_shared` splits ``$share/group/filter`` into ``(group, filter)``.
* :func:`topic_matches` is plain MQTT matching (``$`` rule included).

Mapping to destination names
============================
ActiveMQ maps MQTT ``/`` to ``.`` and, so that nothing is lost, ``.`` to ``/``
(a swap: MQTT ``a.b/c`` is ActiveMQ ``a/b.c``); ``+`` is ``*`` and ``#`` is
``>`` in filters. meshmq keeps that and adds escapes for what ActiveMQ cannot
express, so every valid MQTT topic maps to a valid destination name and back
(and every destination name except ``%00`` maps to a valid MQTT topic and back).

Each MQTT level becomes one destination segment (and vice versa):

===========================  ================================  ===================
in the MQTT level            in the destination segment         why
===========================  ================================  ===================
``.``                        ``/``                              ActiveMQ's swap
(empty level)                ``%00`` (the whole segment)        no empty segments
``*`` ``>`` ``,``            ``%2A`` ``%3E`` ``%2C``            wildcards, composites
``%2B`` ``%23``              ``+`` ``#``                        not allowed in MQTT
===========================  ================================  ===================

So ``a//b`` is ``a.%00.b``, ``/a`` is ``%00.a``, ``a/`` is ``a.%00``; STOMP's
``/topic/price+tax`` is MQTT ``price%2Btax``. ``$`` is not special in the name:
``$SYS/broker/load`` is ``$SYS.broker.load``.

A ``%`` stands for itself unless it starts one of those escapes. Where a
literal ``%`` would be read as an escape it is written ``%25``: a ``%`` is an
escape exactly when it is followed by any number of ``25`` and then one of the
side's codes (segment side: ``2A 3E 2C``, or -- only as a whole segment --
``00``; MQTT side: ``2B 23``). So ``100%`` and ``50%off`` map unchanged, while
MQTT ``%2A`` becomes ``%252A`` and comes back as ``%2A``. Codes are upper-case;
``%2a`` is just text.

Filters: ``+`` -> ``*``, ``#`` -> ``>``; other levels as above. ActiveMQ's ``>``
matches one or more segments, MQTT's ``#`` zero or more, so ``a/#`` (which
matches ``a``) gives the pattern ``a.>`` plus the parent pattern ``a``: a
subscription must match either. MQTT filters starting with ``+`` or ``#`` do not
match topics whose first level starts with ``$``; :class:`DestinationFilter`
says when that exclusion applies (``exclude_dollar_topics``).
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Final, NamedTuple

from meshmq.errors import DestinationError

from .errors import TopicError
from .reason_codes import ReasonCode

__all__ = [
    "SHARE_PREFIX",
    "DestinationFilter",
    "destination_name_to_mqtt_topic",
    "destination_pattern_to_mqtt_filter",
    "is_shared",
    "mqtt_filter_to_destination",
    "mqtt_topic_to_destination_name",
    "topic_matches",
    "validate_topic_filter",
    "validate_topic_name",
]

SHARE_PREFIX: Final = "$share/"
_MAX_BYTES: Final = 65535


def _too_long(text: str) -> bool:
    return len(text) > _MAX_BYTES // 4 and len(text.encode("utf-8", "surrogatepass")) > _MAX_BYTES


def validate_topic_name(topic: str) -> None:
    """Raise :class:`TopicError` (0x90) unless ``topic`` is a valid PUBLISH topic name."""
    if not topic:
        raise TopicError("empty topic name", reason_code=ReasonCode.TOPIC_NAME_INVALID)
    if "+" in topic or "#" in topic:
        raise TopicError("wildcard in topic name", reason_code=ReasonCode.TOPIC_NAME_INVALID)
    if "\x00" in topic:
        raise TopicError("U+0000 in topic name", reason_code=ReasonCode.TOPIC_NAME_INVALID)
    if _too_long(topic):
        raise TopicError("topic name longer than 65535 bytes",
                         reason_code=ReasonCode.TOPIC_NAME_INVALID)


def _filter_error(message: str) -> TopicError:
    return TopicError(message, reason_code=ReasonCode.TOPIC_FILTER_INVALID)


def validate_topic_filter(topic_filter: str, *, protocol_level: int = 5) -> None:
    """Raise :class:`TopicError` (0x8F) unless ``topic_filter`` is a valid filter.

    With ``protocol_level`` 5, ``$share/...`` must be a well-formed shared
    subscription (in 3.1.1 it is an ordinary filter).
    """
    if not topic_filter:
        raise _filter_error("empty topic filter")
    if "\x00" in topic_filter:
        raise _filter_error("U+0000 in topic filter")
    if _too_long(topic_filter):
        raise _filter_error("topic filter longer than 65535 bytes")
    if "+" in topic_filter or "#" in topic_filter:
        levels = topic_filter.split("/")
        last = len(levels) - 1
        for i, level in enumerate(levels):
            if "#" in level and (level != "#" or i != last):
                raise _filter_error("'#' must be the whole last level of a topic filter")
            if "+" in level and level != "+":
                raise _filter_error("'+' must be a whole level of a topic filter")
    if protocol_level >= 5 and topic_filter.startswith(SHARE_PREFIX):
        _, _, rest = topic_filter.partition("/")
        group, sep, inner = rest.partition("/")
        if not group or "+" in group or "#" in group:
            raise _filter_error("invalid share name in shared subscription")
        if not sep or not inner:
            raise _filter_error("shared subscription without a topic filter")


def is_shared(topic_filter: str) -> tuple[str, str] | None:
    """``(group, filter)`` for ``$share/group/filter``, else None (also when malformed)."""
    if not topic_filter.startswith(SHARE_PREFIX):
        return None
    group, sep, inner = topic_filter[len(SHARE_PREFIX):].partition("/")
    if not group or not sep or not inner or "+" in group or "#" in group:
        return None
    return group, inner


def topic_matches(topic_filter: str, topic: str) -> bool:
    """MQTT matching of a topic name against a (non-shared) filter."""
    if topic_filter == topic:
        return True
    if topic_filter[:1] in ("+", "#") and topic.startswith("$"):
        return False
    flevels = topic_filter.split("/")
    tlevels = topic.split("/")
    for i, f in enumerate(flevels):
        if f == "#":
            return True
        if i >= len(tlevels):
            return False
        if f != "+" and f != tlevels[i]:
            return False
    return len(flevels) == len(tlevels)


# ------------------------------------------------------------------ destination mapping
# "raw" text: a level's meaning, spelt with '/' where MQTT shows '.', and with
# every character literal. Segment text = _enc_seg(raw); level text = swap of _enc_lvl(raw).

_SEG_CODES: Final = {"*": "%2A", ">": "%3E", ",": "%2C"}
_SEG_DECODE: Final = {"2A": "*", "3E": ">", "2C": ",", "25": "%"}
_LVL_CODES: Final = {"+": "%2B", "#": "%23"}
_LVL_DECODE: Final = {"2B": "+", "23": "#", "25": "%"}
_EMPTY_SEGMENT: Final = "%00"

_SEG_ENC: Final = re.compile(r"[*>,]|%(?=(?:25)*(?:2A|3E|2C))|\A%(?=(?:25)*00\Z)")
_SEG_DEC: Final = re.compile(r"%(?=(?:25)*(?:2A|3E|2C))(2A|3E|2C|25)")
_SEG_EMPTY_LIKE: Final = re.compile(r"%(?:25)*00")
_LVL_ENC: Final = re.compile(r"[+#]|%(?=(?:25)*(?:2B|23))")
_LVL_DEC: Final = re.compile(r"%(?=(?:25)*(?:2B|23))(2B|23|25)")


def _enc_seg_char(m: re.Match[str]) -> str:
    return _SEG_CODES.get(m.group(), "%25")


def _enc_lvl_char(m: re.Match[str]) -> str:
    return _LVL_CODES.get(m.group(), "%25")


def _level_to_segment(level: str) -> str:
    if not level:
        return _EMPTY_SEGMENT
    if "%" in level:
        level = _LVL_DEC.sub(lambda m: _LVL_DECODE[m.group(1)], level)
    raw = level.replace(".", "/")
    if "*" in raw or ">" in raw or "," in raw or "%" in raw:
        return _SEG_ENC.sub(_enc_seg_char, raw)
    return raw


def _segment_to_level(segment: str) -> str:
    raw = segment
    if "%" in segment:
        if _SEG_EMPTY_LIKE.fullmatch(segment):
            # "%00" is the empty level; "%25...00" is a literal '%' then text.
            return "" if segment == _EMPTY_SEGMENT else _segment_to_level_raw("%" + segment[3:])
        raw = _SEG_DEC.sub(lambda m: _SEG_DECODE[m.group(1)], segment)
    return _segment_to_level_raw(raw)


def _segment_to_level_raw(raw: str) -> str:
    if "+" in raw or "#" in raw or "%" in raw:
        raw = _LVL_ENC.sub(_enc_lvl_char, raw)
    return raw.replace("/", ".")


_TOPIC_SPECIAL: Final = re.compile(r"[.*>,%]|//|\A/|/\Z")


@lru_cache(maxsize=8192)
def mqtt_topic_to_destination_name(topic: str) -> str:
    """The destination name (``a.b.c``) for a valid MQTT topic name (``a/b/c``).

    The caller validates the topic first (the decoder already has).
    """
    if not _TOPIC_SPECIAL.search(topic):
        return topic.replace("/", ".")
    return ".".join([_level_to_segment(level) for level in topic.split("/")])


@lru_cache(maxsize=8192)
def destination_name_to_mqtt_topic(name: str) -> str:
    """The MQTT topic name for a concrete destination name; inverse of the above.

    Raises :class:`DestinationError` for names no MQTT topic maps to: wildcards,
    empty segments, U+0000, ',' and the lone segment ``%00`` (the empty topic).
    """
    if not _NAME_SPECIAL.search(name) and name:
        return name.replace(".", "/")
    if not name or name == _EMPTY_SEGMENT:
        raise DestinationError(f"destination {name!r} has no MQTT topic name")
    if "\x00" in name or "," in name:
        raise DestinationError(f"destination {name!r} contains U+0000 or ','")
    _check_segments(name)
    return "/".join([_segment_to_level(segment) for segment in name.split(".")])


_NAME_SPECIAL: Final = re.compile(r"[/+#%*>,\x00]|\.\.|\A\.|\.\Z")


def _check_segments(name: str) -> None:
    for segment in name.split("."):
        if not segment:
            raise DestinationError(f"destination {name!r} has an empty segment")
        if "*" in segment or ">" in segment:
            raise DestinationError(f"destination {name!r} is a wildcard, not a name")


class DestinationFilter(NamedTuple):
    """A subscription's destination patterns for one MQTT topic filter.

    A topic matches the filter iff its destination name matches ``pattern`` or
    ``parent_pattern`` (when not None), except that when ``exclude_dollar_topics``
    is true, names whose first segment starts with ``$`` never match.
    """

    pattern: str
    parent_pattern: str | None
    exclude_dollar_topics: bool


@lru_cache(maxsize=4096)
def mqtt_filter_to_destination(topic_filter: str) -> DestinationFilter:
    """Map a valid, non-shared MQTT topic filter (strip ``$share/group/`` first)."""
    levels = topic_filter.split("/")
    segments = ["*" if lvl == "+" else ">" if lvl == "#" else _level_to_segment(lvl)
                for lvl in levels]
    pattern = ".".join(segments)
    parent = ".".join(segments[:-1]) if len(levels) > 1 and levels[-1] == "#" else None
    return DestinationFilter(pattern, parent, levels[0] in ("+", "#"))


def destination_pattern_to_mqtt_filter(pattern: str) -> str:
    """The MQTT filter for a destination pattern (``*`` -> ``+``, ``>`` -> ``#``).

    ``a.>`` gives ``a/#``, which also matches ``a``: a superset of the pattern.
    """
    segments = pattern.split(".")
    if not pattern or "" in segments:
        raise DestinationError(f"destination pattern {pattern!r} has an empty segment")
    if ">" in segments[:-1]:
        raise DestinationError(f"'>' must be the last segment in {pattern!r}")
    if "\x00" in pattern:
        raise DestinationError("destination pattern contains U+0000")
    if pattern == _EMPTY_SEGMENT:
        raise DestinationError(f"destination {pattern!r} has no MQTT topic name")
    levels = []
    for segment in segments:
        if segment == "*":
            levels.append("+")
        elif segment == ">":
            levels.append("#")
        elif "*" in segment or ">" in segment:
            raise DestinationError(f"wildcard must be a whole segment in {pattern!r}")
        else:
            levels.append(_segment_to_level(segment))
    return "/".join(levels)
