"""`meshmq passwd`: a hash to paste into the config, from a pipe or a terminal."""

from __future__ import annotations

import io
import subprocess
import sys

import pytest

from meshmq.cli import main as cli
from meshmq.config.toml_loader import loads_toml
from meshmq.core.auth import Authenticator
from meshmq.errors import AuthenticationError


def meshmq(*args: str, stdin: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "meshmq.cli.main", *args], input=stdin,
                          capture_output=True, text=True, timeout=60, check=False)


def test_piped_password_gives_a_line_the_config_accepts() -> None:
    done = meshmq("passwd", stdin="correct horse\n")
    assert done.returncode == 0, done.stderr
    line = done.stdout.strip()
    assert line.startswith("scrypt$16384$8$1$") and "\n" not in line
    config = loads_toml(f'[[auth.users]]\nname = "bob"\npassword = "{line}"\n')
    auth = Authenticator(config.auth)
    assert auth.authenticate("bob", "correct horse").user == "bob"
    with pytest.raises(AuthenticationError):
        auth.authenticate("bob", "correct horse\n")


def test_empty_password_is_one_line_error() -> None:
    done = meshmq("passwd", stdin="")
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr == "meshmq passwd: the password is empty; nothing printed\n"


def test_terminal_asks_twice(monkeypatch: pytest.MonkeyPatch,
                             capsys: pytest.CaptureFixture[str]) -> None:
    tty = io.StringIO()
    tty.isatty = lambda: True  # type: ignore[method-assign]
    monkeypatch.setattr(sys, "stdin", tty)
    answers = iter(["one", "two"])
    monkeypatch.setattr("getpass.getpass", lambda prompt="": next(answers))
    assert cli.main(["passwd"]) == 2
    assert "the two passwords differ" in capsys.readouterr().err
    answers = iter(["same", "same"])
    assert cli.main(["passwd"]) == 0
    assert capsys.readouterr().out.startswith("scrypt$")
