"""The JAAS authentication plugins of activemq.xml, with login.config and its properties
files next to it, and the [auth] file and certificate options in TOML."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from meshmq.config.activemq_xml import load_activemq_xml
from meshmq.config.jaas import parse_login_config
from meshmq.config.model import CertificateUser
from meshmq.config.toml_loader import loads_toml
from meshmq.errors import ConfigError

LOGIN_CONFIG = """\
// as shipped with ActiveMQ, plus a guest and a certificate entry
activemq {
    org.apache.activemq.jaas.PropertiesLoginModule required
        org.apache.activemq.jaas.properties.user="users.properties"
        org.apache.activemq.jaas.properties.group="groups.properties"
        reload=true;
};

guests {
    org.apache.activemq.jaas.GuestLoginModule sufficient
        org.apache.activemq.jaas.guest.user="visitor"
        org.apache.activemq.jaas.guest.group="visitors"
        credentialsInvalidate=true;
    org.apache.activemq.jaas.PropertiesLoginModule requisite
        /* files beside a baseDir */
        baseDir="props"
        org.apache.activemq.jaas.properties.user="u.properties"
        org.apache.activemq.jaas.properties.group="g.properties";
};

ssl {
  org.apache.activemq.jaas.TextFileCertificateLoginModule required
    org.apache.activemq.jaas.textfiledn.user="dn-users.properties"
    org.apache.activemq.jaas.textfiledn.group="dn-groups.properties";
};

ldap {
  org.apache.activemq.jaas.LDAPLoginModule required
    initialContextFactory=com.sun.jndi.ldap.LdapCtxFactory;
};
"""


def conf_dir(tmp_path: Path, plugin: str, login_config: str = LOGIN_CONFIG) -> Path:
    (tmp_path / "login.config").write_text(login_config)
    for name, text in (("users.properties", "system=manager\nuser=password\n"),
                       ("groups.properties", "admins=system\nusers=system,user\n"),
                       ("dn-users.properties", "bob=CN=bob, OU=clients, O=meshmq\n"
                                               "apps=/CN=app.*, OU=clients, O=meshmq/\n"),
                       ("dn-groups.properties", "admins=bob\n")):
        (tmp_path / name).write_text(text)
    (tmp_path / "props").mkdir(exist_ok=True)
    (tmp_path / "props" / "u.properties").write_text("a=b\n")
    (tmp_path / "props" / "g.properties").write_text("g=a\n")
    xml = tmp_path / "activemq.xml"
    xml.write_text(f'<beans>\n<broker brokerName="b">\n<plugins>\n{plugin}\n</plugins>\n'
                   "</broker>\n</beans>\n")
    return xml


def test_login_config_entries_parse() -> None:
    entries = parse_login_config(LOGIN_CONFIG, "login.config")
    assert list(entries) == ["activemq", "guests", "ssl", "ldap"]
    line, modules = entries["guests"]
    assert line == 9
    assert [(m.name.rsplit(".", 1)[-1], m.flag, m.line) for m in modules] == [
        ("GuestLoginModule", "sufficient", 10), ("PropertiesLoginModule", "requisite", 14)]
    assert modules[1].options["baseDir"] == "props"


def test_properties_login_module_import(tmp_path: Path) -> None:
    config = load_activemq_xml(conf_dir(
        tmp_path, '<jaasAuthenticationPlugin configuration="activemq"/>'))
    auth = config.auth
    assert auth.users_file == tmp_path / "users.properties"
    assert auth.groups_file == tmp_path / "groups.properties"
    assert auth.reload_files is True and auth.anonymous_access is False
    assert auth.users == () and auth.certificate_users_file is None


def test_guest_login_module_import(tmp_path: Path) -> None:
    auth = load_activemq_xml(conf_dir(
        tmp_path, '<jaasAuthenticationPlugin configuration="guests"/>')).auth
    assert auth.anonymous_access is True
    assert (auth.anonymous_user, auth.anonymous_groups) == ("visitor", ("visitors",))
    assert auth.users_file == tmp_path / "props" / "u.properties"


def test_certificate_and_dual_plugins(tmp_path: Path) -> None:
    cert = load_activemq_xml(conf_dir(
        tmp_path, '<jaasCertificateAuthenticationPlugin configuration="ssl"/>')).auth
    assert cert.certificate_users_file == tmp_path / "dn-users.properties"
    assert cert.certificate_groups_file == tmp_path / "dn-groups.properties"
    assert cert.users_file is None and cert.anonymous_access is False
    dual = load_activemq_xml(conf_dir(
        tmp_path, '<jaasDualAuthenticationPlugin configuration="activemq" '
                  'sslConfiguration="ssl"/>')).auth
    assert dual.users_file == tmp_path / "users.properties"
    assert dual.certificate_users_file == tmp_path / "dn-users.properties"


def test_unknown_login_module_names_file_and_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        load_activemq_xml(conf_dir(tmp_path, '<jaasAuthenticationPlugin configuration="ldap"/>'))
    assert str(err.value).startswith(f"{tmp_path / 'login.config'}:28:")
    assert "LDAPLoginModule is not supported" in str(err.value)


def test_missing_users_file_names_login_config_line(tmp_path: Path) -> None:
    xml = conf_dir(tmp_path, '<jaasAuthenticationPlugin configuration="activemq"/>')
    (tmp_path / "users.properties").unlink()
    with pytest.raises(ConfigError) as err:
        load_activemq_xml(xml)
    assert str(err.value).startswith(f"{tmp_path / 'login.config'}:4:")
    assert "users.properties" in str(err.value)


def test_missing_entry_and_missing_login_config(tmp_path: Path) -> None:
    xml = conf_dir(tmp_path, '<jaasAuthenticationPlugin configuration="nope"/>')
    with pytest.raises(ConfigError, match=r"no entry 'nope'.*entries: activemq, guests"):
        load_activemq_xml(xml)
    (tmp_path / "login.config").unlink()
    with pytest.raises(ConfigError) as err:
        load_activemq_xml(xml)
    assert str(err.value).startswith(f"{xml}:4, option 'broker/plugins/jaasAuthentication")
    assert "login.config" in str(err.value)


def test_jasypt_is_refused_with_advice(tmp_path: Path) -> None:
    xml = conf_dir(tmp_path, '<jaasAuthenticationPlugin configuration="activemq"/>')
    (tmp_path / "users.properties").write_text("# x\nsystem=ENC(bG9uZ3Bhc3M=)\n")
    with pytest.raises(ConfigError) as err:
        load_activemq_xml(xml)
    assert str(err.value).startswith(f"{tmp_path / 'users.properties'}:2:")
    assert "not supported" in str(err.value) and "meshmq passwd" in str(err.value)
    decrypt = LOGIN_CONFIG.replace("reload=true;", "decrypt=true;")
    with pytest.raises(ConfigError, match=r"login.config:6: decrypt=true: encrypted"):
        load_activemq_xml(conf_dir(tmp_path, '<jaasAuthenticationPlugin '
                                   'configuration="activemq"/>', decrypt))


def test_toml_auth_files_and_certificate_users(tmp_path: Path,
                                               caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "users.properties").write_text("a=b\n")
    caplog.set_level(logging.WARNING)
    config = loads_toml("""\
