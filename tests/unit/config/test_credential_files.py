"""ActiveMQ's credential files as meshmq reads them: users.properties (clear text or a
``meshmq passwd`` hash), groups.properties and the certificate users file (an exact DN or
``/regex/``). Each bad entry is one ConfigError naming the file and its line."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from meshmq.config.credential_files import (
    CredentialFiles,
    read_certificate_users,
    read_groups,
    read_users,
)
from meshmq.config.model import AuthConfig
from meshmq.core.passwords import hash_password
from meshmq.errors import ConfigError


def write(tmp_path: Path, text: str | bytes, name: str = "file.properties") -> Path:
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return path


def test_users_keep_clear_text_and_hashed_passwords_with_their_lines(tmp_path: Path) -> None:
    hashed = hash_password("s3cret")
    users = read_users(write(tmp_path, f"# users\nalice=one\n\nbob={hashed}\n"))
    assert {name: (e.password, e.line) for name, e in users.items()} == {
        "alice": ("one", 2), "bob": (hashed, 4)}


def test_a_repeated_user_keeps_the_last_password_as_java_does(tmp_path: Path) -> None:
    users = read_users(write(tmp_path, "alice=old\nalice=new\n"))
    assert (users["alice"].password, users["alice"].line) == ("new", 2)


def test_users_files_are_read_as_iso_8859_1(tmp_path: Path) -> None:
    users = read_users(write(tmp_path, "j\xf6rg=p\xe4ss\n".encode("latin-1")))
    assert users["jörg"].password == "päss"


@pytest.mark.parametrize(("text", "line", "words"), [
    pytest.param("alice=one\nbob=ENC(dGVzdA==)\n", 2, "user 'bob': encrypted passwords "
                 "(ENC(...), Jasypt) are not supported", id="jasypt"),
    pytest.param("alice=scrypt$16384$8\n", 1, "user 'alice': ", id="truncated-hash"),
    pytest.param("alice=one\n=nobody\n", 2, "an entry without a user name", id="empty-name"),
])
def test_each_bad_users_entry_names_its_line(tmp_path: Path, text: str, line: int,
                                             words: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        read_users(path)
    assert (info.value.file, info.value.line) == (str(path), line)
    assert words in info.value.reason


def test_a_bad_escape_in_a_credential_file_names_its_line(tmp_path: Path) -> None:
    path = write(tmp_path, "ops=alice\nadmins=\\uZZZZ\n")
    with pytest.raises(ConfigError) as info:
        read_groups(path)
    assert (info.value.file, info.value.line) == (str(path), 2)
    assert "malformed \\uXXXX escape" in info.value.reason


def test_groups_are_turned_into_each_users_groups(tmp_path: Path) -> None:
    groups = read_groups(write(tmp_path, "admins=alice, bob\nops=bob,,carol ,\nnobody=\n"))
    assert groups == {"alice": frozenset({"admins"}), "bob": frozenset({"admins", "ops"}),
                      "carol": frozenset({"ops"})}


def test_certificate_users_match_exact_dns_and_whole_regexes(tmp_path: Path) -> None:
    table = read_certificate_users(write(
        tmp_path, "bob=CN=bob, OU=clients, O=meshmq\nrobots=/CN=robot-[0-9]+/\n"))
    assert table.exact == {"CN=bob, OU=clients, O=meshmq": "bob"}
    ((pattern, name),) = table.patterns
    assert name == "robots"
    assert pattern.fullmatch("CN=robot-42") and not pattern.fullmatch("CN=robot-42x")


@pytest.mark.parametrize(("text", "line", "words"), [
    pytest.param("bob=CN=bob\nrobots=/CN=(robot/\n", 2,
                 "user 'robots': bad regular expression /CN=(robot/", id="bad-regex"),
    pytest.param("bob=\n", 1, "user 'bob' has no certificate DN", id="empty-dn"),
    pytest.param("bob=   \n", 1, "user 'bob' has no certificate DN", id="blank-dn"),
])
def test_each_bad_certificate_user_names_its_line(tmp_path: Path, text: str, line: int,
                                                  words: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        read_certificate_users(path)
    assert (info.value.file, info.value.line) == (str(path), line)
    assert words in info.value.reason


def test_a_slash_alone_is_an_exact_dn_not_a_regex(tmp_path: Path) -> None:
    table = read_certificate_users(write(tmp_path, "odd=/\n"))
    assert (table.exact, table.patterns) == ({"/": "odd"}, ())


def test_a_missing_file_names_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        CredentialFiles(AuthConfig(groups_file=tmp_path / "nowhere.properties"))
    assert str(info.value) == (f"cannot read {tmp_path / 'nowhere.properties'}: "
                               "No such file or directory")


def test_clear_text_users_are_warned_about_once_each(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    users = write(tmp_path, f"alice=one\nbob={hash_password('x')}\ncarol=two\n", "users")
    with caplog.at_level(logging.WARNING, logger="meshmq.auth"):
        files = CredentialFiles(AuthConfig(users_file=users, reload_files=True))
        later = users.stat().st_mtime + 5
        os.utime(users, (later, later))
        assert files.refresh()  # re-read: the same users are not warned about again
    warnings = [r.getMessage() for r in caplog.records]
    assert warnings == [
        f"{users}:1: user 'alice' has a clear-text password; store the line `meshmq "
        "passwd` prints instead",
        f"{users}:3: user 'carol' has a clear-text password; store the line `meshmq "
        "passwd` prints instead"]
