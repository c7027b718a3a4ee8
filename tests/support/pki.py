"""Test certificates, made with openssl by the script operators use
(examples/tls/make-certs.sh), so the documented example is what the tests run on.

``make_pki(dir)`` gives a trusted authority with brokers ``a``/``b`` and clients
``app``/``bob``, and a second, untrusted authority with a broker and a client of
its own (``stranger``): a certificate the first authority's brokers must refuse.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "tls" / "make-certs.sh"


@dataclass(frozen=True)
class Pki:
    trusted: Path  # directory of the authority the brokers trust
    untrusted: Path  # directory of another authority

    @property
    def ca(self) -> Path:
        return self.trusted / "ca.pem"

    def broker(self, name: str) -> tuple[Path, Path]:
        """(certificate, key) of broker ``name`` (a or b) from the trusted authority."""
        return self.trusted / f"broker-{name}.pem", self.trusted / f"broker-{name}.key"

    def client(self, name: str) -> tuple[Path, Path]:
        """(certificate, key) of client ``name`` (app or bob) from the trusted authority."""
        return self.trusted / f"client-{name}.pem", self.trusted / f"client-{name}.key"

    def stranger(self, kind: str = "client") -> tuple[Path, Path]:
        """A certificate from the untrusted authority: kind "client" or "broker"."""
        stem = "client-stranger" if kind == "client" else "broker-stranger"
        return self.untrusted / f"{stem}.pem", self.untrusted / f"{stem}.key"


def make_pki(directory: Path) -> Pki:
    if shutil.which("openssl") is None:
        pytest.fail("openssl is needed to make test certificates (Debian package openssl)")
    trusted, untrusted = directory / "trusted", directory / "untrusted"
    for target, args in ((trusted, ["--broker", "a", "--broker", "b", "--client", "app",
                                    "--client", "bob"]),
                         (untrusted, ["--broker", "stranger", "--client", "stranger"])):
        subprocess.run(["bash", str(SCRIPT), str(target), "--days", "2", *args],
                       check=True, capture_output=True)
    return Pki(trusted, untrusted)
