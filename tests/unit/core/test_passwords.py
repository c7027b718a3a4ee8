"""scrypt password hashes: the stored form, verification, refusal of broken hashes."""

from __future__ import annotations

import time

import pytest

from meshmq.core.passwords import (
    DEFAULT_N,
    check_hash,
    dummy_hash,
    hash_password,
    is_hashed,
    parse_hash,
)


def test_hash_is_self_describing_and_verifies() -> None:
    stored = hash_password("s3cret")
    algorithm, n, r, p, _salt, _digest = stored.split("$")
    assert (algorithm, int(n), int(r), int(p)) == ("scrypt", DEFAULT_N, 8, 1)
    assert is_hashed(stored) and check_hash(stored) is None
    h = parse_hash(stored)
    assert h.matches("s3cret")
    assert not h.matches("s3cret ") and not h.matches("")
    assert hash_password("s3cret") != stored  # a fresh salt each time


def test_default_cost_is_tens_of_milliseconds() -> None:
    h = parse_hash(hash_password("x"))
    t0 = time.perf_counter()
    h.matches("x")
    took = time.perf_counter() - t0
    assert 0.002 < took < 2.0, took  # ~30 ms on one core; generous for a busy machine


@pytest.mark.parametrize("stored, complaint", [
    ("scrypt$16384$8$1$c2FsdHNhbHQ", "scrypt$N$r$p$<salt>$<hash>"),
    ("scrypt$1000$8$1$c2FsdHNhbHQ$" + "A" * 43, "power of two"),
    ("scrypt$x$8$1$c2FsdHNhbHQ$" + "A" * 43, "integers"),
    ("scrypt$16384$99$1$c2FsdHNhbHQ$" + "A" * 43, "r must be"),
    ("scrypt$16384$8$1$!!!$" + "A" * 43, "base64"),
    ("scrypt$16384$8$1$c2FsdHNhbHQ$QUJD", "too short"),
])
def test_broken_hashes_are_named(stored: str, complaint: str) -> None:
    problem = check_hash(stored)
    assert problem is not None and complaint in problem


def test_clear_text_is_not_a_hash() -> None:
    assert not is_hashed("manager") and check_hash("manager") is None


def test_dummy_hash_matches_nothing_at_the_default_cost() -> None:
    d = dummy_hash()
    assert (d.n, d.r, d.p) == (DEFAULT_N, 8, 1)
    assert not d.matches("") and not d.matches("manager")
