"""The broker's log as ``[logging]`` asks: levels (overall and per logger), stderr or a
rotating file, human-readable lines or JSON lines for log shippers.

``meshmq`` starts with human-readable lines on stderr (before any configuration is read,
so a configuration error is still reported); :func:`apply_logging` then replaces that
handler. ``--log-level`` on the command line wins over ``[logging] level``.
"""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import logging.handlers
import signal
import sys

from pythonjsonlogger.json import JsonFormatter

from meshmq.config.model import LoggingConfig
from meshmq.errors import ConfigError

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# JSON lines: these record attributes, under shorter names.
_JSON_FIELDS = "%(asctime)s %(levelname)s %(name)s %(message)s"
_JSON_NAMES = {"asctime": "time", "levelname": "level", "name": "logger"}


def start_logging(level: str) -> None:
    """The log before any configuration is read: text lines on stderr."""
    logging.basicConfig(level=level.upper(), format=TEXT_FORMAT)


def enable_stack_dumps() -> None:
    """SIGUSR1 writes the Python stack of every thread to stderr, and the process goes
    on: a broker that does not stop, or seems stuck, shows where it waits (the test
    harness asks so before it kills a broker that outlived its stop timeout)."""
    with contextlib.suppress(AttributeError, ValueError, RuntimeError, OSError):
        faulthandler.register(signal.SIGUSR1, all_threads=True)


def formatter(config: LoggingConfig) -> logging.Formatter:
    if config.format == "json":
        return JsonFormatter(_JSON_FIELDS, rename_fields=_JSON_NAMES)
    return logging.Formatter(TEXT_FORMAT)


def apply_logging(config: LoggingConfig, cli_level: str | None, source: str | None) -> None:
    """Route the root logger as ``config`` says. ``source`` names the configuration
    file in errors (a log file that cannot be opened)."""
    handler: logging.Handler
    if config.file is not None:
        try:
            # maxBytes=0: RotatingFileHandler never rotates.
            handler = logging.handlers.RotatingFileHandler(
                config.file, maxBytes=config.max_file_bytes,
                backupCount=config.backup_count, encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"cannot open the log file {config.file}: "
                              f"{exc.strerror or exc}", file=source,
                              option="logging.file") from None
    else:
        handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter(config))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    root.setLevel((cli_level or config.level).upper())
    for name, level in config.loggers.items():
        logging.getLogger(name).setLevel(level.upper())
