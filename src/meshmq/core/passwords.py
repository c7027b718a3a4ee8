"""Password hashes: scrypt in a self-describing text form.

``scrypt$N$r$p$<salt>$<hash>`` (salt and hash in standard base64, unpadded) names
the algorithm and its cost, so stronger parameters can be adopted later without
breaking stored hashes. ``meshmq passwd`` prints one; a ``User.password`` or a
users.properties value that starts with ``scrypt$`` is verified as a hash,
anything else is a clear-text password.

The default cost (N=2**14, r=8, p=1: 16 MiB of memory) takes about 30 ms on one
core: cheap for one login, expensive for an offline guesser. Verification releases
the GIL, so the authenticator runs it on worker threads, off the event loop.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
from dataclasses import dataclass

PREFIX = "scrypt$"
DEFAULT_N = 2**14
DEFAULT_R = 8
DEFAULT_P = 1
SALT_BYTES = 16
HASH_BYTES = 32
# Bounds on parameters read from a config: a typo must not make each login take
# minutes or gigabytes.
MAX_N = 2**20
MAX_R = 32
MAX_P = 16
MAX_MEMORY = 1024 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class ScryptHash:
    n: int
    r: int
    p: int
    salt: bytes
    digest: bytes

    def derive(self, password: str) -> bytes:
        return hashlib.scrypt(password.encode("utf-8"), salt=self.salt, n=self.n, r=self.r,
                              p=self.p, dklen=len(self.digest),
                              maxmem=min(MAX_MEMORY, 256 * self.r * self.n * self.p
                                         + 64 * 1024 * 1024))

    def matches(self, password: str) -> bool:
        return hmac.compare_digest(self.derive(password), self.digest)


def is_hashed(stored: str) -> bool:
    return stored.startswith(PREFIX)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii").rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)


def hash_password(password: str, *, n: int = DEFAULT_N, r: int = DEFAULT_R, p: int = DEFAULT_P,
                  salt: bytes | None = None) -> str:
    """The text to store for ``password``: ``scrypt$N$r$p$<salt>$<hash>``."""
    h = ScryptHash(n, r, p, salt if salt is not None else os.urandom(SALT_BYTES),
                   b"\0" * HASH_BYTES)
    digest = h.derive(password)
    return f"{PREFIX}{n}${r}${p}${_b64(h.salt)}${_b64(digest)}"


def parse_hash(stored: str) -> ScryptHash:
    """Parse a stored hash; ``ValueError`` says what is wrong with it."""
    parts = stored.split("$")
    if len(parts) != 6 or parts[0] != "scrypt":
        raise ValueError("a password hash reads scrypt$N$r$p$<salt>$<hash> (as `meshmq "
                         "passwd` prints it)")
    try:
        n, r, p = int(parts[1]), int(parts[2]), int(parts[3])
    except ValueError:
        raise ValueError("scrypt parameters N, r and p must be integers") from None
    if n < 2 or n & (n - 1) or n > MAX_N:
        raise ValueError(f"scrypt N must be a power of two from 2 to {MAX_N}, not {n}")
    if not 1 <= r <= MAX_R or not 1 <= p <= MAX_P:
        raise ValueError(f"scrypt r must be 1..{MAX_R} and p 1..{MAX_P}")
    try:
        salt, digest = _unb64(parts[4]), _unb64(parts[5])
    except (binascii.Error, ValueError):
        raise ValueError("the salt and hash of a password hash must be base64") from None
    if len(salt) < 8 or len(digest) < 16:
        raise ValueError("the salt or hash of this password hash is too short")
    return ScryptHash(n, r, p, salt, digest)


def check_hash(stored: str) -> str | None:
    """What is wrong with ``stored`` if it claims to be a hash, else None."""
    if not is_hashed(stored):
        return None
    try:
        parse_hash(stored)
    except ValueError as exc:
        return str(exc)
    return None


_DUMMY: ScryptHash | None = None


def dummy_hash() -> ScryptHash:
    """A hash with the default cost that no password matches: an unknown user is
    verified against it, so its refusal costs what a wrong password costs."""
    global _DUMMY
    if _DUMMY is None:
        _DUMMY = ScryptHash(DEFAULT_N, DEFAULT_R, DEFAULT_P, os.urandom(SALT_BYTES),
                            os.urandom(HASH_BYTES))
    return _DUMMY
