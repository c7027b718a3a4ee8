"""config/credential_files.py's CredentialFiles: the credential tables the edge hands
to the core's authenticator, re-read on change."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import pytest

from meshmq.config.credential_files import CredentialFiles, credential_source
from meshmq.config.model import AuthConfig
from meshmq.core.auth import Authenticator
from meshmq.errors import ConfigError


def _touch_later(path: Path, seconds: int) -> None:
    os.utime(path, (time.time() + seconds, time.time() + seconds))


def test_tables_of_users_groups_and_certificate_users(tmp_path: Path) -> None:
    (tmp_path / "u").write_text("alice=one\n")
    (tmp_path / "g").write_text("ops=alice\n")
    (tmp_path / "cu").write_text("robot=/CN=robot-.*/\nexact=CN=x\n")
    (tmp_path / "cg").write_text("machines=robot\n")
    files = CredentialFiles(AuthConfig(
        users_file=tmp_path / "u", groups_file=tmp_path / "g",
        certificate_users_file=tmp_path / "cu", certificate_groups_file=tmp_path / "cg"))
    assert files.password("alice") == "one" and files.password("bob") is None
    assert files.groups("alice") == frozenset({"ops"}) and files.groups("x") == frozenset()
    assert files.passwords() == ["one"]
    assert files.certificate_user("CN=robot-7") == "robot"
    assert files.certificate_user("CN=x") == "exact"
    assert files.certificate_user("CN=y") is None
    assert files.certificate_groups("robot") == frozenset({"machines"})


def test_a_bad_file_keeps_the_last_good_contents_and_is_logged(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    users = tmp_path / "u"
    users.write_text("alice=one\n")
    files = CredentialFiles(AuthConfig(users_file=users, reload_files=True))
    assert not files.refresh()  # unchanged
    users.write_text("alice=ENC(abc)\n")
    _touch_later(users, 5)
    with caplog.at_level(logging.ERROR, logger="meshmq.auth"):
        assert not files.refresh()
    assert files.password("alice") == "one"
    assert "keeping what was read before" in caplog.text
    users.write_text("alice=two\n")
    _touch_later(users, 10)
    assert files.refresh() and files.password("alice") == "two"


def test_without_reload_a_changed_file_is_not_read_again(tmp_path: Path) -> None:
    users = tmp_path / "u"
    users.write_text("alice=one\n")
    files = CredentialFiles(AuthConfig(users_file=users))
    users.write_text("alice=two\n")
    _touch_later(users, 5)
    assert not files.refresh() and files.password("alice") == "one"


def test_the_authenticator_needs_the_files_it_is_configured_with(tmp_path: Path) -> None:
    users = tmp_path / "u"
    users.write_text("alice=one\n")
    config = AuthConfig(users_file=users)
    with pytest.raises(ConfigError):
        Authenticator(config)
    auth = Authenticator(config, credentials=credential_source(config))
    assert auth.authenticate("alice", "one").user == "alice"
    assert credential_source(AuthConfig()) is None
    with pytest.raises(ConfigError, match="cannot read"):
        CredentialFiles(AuthConfig(users_file=tmp_path / "missing"))