[auth]
users_file = "users.properties"
login_backoff_max_ms = 0

[[auth.users]]
name = "system"
password = "manager"

[[auth.certificate_users]]
name = "bob"
dn = "CN=bob, OU=clients, O=meshmq"
groups = ["admins"]

[[auth.certificate_users]]
name = "apps"
dn_regex = "CN=app.*"
""", file="m.toml", base_dir=tmp_path)
    assert config.auth.users_file == tmp_path / "users.properties"
    assert config.auth.certificate_users == (
        CertificateUser("bob", dn="CN=bob, OU=clients, O=meshmq", groups=("admins",)),
        CertificateUser("apps", dn_regex="CN=app.*"))
    assert config.auth.login_backoff_max_ms == 0
    assert ("m.toml:7: auth.users[0].password: user 'system' has a clear-text password; "
            "store the line `meshmq passwd` prints instead") in caplog.text


@pytest.mark.parametrize("text, message", [
    ('[auth]\nusers_file = "missing.properties"\n',
     "m.toml:2, option 'auth.users_file': cannot read"),
    ('[[auth.certificate_users]]\nname = "x"\n',
     "m.toml:1, option 'auth.certificate_users[0]': give either 'dn'"),
    ('[[auth.certificate_users]]\nname = "x"\ndn = "a"\ndn_regex = "b"\n',
     "give either 'dn'"),
    ('[[auth.certificate_users]]\nname = "x"\ndn_regex = "("\n',
     "m.toml:3, option 'auth.certificate_users[0].dn_regex': not a regular expression"),
    ('[[auth.users]]\nname = "x"\npassword = "scrypt$1$2"\n',
     "m.toml:3, option 'auth.users[0].password': a password hash reads"),
])
def test_toml_auth_errors(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        loads_toml(text, file="m.toml", base_dir=tmp_path)
    assert message in str(err.value)
