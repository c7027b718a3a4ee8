"""Authenticator decisions: open (no users) versus users configured, hashed passwords,
certificates, users files, failure counting."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from meshmq.config.credential_files import CredentialFiles
from meshmq.config.model import AuthConfig, CertificateUser, User
from meshmq.core.auth import Authenticator, PendingLogin, Principal
from meshmq.core.passwords import DEFAULT_N, hash_password
from meshmq.errors import AuthenticationError


def test_no_users_accepts_any_login_as_anonymous() -> None:
    auth = Authenticator(AuthConfig())
    assert auth.open
    for login, passcode in [("system", "manager"), ("x", None), (None, None)]:
        p = auth.authenticate(login, passcode)
        assert p.anonymous and p.user == "anonymous"


def test_with_users_a_given_login_must_be_valid() -> None:
    auth = Authenticator(AuthConfig(users=(User("admin", "secret"),)))
    assert not auth.open
    assert auth.authenticate("admin", "secret").user == "admin"
    assert auth.authenticate(None, None).anonymous
    for login, passcode in [("system", "manager"), ("admin", "typo")]:
        with pytest.raises(AuthenticationError, match=r"or password is invalid\."):
            auth.authenticate(login, passcode)


def test_no_users_and_no_anonymous_access_refuses_everyone() -> None:
    auth = Authenticator(AuthConfig(anonymous_access=False))
    assert not auth.open
    with pytest.raises(AuthenticationError):
        auth.authenticate("system", "manager")


# ------------------------------------------------------------------ hashed passwords

def _hashed(password: str) -> str:
    return hash_password(password, n=2**4)  # cheap cost for unit tests


def test_hashed_password_is_checked_as_pending_work_then_remembered() -> None:
    auth = Authenticator(AuthConfig(users=(User("bob", _hashed("pw"), ("ops",)),)))
    pending = auth.begin("bob", "pw")
    assert isinstance(pending, PendingLogin)
    principal = auth.finish(pending, pending.verify())
    assert principal == Principal("bob", frozenset({"ops"}))
    # The same credentials again: decided at once, without scrypt.
    assert auth.begin("bob", "pw") == principal
    # Other credentials are not remembered.
    wrong = auth.begin("bob", "pw2")
    assert isinstance(wrong, PendingLogin) and not wrong.verify()
    with pytest.raises(AuthenticationError, match=r"^User name \[bob\] or password is"):
        auth.finish(wrong, False)


def test_unknown_user_costs_the_same_work_and_reads_the_same() -> None:
    auth = Authenticator(AuthConfig(users=(User("bob", _hashed("pw")),
                                           User("old", "clear"))))
    for login, passcode in (("ghost", "pw"), ("old", "nope")):
        pending = auth.begin(login, passcode)
        assert isinstance(pending, PendingLogin)  # scrypt even without a hash to check
        assert pending.hashed.n == DEFAULT_N  # at the default cost
        assert not pending.verify()
        with pytest.raises(AuthenticationError) as err:
            auth.finish(pending, False)
        assert err.value.message == f"User name [{login}] or password is invalid."
    clear = auth.begin("old", "clear")
    assert isinstance(clear, PendingLogin) and clear.verify()
    assert auth.finish(clear, True).user == "old"


def test_no_login_with_anonymous_access_off_reads_null() -> None:
    auth = Authenticator(AuthConfig(anonymous_access=False, users=(User("a", "b"),)))
    with pytest.raises(AuthenticationError) as err:
        auth.authenticate(None, None)
    assert err.value.message == "User name [null] or password is invalid."


def test_failures_are_counted_per_address() -> None:
    now = [0.0]
    auth = Authenticator(AuthConfig(users=(User("a", "b"),), login_backoff_after=1),
                         clock=lambda: now[0])
    assert auth.refused("10.1.1.1:5000") == 0
    assert auth.refused("10.1.1.1:5001") == 0.5  # the port does not matter
    assert auth.refused("[::1]:5000") == 0
    assert auth.statistics() == {"failed_logins": 3, "login_slowed_addresses": 2}


# ------------------------------------------------------------------ certificates

BOB = {"subject": ((("organizationName", "meshmq"),), (("organizationalUnitName", "clients"),),
                   (("commonName", "bob"),))}


def test_certificate_users_by_dn_and_regex() -> None:
    auth = Authenticator(AuthConfig(certificate_users=(
        CertificateUser("bob", dn="CN=bob, OU=clients, O=meshmq", groups=("admins",)),
        CertificateUser("apps", dn_regex=r"CN=app-\d+, OU=clients, O=meshmq",
                        groups=("apps",)))))
    assert auth.certificate_principal(BOB) == Principal("CN=bob, OU=clients, O=meshmq",
                                                        frozenset({"admins"}))
    app = {"subject": ((("organizationName", "meshmq"),),
                       (("organizationalUnitName", "clients"),), (("commonName", "app-7"),))}
    assert auth.certificate_principal(app).groups == frozenset({"apps"})
    # A regex must match the whole DN.
    longer = {"subject": ((("organizationName", "meshmq"),),
                          (("organizationalUnitName", "clients"),),
                          (("commonName", "app-7x"),))}
    with pytest.raises(AuthenticationError, match=r"User name \[null\]"):
        auth.certificate_principal(longer)


def test_unknown_certificate_is_logged_not_told(caplog: pytest.LogCaptureFixture) -> None:
    auth = Authenticator(AuthConfig(certificate_users=(CertificateUser("x", dn="CN=x"),)))
    with pytest.raises(AuthenticationError) as err:
        auth.login("bob", "pw", BOB)
    assert err.value.message == "User name [bob] or password is invalid."
    assert "No user for client certificate: CN=bob, OU=clients, O=meshmq" in caplog.text


def test_certificate_decides_and_login_is_ignored() -> None:
    auth = Authenticator(AuthConfig(
        users=(User("bob", "pw"),),
        certificate_users=(CertificateUser("bob", dn="CN=bob, OU=clients, O=meshmq"),)))
    assert auth.login("someone", "wrong", BOB) == Principal("CN=bob, OU=clients, O=meshmq",
                                                            frozenset())
    assert auth.login("bob", "pw", None) == Principal("bob", frozenset())
    # Without certificate users configured, a certificate plays no part in a login...
    plain = Authenticator(AuthConfig(users=(User("bob", "pw"),)))
    with pytest.raises(AuthenticationError):
        plain.login("bob", "wrong", BOB)
    # ... and a link admitted by its certificate is the DN, with no groups.
    assert plain.certificate_principal(BOB) == Principal("CN=bob, OU=clients, O=meshmq",
                                                         frozenset())


# ------------------------------------------------------------------ files

def test_files_with_groups_and_reload(tmp_path: Path) -> None:
    users, groups = tmp_path / "users.properties", tmp_path / "groups.properties"
    users.write_text("alice=one\nbob=" + _hashed("two") + "\n")
    groups.write_text("admins=alice\nops=alice,bob\n")
    config = AuthConfig(users_file=users, groups_file=groups, reload_files=True)
    auth = Authenticator(config, credentials=CredentialFiles(config))
    assert not auth.open
    assert auth.authenticate("alice", "one").groups == frozenset({"admins", "ops"})
    assert auth.authenticate("bob", "two").groups == frozenset({"ops"})
    users.write_text("alice=changed\n")
    os.utime(users, (time.time() + 5, time.time() + 5))  # a visibly newer file
    with pytest.raises(AuthenticationError):
        auth.authenticate("alice", "one")
    with pytest.raises(AuthenticationError):
        auth.authenticate("bob", "two")  # gone, though its check was remembered
    assert auth.authenticate("alice", "changed").user == "alice"
    # A file that turns invalid keeps its last good contents.
    users.write_text("alice=ENC(abc)\n")
    os.utime(users, (time.time() + 10, time.time() + 10))
    assert auth.authenticate("alice", "changed").user == "alice"
