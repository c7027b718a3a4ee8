"""Authenticator decisions: open (no users) versus users configured."""

from __future__ import annotations

import pytest

from meshmq.config.model import AuthConfig, User
from meshmq.core.auth import Authenticator
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
