"""Java ``.properties`` files, as ``java.util.Properties.load`` reads them.

``#`` or ``!`` starts a comment line; a key ends at the first unescaped ``=``, ``:``
or white space; a line ending in an odd number of backslashes continues on the next
(whose leading white space is dropped); ``\\t \\n \\r \\f \\uXXXX`` are escapes and a
backslash before any other character stands for that character.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_WHITESPACE = " \t\f"
_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}
# Java ends a line only at \n, \r or \r\n (str.splitlines also splits at \f, NEL, ...).
_LINE_END = re.compile(r"\r\n|\r|\n")


class PropertiesError(ValueError):
    def __init__(self, message: str, line: int) -> None:
        super().__init__(message)
        self.line = line


@dataclass(frozen=True, slots=True)
class Entry:
    key: str
    value: str
    line: int  # where the entry starts, counted from 1


def _logical_lines(text: str) -> list[tuple[int, str]]:
    out: list[tuple[int, str]] = []
    pending: str | None = None
    start = 0
    for number, raw in enumerate(_LINE_END.split(text), 1):
        line = raw.lstrip(_WHITESPACE) if pending is not None else raw
        if pending is None:
            stripped = line.lstrip(_WHITESPACE)
            if not stripped or stripped[0] in "#!":
                continue
            start, line = number, stripped
        trailing = len(line) - len(line.rstrip("\\"))
        if trailing % 2:
            pending = (pending or "") + line[:-1]
            continue
        out.append((start, (pending or "") + line))
        pending = None
    if pending is not None:
        out.append((start, pending))
    return out


def _unescape(text: str, line: int) -> str:
    out: list[str] = []
    i = 0
    while i < len(text):
        c = text[i]
        if c != "\\" or i + 1 == len(text):
            out.append(c)
            i += 1
            continue
        nxt = text[i + 1]
        if nxt == "u":
            digits = text[i + 2:i + 6]
            if len(digits) != 4 or any(d not in "0123456789abcdefABCDEF" for d in digits):
                raise PropertiesError("malformed \\uXXXX escape", line)
            out.append(chr(int(digits, 16)))
            i += 6
            continue
        out.append(_ESCAPES.get(nxt, nxt))
        i += 2
    # \uXXXX escapes are UTF-16 code units: a surrogate pair is one character.
    return "".join(out).encode("utf-16-le", "surrogatepass").decode("utf-16-le",
                                                                    "surrogatepass")


def parse_properties(text: str) -> list[Entry]:
    """Entries in file order (a repeated key appears twice; the last one wins in Java)."""
    entries: list[Entry] = []
    for number, line in _logical_lines(text):
        i = 0
        while i < len(line):
            c = line[i]
            if c == "\\":
                i += 2
                continue
            if c in "=:" or c in _WHITESPACE:
                break
            i += 1
        key = line[:i]
        j = i
        while j < len(line) and line[j] in _WHITESPACE:
            j += 1
        if j < len(line) and line[j] in "=:":
            j += 1
            while j < len(line) and line[j] in _WHITESPACE:
                j += 1
        entries.append(Entry(_unescape(key, number), _unescape(line[j:], number), number))
    return entries
