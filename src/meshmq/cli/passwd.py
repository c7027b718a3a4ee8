"""``meshmq passwd``: print the hash of a password, to paste into the config.

From a terminal the password is asked twice (not echoed); otherwise one line is
read from standard input (``printf '%s\\n' "$PW" | meshmq passwd``), its line end
dropped. The printed line goes in ``[[auth.users]] password = "..."`` or after
``user=`` in a users file.
"""

from __future__ import annotations

import argparse
import getpass
import sys

from meshmq.core.passwords import hash_password
from meshmq.errors import MeshmqError


class PasswdError(MeshmqError):
    """The password could not be read as given (exit status 2)."""


def read_password() -> str:
    if sys.stdin.isatty():
        first = getpass.getpass("Password: ")
        if getpass.getpass("Again: ") != first:
            raise PasswdError("the two passwords differ; nothing printed")
        password = first
    else:
        line = sys.stdin.readline()
        password = line[:-1] if line.endswith("\n") else line
        password = password[:-1] if password.endswith("\r") else password
    if not password:
        raise PasswdError("the password is empty; nothing printed")
    return password


def cmd_passwd(args: argparse.Namespace) -> int:
    print(hash_password(read_password()))
    return 0


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("passwd", help="hash a password for [[auth.users]] or a users file",
                       description="Read a password (twice from a terminal, or one line "
                       "from standard input) and print its scrypt hash, one line to paste "
                       "as a user's password in the config or a users.properties file.")
    p.set_defaults(func=cmd_passwd)
