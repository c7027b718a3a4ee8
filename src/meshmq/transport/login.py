"""Authenticating a protocol connection without holding the event loop.

The STOMP and MQTT sessions hand a CONNECT's credentials (and the TLS peer
certificate, when there is one) to ``authenticate``, which answers through a
callback: at once when the authenticator decides at once (no users, a clear-text
password, a remembered hash check, a certificate), or after the scrypt check has
run on a worker thread. A refusal is answered after the delay ``LoginBackoff``
gives the client's address, by a timer, so nobody else waits. Concurrent checks
of the same credentials share one scrypt run (a reconnect storm of one user costs
one check).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Callable
from typing import Any, Protocol

from meshmq.core.auth import Authenticator, PendingLogin, Principal, refusal
from meshmq.errors import AuthenticationError

log = logging.getLogger("meshmq.auth")

# scrypt releases the GIL; two threads use two cores without starving the loop's thread.
SCRYPT_WORKERS = 2

_executor: concurrent.futures.ThreadPoolExecutor | None = None
_executor_lock = threading.Lock()
# Checks under way: key -> their future (one per loop; keys embed the authenticator's
# random HMAC key, so brokers sharing the process never share entries).
_inflight: dict[bytes, asyncio.Future[bool]] = {}

#: ``done(principal, None)`` on success, ``done(None, refusal text)`` on refusal.
Done = Callable[[Principal | None, str | None], None]


class LoginSession(Protocol):
    remote: str
    transport: asyncio.Transport

    def is_closing(self) -> bool: ...


def peer_certificate(transport: asyncio.BaseTransport) -> dict[str, Any] | None:
    """The verified client certificate of a TLS connection (``getpeercert()``), or None
    (no TLS, no certificate, or not verified: then ``getpeercert()`` is empty)."""
    cert = transport.get_extra_info("peercert")
    return cert if isinstance(cert, dict) and cert else None


def _scrypt_pool() -> concurrent.futures.ThreadPoolExecutor:
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = concurrent.futures.ThreadPoolExecutor(
                max_workers=SCRYPT_WORKERS, thread_name_prefix="meshmq-scrypt")
        return _executor


def _verify_off_loop(pending: PendingLogin) -> asyncio.Future[bool]:
    loop = asyncio.get_running_loop()
    key = pending.key + (pending.stored or "").encode()
    running = _inflight.get(key)
    if running is not None and running.get_loop() is loop and not running.done():
        return running
    future = loop.run_in_executor(_scrypt_pool(), pending.verify)
    _inflight[key] = future
    future.add_done_callback(lambda f: _inflight.pop(key, None) if _inflight.get(key) is f
                             else None)
    return future


def authenticate(session: LoginSession, auth: Authenticator, login: str | None,
                 passcode: str | None, done: Done) -> None:
    """Decide who ``session`` is; ``done`` is called exactly once unless the connection
    closes first (possibly before this returns)."""
    cert = peer_certificate(session.transport)
    try:
        decided = auth.login(login, passcode, cert)
    except AuthenticationError as exc:
        _refuse(session, auth, exc.message, done)
        return
    if isinstance(decided, Principal):
        done(decided, None)
        return
    pending: PendingLogin = decided

    def checked(future: asyncio.Future[bool]) -> None:
        if session.is_closing():
            return
        try:
            matched = future.result()
        except Exception:  # a broken hash or out of memory: refuse, and say why here
            log.exception("password check for %r from %s failed", login, session.remote)
            matched = False
        try:
            principal = auth.finish(pending, matched)
        except AuthenticationError as exc:
            _refuse(session, auth, exc.message, done)
            return
        done(principal, None)

    _verify_off_loop(pending).add_done_callback(checked)


async def check_password(auth: Authenticator, login: str, passcode: str) -> Principal:
    """The same password check for a caller that can wait (the management endpoint,
    broker links): scrypt on the worker threads, never the event loop. Raises
    ``AuthenticationError``; no backoff (the caller has its own answer to give)."""
    decided = auth.begin(login, passcode)
    if isinstance(decided, Principal):
        return decided
    try:
        matched = await _verify_off_loop(decided)
    except Exception:  # a broken hash or out of memory: refuse, and say why here
        log.exception("password check for %r failed", login)
        matched = False
    return auth.finish(decided, matched)


def _refuse(session: LoginSession, auth: Authenticator, message: str, done: Done) -> None:
    delay = auth.refused(session.remote)
    if delay <= 0:
        done(None, message)
        return

    def answer() -> None:
        if not session.is_closing():
            done(None, message)

    asyncio.get_running_loop().call_later(delay, answer)


__all__ = ["Done", "LoginSession", "authenticate", "check_password", "peer_certificate",
           "refusal"]
