"""JAAS ``login.config`` files, for the activemq.xml JAAS authentication plugins.

A broker started from ``conf/activemq.xml`` finds ``login.config`` in the same
directory (``bin/activemq`` points ``java.security.auth.login.config`` there, and
the conf directory is on the class path). Its entries read::

    activemq {
        org.apache.activemq.jaas.PropertiesLoginModule required
            org.apache.activemq.jaas.properties.user="users.properties"
            org.apache.activemq.jaas.properties.group="groups.properties";
    };

``//`` and ``/* */`` are comments. meshmq reads three login modules and turns them
into ``[auth]`` options; anything else is a ``ConfigError`` naming file and line.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from meshmq.config.credential_files import ENC_ADVICE
from meshmq.errors import ConfigError

log = logging.getLogger("meshmq.config")

PROPERTIES_MODULE = "org.apache.activemq.jaas.PropertiesLoginModule"
GUEST_MODULE = "org.apache.activemq.jaas.GuestLoginModule"
CERTIFICATE_MODULE = "org.apache.activemq.jaas.TextFileCertificateLoginModule"
_FLAGS = ("required", "requisite", "sufficient", "optional")
_TOKEN = re.compile(r'\s+|//[^\n]*|/\*.*?\*/|"((?:[^"\\]|\\.)*)"|([{};=])|([^\s{};="]+)',
                    re.DOTALL)
_COMMON_IGNORED = frozenset({"debug"})


@dataclass(frozen=True, slots=True)
class LoginModule:
    name: str
    flag: str
    line: int
    options: dict[str, str] = field(default_factory=dict)
    option_lines: dict[str, int] = field(default_factory=dict)


def _tokens(text: str, file: str) -> list[tuple[str, int, bool]]:
    """(text, line, quoted) for each token."""
    out: list[tuple[str, int, bool]] = []
    pos, line = 0, 1
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise ConfigError(f"cannot read {text[pos]!r} here", file=file, line=line)
        if m.group(1) is not None:
            out.append((re.sub(r"\\(.)", r"\1", m.group(1)), line, True))
        elif m.group(2) is not None or m.group(3) is not None:
            out.append((m.group(2) or m.group(3), line, False))
        line += m.group(0).count("\n")
        pos = m.end()
    return out


def parse_login_config(text: str, file: str) -> dict[str, tuple[int, list[LoginModule]]]:
    """Entry name -> (line, its login modules in order)."""
    toks = _tokens(text, file)
    entries: dict[str, tuple[int, list[LoginModule]]] = {}
    i = 0

    def expect(what: str) -> tuple[str, int, bool]:
        nonlocal i
        if i >= len(toks):
            raise ConfigError(f"unexpected end of file: expected {what}", file=file,
                              line=toks[-1][1] if toks else 1)
        tok = toks[i]
        i += 1
        return tok

    while i < len(toks):
        name, line, _ = expect("an entry name")
        if expect("'{'")[0] != "{":
            raise ConfigError(f"expected '{{' after entry name {name!r}", file=file, line=line)
        modules: list[LoginModule] = []
        while True:
            tok, tline, quoted = expect("a login module or '}'")
            if tok == "}" and not quoted:
                break
            flag, fline, _ = expect("a control flag")
            if flag.lower() not in _FLAGS:
                raise ConfigError(f"login module {tok}: control flag must be one of "
                                  f"{', '.join(_FLAGS)}, not {flag!r}", file=file, line=fline)
            module = LoginModule(tok, flag.lower(), tline)
            while True:
                key, kline, kquoted = expect("an option or ';'")
                if key == ";" and not kquoted:
                    break
                if expect("'='")[0] != "=":
                    raise ConfigError(f"expected '=' after option {key!r}", file=file,
                                      line=kline)
                value, _, _ = expect(f"a value for {key!r}")
                module.options[key] = value
                module.option_lines[key] = kline
            modules.append(module)
        end, eline, _ = expect("';' after '}'")
        if end != ";":
            raise ConfigError(f"expected ';' after the '}}' of entry {name!r}", file=file,
                              line=eline)
        entries[name] = (line, modules)
    return entries


@dataclass
class _Reader:
    path: Path
    modules: list[LoginModule]

    def fail(self, message: str, line: int) -> ConfigError:
        return ConfigError(message, file=str(self.path), line=line)

    def check_options(self, module: LoginModule, known: set[str]) -> None:
        for key, line in module.option_lines.items():
            if key in known:
                continue
            if key in _COMMON_IGNORED:
                continue
            log.warning("%s:%d: login module option %r is ignored by meshmq", self.path, line,
                        key)

    def file_option(self, module: LoginModule, key: str, default: str) -> Path:
        base = self.path.parent
        if "baseDir" in module.options:
            base = base / module.options["baseDir"]
        value = module.options.get(key, default)
        line = module.option_lines.get(key, module.line)
        target = base / value
        if not target.is_file():
            raise self.fail(f"{key}: cannot read {target}: no such file", line)
        return target

    def reload(self, module: LoginModule) -> bool:
        return module.options.get("reload", "false").strip().lower() == "true"


def _read(login_config: Path, entry: str) -> _Reader:
    try:
        text = login_config.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read the JAAS login configuration {login_config}: "
                          f"{exc.strerror}") from None
    entries = parse_login_config(text, str(login_config))
    if entry not in entries:
        raise ConfigError(f"no entry {entry!r} in this JAAS login configuration (entries: "
                          f"{', '.join(entries) or 'none'})", file=str(login_config), line=None)
    return _Reader(login_config, entries[entry][1])


def _unsupported(reader: _Reader, module: LoginModule) -> ConfigError:
    return reader.fail(f"login module {module.name} is not supported by meshmq (it reads "
                       f"{PROPERTIES_MODULE}, {GUEST_MODULE} and {CERTIFICATE_MODULE})",
                       module.line)


def password_options(login_config: Path, entry: str) -> dict[str, Any]:
    """``[auth]`` options for a ``<jaasAuthenticationPlugin configuration=entry>``."""
    reader = _read(login_config, entry)
    out: dict[str, Any] = {"anonymous_access": "false"}
    properties: LoginModule | None = None
    for module in reader.modules:
        short = module.name.rsplit(".", 1)[-1]
        if short == "PropertiesLoginModule":
            if module.options.get("decrypt", "false").strip().lower() == "true":
                raise reader.fail(f"decrypt=true: {ENC_ADVICE}",
                                  module.option_lines["decrypt"])
            _files(reader, module, "org.apache.activemq.jaas.properties",
                   ("users_file", "groups_file"), out, extra={"decrypt"})
            properties = module
        elif short == "GuestLoginModule":
            reader.check_options(module, {"org.apache.activemq.jaas.guest.user",
                                          "org.apache.activemq.jaas.guest.group",
                                          "credentialsInvalidate"})
            out["anonymous_access"] = "true"
            out["anonymous_user"] = module.options.get("org.apache.activemq.jaas.guest.user",
                                                       "guest")
            out["anonymous_groups"] = [module.options.get(
                "org.apache.activemq.jaas.guest.group", "guests")]
            invalidate = module.options.get("credentialsInvalidate", "false").strip().lower()
            if invalidate != "true" and properties is not None:
                log.info("%s:%d: a login that fails %s is refused, not let in as the guest "
                         "(meshmq: a login that is given must be valid)", login_config,
                         module.line, properties.name.rsplit(".", 1)[-1])
        else:
            raise _unsupported(reader, module)
    return out


def _files(reader: _Reader, module: LoginModule, prefix: str, keys: tuple[str, str],
           out: dict[str, Any], *, extra: frozenset[str] | set[str] = frozenset()) -> None:
    """A login module's users and groups files (``<prefix>.user``/``.group``, relative
    to its ``baseDir``) and its ``reload`` option, into ``[auth]`` options ``keys``."""
    reader.check_options(module, {f"{prefix}.user", f"{prefix}.group", "reload", "baseDir",
                                  *extra})
    out[keys[0]] = str(reader.file_option(module, f"{prefix}.user", "user"))
    out[keys[1]] = str(reader.file_option(module, f"{prefix}.group", "group"))
    if reader.reload(module):
        out["reload_files"] = "true"


def certificate_options(login_config: Path, entry: str) -> dict[str, Any]:
    """``[auth]`` options for a certificate entry (``TextFileCertificateLoginModule``)."""
    reader = _read(login_config, entry)
    out: dict[str, Any] = {}
    for module in reader.modules:
        if module.name.rsplit(".", 1)[-1] != "TextFileCertificateLoginModule":
            raise _unsupported(reader, module)
        _files(reader, module, "org.apache.activemq.jaas.textfiledn",
               ("certificate_users_file", "certificate_groups_file"), out)
    if not out:
        raise ConfigError(f"entry {entry!r} names no {CERTIFICATE_MODULE}",
                          file=str(login_config), line=None)
    return out
