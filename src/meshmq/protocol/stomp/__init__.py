"""Sans-I/O STOMP 1.0/1.1/1.2 codec: frames, incremental parser, encoder, negotiation.

Bytes in (:class:`StompParser`), frames out, bytes back (:func:`encode_frame`,
:func:`encode_message_frame`). Nothing here does I/O or reads a clock.
"""

from .encoder import (
    HEARTBEAT,
    encode_frame,
    encode_header_block,
    encode_message_frame,
    escape_header,
)
from .frames import CLIENT_COMMANDS, OUTCOME_HEADER, SERVER_COMMANDS, Frame
from .negotiation import (
    REQUIRED_HEADERS,
    SUPPORTED_VERSIONS,
    missing_headers,
    negotiate_heartbeat,
    negotiate_version,
    parse_heartbeat,
)
from .parser import StompParser

__all__ = [
    "CLIENT_COMMANDS",
    "HEARTBEAT",
    "OUTCOME_HEADER",
    "REQUIRED_HEADERS",
    "SERVER_COMMANDS",
    "SUPPORTED_VERSIONS",
    "Frame",
    "StompParser",
    "encode_frame",
    "encode_header_block",
    "encode_message_frame",
    "escape_header",
    "missing_headers",
    "negotiate_heartbeat",
    "negotiate_version",
    "parse_heartbeat",
]
