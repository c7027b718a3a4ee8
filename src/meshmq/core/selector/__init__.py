"""JMS SQL-92 message selectors, as ActiveMQ implements them; sans-I/O.

``compile_selector(text)`` parses once (cached) into a ``Selector`` whose
``matches(lookup)`` evaluates pre-built closures; ``message_lookup(msg)`` adapts
a Message (JMS header fields and properties) to that lookup.
"""

from meshmq.core.selector.compiler import (
    MAX_SELECTOR_LENGTH,
    Lookup,
    Selector,
    compile_selector,
)
from meshmq.core.selector.fields import HEADER_FIELDS, message_lookup
from meshmq.core.selector.parser import MAX_DEPTH

__all__ = [
    "HEADER_FIELDS",
    "MAX_DEPTH",
    "MAX_SELECTOR_LENGTH",
    "Lookup",
    "Selector",
    "compile_selector",
    "message_lookup",
]
