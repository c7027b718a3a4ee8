"""The one entry point: pick the loader from the file name."""

from __future__ import annotations

from pathlib import Path

from meshmq.config.activemq_xml import load_activemq_xml
from meshmq.config.model import BrokerConfig
from meshmq.config.toml_loader import load_toml
from meshmq.errors import ConfigError

__all__ = ["default_config", "load_config"]


def load_config(path: Path | str) -> BrokerConfig:
    """Load ``*.toml`` (native) or ``*.xml`` (an ActiveMQ activemq.xml), validated.

    Raises ``ConfigError`` naming the file, and where known the line and option.
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".toml":
        return load_toml(path)
    if suffix == ".xml":
        return load_activemq_xml(path)
    raise ConfigError(f"unknown config format {path.suffix or '(no suffix)'!r}: "
                      "expected .toml (native) or .xml (activemq.xml)", file=str(path))


def default_config() -> BrokerConfig:
    """The configuration used when no file is given: every option at its default."""
    return BrokerConfig()
