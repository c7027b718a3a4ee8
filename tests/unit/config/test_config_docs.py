"""docs/config.md must document every option of the model, with its current default."""

import dataclasses
import inspect
import re
import typing
from pathlib import Path

from meshmq.config import model
from meshmq.config.sizes import format_size
from meshmq.config.toml_loader import SIZE_FIELDS, option_key

DOC = Path(__file__).parents[3] / "docs" / "config.md"

# Where each dataclass lives in a TOML file. A new dataclass in model.py fails
# test_every_dataclass_has_a_place until it is given a section here and in the docs.
PREFIX: dict[type, str | tuple[str, ...]] = {
    model.BrokerConfig: "broker", model.ListenerConfig: "listeners[]",
    model.StompConfig: "stomp", model.StoreConfig: "store",
    model.DestinationPolicy: "policies[]", model.UsageConfig: "usage",
    model.AuthConfig: "auth", model.User: "auth.users[]",
    model.CertificateUser: "auth.certificate_users[]",
    model.ManagementConfig: "management", model.MqttConfig: "mqtt",
    model.MetricsConfig: "management.metrics",
    model.LoggingConfig: "logging",
    model.TraceConfig: "trace", model.StreamPolicy: "streams[]",
    model.NetworkConnectorConfig: "network_connectors[]",
    model.HaConfig: "ha", model.ShardsConfig: "shards",
    model.AuthorizationConfig: "auth.authorization",
    model.AuthorizationEntry: "auth.authorization.entries[]",
    model.AuthorizationRights: ("auth.authorization.default", "auth.authorization.temp"),
}
NOT_OPTIONS = {"BrokerConfig.source", "HaConfig.implicit"}  # set by loaders, not users
EXTRA_KEYS = {"listeners[].url"}  # accepted by the loader without being a field


def documented() -> dict[str, str]:
    """Option key -> its Default cell, from rows like ``| `stomp.max_headers` | int | `1000` |``."""
    rows = {}
    for line in DOC.read_text().splitlines():
        m = re.match(r"\|\s*`([^`]+)`\s*\|[^|]*\|\s*([^|]*?)\s*\|", line)
        if m:
            rows[m.group(1)] = m.group(2)
    return rows


def options() -> dict[str, tuple[type, dataclasses.Field[typing.Any]]]:
    out = {}
    for cls, prefixes in PREFIX.items():
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            inner = [a for a in typing.get_args(hints[f.name]) if a is not type(None)]
            nested = dataclasses.is_dataclass(hints[f.name]) or (
                cls is model.BrokerConfig and typing.get_origin(hints[f.name]) is tuple) or (
                len(inner) == 1 and dataclasses.is_dataclass(inner[0]))  # X | None
            if f"{cls.__name__}.{f.name}" in NOT_OPTIONS or nested:
                continue  # sections are documented through their own fields
            for prefix in (prefixes,) if isinstance(prefixes, str) else prefixes:
                out[f"{prefix}.{option_key(cls, f.name)}"] = (cls, f)
    return out


def render_default(cls: type, f: dataclasses.Field[typing.Any]) -> str | None:
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
    else:
        return "(required)"
    if value is None:
        return "(unset)"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if f"{cls.__name__}.{f.name}" in SIZE_FIELDS and value:
        return f'`"{format_size(value)}"`'
    if isinstance(value, int | float):
        return f"`{value}`"
    if isinstance(value, str | Path):
        return f'`"{value}"`'
    if isinstance(value, dict) and not value:
        return "`{}`"
    if isinstance(value, tuple):
        items = ", ".join(f'"{v}"' if isinstance(v, str) else str(v) for v in value)
        return f"`[{items}]`"
    return None


def test_every_dataclass_has_a_place() -> None:
    classes = {obj for _, obj in inspect.getmembers(model, inspect.isclass)
               if dataclasses.is_dataclass(obj) and obj.__module__ == model.__name__}
    assert classes == set(PREFIX)


def test_every_option_is_documented_with_its_default() -> None:
    rows = documented()
    missing = sorted(set(options()) - set(rows))
    assert not missing, f"docs/config.md lacks rows for: {missing}"
    wrong = {key: (rows[key], render_default(cls, f)) for key, (cls, f) in options().items()
             if rows[key] != render_default(cls, f)}
    assert not wrong, f"docs/config.md defaults out of date (documented, actual): {wrong}"


def test_docs_name_no_stale_options() -> None:
    stale = sorted(set(documented()) - set(options()) - EXTRA_KEYS)
    assert not stale, f"docs/config.md documents options that do not exist: {stale}"


def test_sections_are_headed() -> None:
    text = DOC.read_text()
    for section in ("[broker]", "[[listeners]]", "[stomp]", "[store]", "[[policies]]",
                    "[usage]", "[auth]", "[[auth.users]]", "[management]",
                    "[[network_connectors]]"):
        assert f"`{section}`" in text
