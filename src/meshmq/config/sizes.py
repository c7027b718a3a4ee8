"""Byte sizes written the way ActiveMQ and humans write them: ``"64 mb"``, ``"1gb"``.

Units are binary (``1 kb`` = 1024 bytes) because ActiveMQ's ``memoryLimit="64 mb"``
means 64 MiB; accepting ``mib`` too keeps both camps happy. Fractions are allowed
(``"1.5 gb"``) and rounded down to whole bytes.
"""

from __future__ import annotations

import re

_UNITS = {
    "": 1, "b": 1, "byte": 1, "bytes": 1,
    "k": 1024, "kb": 1024, "kib": 1024,
    "m": 1024**2, "mb": 1024**2, "mib": 1024**2,
    "g": 1024**3, "gb": 1024**3, "gib": 1024**3,
    "t": 1024**4, "tb": 1024**4, "tib": 1024**4,
}
_SIZE_RE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([A-Za-z]*)\s*")


def parse_size(value: str | int) -> int:
    """Return ``value`` in bytes; raise ``ValueError`` with a readable reason.

    Integers pass through (a TOML ``memory_limit = 1048576``); negative sizes are
    rejected here so every caller gets the same message.
    """
    if isinstance(value, bool):  # bool is an int subclass; True is not a size
        raise ValueError(f"expected a size like '64 mb', got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"size must be >= 0, got {value}")
        return value
    m = _SIZE_RE.fullmatch(value)
    if m is None:
        raise ValueError(f"not a size: {value!r} (expected e.g. '64 mb', '1 gb', '512 kb')")
    number, unit = m.group(1), m.group(2).lower()
    if unit not in _UNITS:
        raise ValueError(f"unknown size unit {m.group(2)!r} in {value!r} (use b, kb, mb, gb or tb)")
    if "." in number:
        return int(float(number) * _UNITS[unit])
    return int(number) * _UNITS[unit]


def format_size(size: int) -> str:
    """The shortest exact spelling of ``size``: 104857600 -> ``"100 mb"``."""
    for unit in ("tb", "gb", "mb", "kb"):
        factor = _UNITS[unit]
        if size >= factor and size % factor == 0:
            return f"{size // factor} {unit}"
    return f"{size} b"
