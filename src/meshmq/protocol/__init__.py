"""Sans-I/O protocol codecs (bytes in, events out, bytes back); no asyncio, socket or time."""
