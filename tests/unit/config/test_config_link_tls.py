"""TLS and link-authentication options: validation in TOML, and what the activemq.xml
importer makes of ssl:// connectors, <sslContext> and a missing authentication plugin."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.unit.config.test_config_activemq_xml import load as load_xml

from meshmq.config.toml_loader import loads_toml
from meshmq.errors import ConfigError

REPLICATED = ('[ha]\nmode = "replicated"\nlisten = "127.0.0.1:1"\n'
              'members = ["127.0.0.1:2", "127.0.0.1:3"]\n')


@pytest.mark.parametrize(("text", "option", "reason"), [
    ("[[listeners]]\nurl = 'ssl://h:1'\nssl_certfile = 'c.pem'\nssl_ciphers = 'NOPE'\n",
     "listeners[0].ssl_ciphers", "selects no cipher"),
    ("[[network_connectors]]\nuri = 'ssl://h:1'\nssl_ciphers = 'NOPE'\n",
     "network_connectors[0].ssl_ciphers", "selects no cipher"),
    (REPLICATED + "ssl_certfile = 'c.pem'\nssl_ciphers = 'NOPE'\n", "ha.ssl_ciphers",
     "selects no cipher"),
    (REPLICATED + "ssl_cafile = 'ca.pem'\n", "ha.ssl_certfile", "needs ssl_certfile"),
    ("[[network_connectors]]\nuri = 'ssl://h:1'\nssl_keyfile = 'k.pem'\n",
     "network_connectors[0].ssl_keyfile", "needs ssl_certfile"),
    ("[[listeners]]\nurl = 'stomp://h:1'\nallow_anonymous_links = true\n",
     "listeners[0].allow_anonymous_links", "applies to listeners of broker links"),
    ("[[network_connectors]]\nuri = 'ssl://h:1?verifyHostName=maybe'\n",
     "network_connectors[0].uri", "is not true or false"),
], ids=["listener-ciphers", "connector-ciphers", "ha-ciphers", "ha-ca-without-cert",
        "key-without-cert", "anonymous-links-on-stomp", "verify-host-name"])
def test_bad_tls_options_name_the_option(text: str, option: str, reason: str) -> None:
    with pytest.raises(ConfigError) as info:
        loads_toml(text, file="b.toml")
    assert info.value.option == option and reason in info.value.reason


def test_good_tls_options_load() -> None:
    config = loads_toml("[[listeners]]\nurl = 'ssl://h:1'\nssl_certfile = 'c.pem'\n"
                        "ssl_ciphers = 'ECDHE+AESGCM'\nclient_auth = 'want'\n"
                        "ssl_cafile = 'ca.pem'\n"
                        "[[network_connectors]]\nuri = 'ssl://h:2?verifyHostName=false'\n"
                        "ssl_cafile = 'ca.pem'\n", base_dir=Path("/etc/m"))
    listener = config.listeners[0]
    assert (listener.protocol, listener.ssl_ciphers, listener.client_auth,
            listener.allow_anonymous_links) == ("ssl", "ECDHE+AESGCM", "want", False)
    assert config.network_connectors[0].ssl_cafile == Path("/etc/m/ca.pem")


BRIDGES = """\
<transportConnectors>
  <transportConnector name="links" uri="tcp://0.0.0.0:61616"/>
  <transportConnector name="tls-links" uri="ssl://0.0.0.0:61617"/>
</transportConnectors>
<networkConnectors>
  <networkConnector name="out" uri="static:(ssl://hub:61617?verifyHostName=false)"/>
  <networkConnector name="plain" uri="static:(tcp://hub:61616)"/>
</networkConnectors>
"""


def test_importer_gives_ssl_connectors_the_ssl_context_and_keeps_open_links(
        tmp_path: Path) -> None:
    config = load_xml(tmp_path, BRIDGES + '<sslContext><sslContext keyStore="broker.pem" '
                      'trustStore="ca.pem"/></sslContext>\n')
    out, plain = config.network_connectors
    assert (out.ssl_certfile, out.ssl_keyfile, out.ssl_cafile) == (
        tmp_path / "broker.pem", tmp_path / "broker.pem", tmp_path / "ca.pem")
    assert plain.ssl_certfile is None
    # No authentication plugin: ActiveMQ admits anybody, and so does the import (loudly).
    assert [lst.allow_anonymous_links for lst in config.listeners] == [True, True]


def test_importer_closes_links_with_an_authentication_plugin(tmp_path: Path) -> None:
    config = load_xml(tmp_path, BRIDGES.replace("<networkConnectors>", """\
<plugins><simpleAuthenticationPlugin><users>
  <authenticationUser username="hub" password="p" groups="network"/>
</users></simpleAuthenticationPlugin></plugins>
<networkConnectors>""") + '<sslContext><sslContext keyStore="b.pem"/></sslContext>\n')
    assert [lst.allow_anonymous_links for lst in config.listeners] == [False, False]


def test_a_java_keystore_that_tls_needs_is_an_error_saying_how_to_convert(
        tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_xml(tmp_path, BRIDGES + '<sslContext><sslContext keyStore="broker.ks" '
                 'keyStorePassword="x"/></sslContext>\n')
    err = info.value
    assert err.file == str(tmp_path / "activemq.xml") and err.line is not None
    assert "keyStore 'broker.ks' is a Java keystore" in err.reason
    assert "keytool -importkeystore" in err.reason and "openssl pkcs12" in err.reason
