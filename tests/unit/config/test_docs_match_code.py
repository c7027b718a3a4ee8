"""What docs/config.md says the activemq.xml importer does with a transport scheme or a
<broker> child is what it does, in both directions; client URIs in the docs use the ports
of examples/meshmq.toml."""

from __future__ import annotations

import logging
import re
import tomllib
from pathlib import Path

import pytest

from meshmq.config import activemq_xml
from meshmq.config.activemq_xml import loads_activemq_xml
from meshmq.errors import ConfigError

ROOT = Path(__file__).parents[3]
CONFIG_MD = (ROOT / "docs" / "config.md").read_text()


def _mapped_schemes() -> dict[str, str]:
    """Scheme -> protocol, from the activemq.xml cell of the ``listeners[].protocol`` row
    (``\\`stomp\\`, \\`stomp+nio\\` → \\`stomp\\`; \\`ws\\`, \\`wss\\`; ...``)."""
    row = next(line for line in CONFIG_MD.splitlines()
               if line.startswith("| `listeners[].protocol`"))
    cell = row.rstrip(" |").rsplit("|", 1)[1].removeprefix(" uri scheme:")
    out: dict[str, str] = {}
    for group in cell.split(";"):
        names, _, target = group.partition("→")
        schemes = re.findall(r"`([^`]+)`", names)
        for scheme in schemes:
            out[scheme] = target.strip(" `") if target else scheme
    return out


def _later_schemes() -> set[str]:
    """The ``xxx://`` connectors listed under "A later feature"."""
    start = CONFIG_MD.index("3. **A later feature**")
    item = CONFIG_MD[start:CONFIG_MD.index("4. **Unknown**", start)]
    return set(re.findall(r"`([a-z+]+)://`", item))


PEM = Path(__file__).parent / "docs-test-cert.pem"  # named, never opened by the loader


def _load(scheme: str, caplog: pytest.LogCaptureFixture) -> tuple[list[str], list[str]]:
    """(listener protocols, warnings) of a file with one connector of ``scheme``."""
    caplog.clear()
    xml = (f'<beans><broker><sslContext><sslContext keyStore="{PEM}"/></sslContext>'
           f'<transportConnectors><transportConnector name="c" '
           f'uri="{scheme}://127.0.0.1:1234"/></transportConnectors></broker></beans>')
    with caplog.at_level(logging.WARNING, "meshmq.config"):
        try:
            config = loads_activemq_xml(xml, file="a.xml")
        except ConfigError as exc:
            return [], [f"error: {exc}"]
    return ([lst.protocol for lst in config.listeners],
            [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING])


def test_the_docs_list_schemes() -> None:
    assert {"stomp", "mqtt", "ws", "tcp"} <= set(_mapped_schemes())
    assert "amqp" in _later_schemes()


def test_every_scheme_documented_as_mapped_is_mapped_as_documented(
        caplog: pytest.LogCaptureFixture) -> None:
    for scheme, protocol in _mapped_schemes().items():
        protocols, _ = _load(scheme, caplog)
        assert protocols == [protocol], f"docs map {scheme}:// to {protocol}"


def test_every_scheme_documented_as_later_is_warned_and_ignored(
        caplog: pytest.LogCaptureFixture) -> None:
    mapped = set(_mapped_schemes())
    for scheme in _later_schemes():
        assert scheme not in mapped, f"{scheme}:// documented as both mapped and later"
        protocols, warned = _load(scheme, caplog)
        assert protocols == [], f"{scheme}:// is documented as a later feature but is mapped"
        assert any(f"{scheme}:// transport connectors are not supported yet" in w
                   for w in warned), (scheme, warned)


def test_every_scheme_the_importer_knows_is_documented(
        caplog: pytest.LogCaptureFixture) -> None:
    """The reverse direction: a scheme the importer maps (or warns about as later) must
    be in the matching docs list. Candidates are every scheme either side names."""
    mapped, later = _mapped_schemes(), _later_schemes()
    candidates = set(activemq_xml._SCHEMES) | set(activemq_xml._LATER_SCHEMES) | set(
        mapped) | later
    for scheme in sorted(candidates):
        protocols, warned = _load(scheme, caplog)
        if protocols:
            assert mapped.get(scheme) == protocols[0], (
                f"{scheme}:// is mapped to {protocols[0]} but docs/config.md says "
                f"{mapped.get(scheme, 'nothing')}")
        elif any("not supported yet" in w for w in warned):
            assert scheme in later, f"{scheme}:// is a later feature, not documented so"


@pytest.mark.parametrize("kind", ["ignored", "later"])
def test_broker_children_documented_as_ignored_or_later_are_warned(
        kind: str, caplog: pytest.LogCaptureFixture) -> None:
    start = CONFIG_MD.index("2. **Known but ignored**" if kind == "ignored"
                            else "3. **A later feature**")
    item = CONFIG_MD[start:CONFIG_MD.index("3. **" if kind == "ignored" else "4. **", start)]
    # Where a documented name sits in activemq.xml (default: directly in <broker>).
    wrappers = {"levelDB": "persistenceAdapter", "mKahaDB": "persistenceAdapter",
                "authorizationPlugin": "plugins", "ldapNetworkConnector": "networkConnectors",
                "storeUsage": "systemUsage><systemUsage", "tempUsage": "systemUsage><systemUsage",
                "pendingMessageLimitStrategy": "destinationPolicy><policyMap><policyEntries>"
                                               '<policyEntry queue=">"'}
    names = [n for n in re.findall(r"`([a-z][A-Za-z]+)`", item) if n not in ("kahaDB",)]
    assert len(names) >= 3
    for name in names:
        caplog.clear()
        if kind == "ignored":
            xml = f'<beans><broker {name}="true"/></beans>'
        else:
            outer = wrappers.get(name, "")
            opened = f"<{outer}>" if outer else ""
            closed = "".join(f"</{t.split()[0]}>" for t in reversed(outer.split("><"))
                             ) if outer else ""
            xml = f"<beans><broker>{opened}<{name}/>{closed}</broker></beans>"
        with caplog.at_level(logging.WARNING, "meshmq.config"):
            loads_activemq_xml(xml, file="a.xml")
        expected = ("is ignored by meshmq" if kind == "ignored"
                    else f"<{name}> is not supported yet, ignored")
        assert any(expected in r.getMessage() for r in caplog.records), (name, kind)


def test_client_uris_in_the_docs_use_the_example_ports() -> None:
    example = tomllib.loads((ROOT / "examples" / "meshmq.toml").read_text())
    ports: dict[str, int] = {}
    for lst in example["listeners"]:
        if "url" in lst:
            scheme, _, rest = lst["url"].partition("://")
            ports[scheme] = int(rest.rpartition(":")[2])
        else:
            ports[lst["protocol"]] = lst["port"]
    assert {"stomp", "stomp+ssl", "mqtt", "ws"} <= set(ports)
    wrong = []
    for doc in ("client.md", "config.md", "networks.md", "ha.md"):
        text = (ROOT / "docs" / doc).read_text()
        for scheme, port in re.findall(r"\b(stomp\+ssl|stomp|mqtt|ws)://[\w.-]+:(\d+)",
                                       text):
            if int(port) >= 100 and int(port) != ports[scheme]:
                wrong.append(f"{doc}: {scheme}://...:{port} (examples/meshmq.toml: "
                             f"{ports[scheme]})")
    assert not wrong, wrong
