"""Multicast discovery of brokers: ActiveMQ's ``multicast://`` discovery agent, in asyncio.

A broker whose ``tcp://`` listener has ``discovery_uri = "multicast://default"``
advertises that listener with a heartbeat datagram every ``keepAliveInterval``; a
network connector with ``uri = "multicast://default"`` listens for the heartbeats of
its group and is told when a broker appears (``on_up(service_uri, broker_name)``) and
when it goes (``on_down(service_uri)``): it sent "dead" (a clean stop), or it missed
10 heartbeats in a row (a crash).

URI (ActiveMQ's syntax and defaults)::

    multicast://default                        group address 239.255.2.3, port 6155
    multicast://239.255.9.9:7000?group=prod&keepAliveInterval=1000

Options: ``group`` ("default": only agents of the same group hear each other),
``keepAliveInterval`` (500 ms), ``timeToLive`` (1: the LAN segment only), and
``interface`` (meshmq's: the local IPv4 address to send from and join on, see below).
ActiveMQ's reconnect options of discovered services are accepted and parsed for the
connector that acts on them (``initialReconnectDelay`` 5000, ``maxReconnectDelay``
30000, ``useExponentialBackOff`` false, ``backOffMultiplier`` 2, ``maxReconnectAttempts``
0), and so are ``discovered.<option>`` options, which belong to every discovered URI.
Anything else is an error naming the option.

Heartbeat datagram, format version 1 (meshmq's own; it shares ActiveMQ's default port
but neither side mistakes the other's datagrams for its own)::

    magic     4 bytes   b"MMQD"
    version   1 byte    1
    status    1 byte    1 = alive, 0 = dead
    interval  4 bytes   the sender's keepAliveInterval in ms (unsigned, big-endian, >= 1)
    instance  8 bytes   random per agent start: an agent recognises and ignores its own beats
    group     string    \\
    broker    string     > each: 2-byte big-endian length, then that many bytes of UTF-8
    service   string    /    (the advertised URI, e.g. "tcp://127.0.0.1:61616")

A datagram that is not exactly this (other magic, another version, truncated, trailing
bytes, bad UTF-8, empty names) is dropped and counted. A service is declared down
after 10 of *its sender's* intervals without a beat, so agents configured with
different intervals still agree. An agent also beats at once when it hears a service
it did not know, so a broker that starts learns of the others within a round trip
rather than a keep-alive interval.

Interfaces and loopback. Multicast works on Linux's ``lo`` even though the interface
lacks the MULTICAST flag, provided the socket sends with ``IP_MULTICAST_IF`` =
127.0.0.1, joins the group on 127.0.0.1 and keeps ``IP_MULTICAST_LOOP`` on (checked on
the test machine, kernel 6.x, no network namespace needed). Every agent binds the
group's address and port with ``SO_REUSEADDR``/``SO_REUSEPORT`` so several brokers on
one host share the port, and joins the group on 127.0.0.1 and, best effort, on the
default interface. It sends on: the ``interface`` option if given; else 127.0.0.1 when
the advertised service's host is a loopback address; else the host's default
multicast interface (falling back to 127.0.0.1 when there is none). So brokers that
listen on loopback find each other without any traffic leaving the machine, and
brokers that listen on a LAN address are found across the LAN, as in ActiveMQ.
``timeToLive`` 1 keeps beats on the local segment either way.

The decoding and ageing logic is pure (``decode_beat``, ``DiscoveryTracker``: fed with
datagrams and a clock); ``MulticastDiscoveryAgent`` adds the socket and the timer.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import socket
import struct
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from meshmq.discovery_uri import (
    DEFAULT_GROUP,
    DEFAULT_GROUP_ADDRESS,
    DEFAULT_PORT,
    MAX_STRING,
    DiscoveryUriError,
    MulticastSettings,
    parse_multicast_uri,
)

__all__ = [
    "DEFAULT_GROUP",
    "DEFAULT_GROUP_ADDRESS",
    "DEFAULT_PORT",
    "Beat",
    "DiscoveryTracker",
    "DiscoveryUriError",
    "MulticastDiscoveryAgent",
    "MulticastSettings",
    "ServiceDown",
    "ServiceUp",
    "decode_beat",
    "encode_beat",
    "parse_multicast_uri",
]

log = logging.getLogger("meshmq.network.discovery")

MISSED_BEATS_BEFORE_DOWN: Final = 10

MAGIC: Final = b"MMQD"
VERSION: Final = 1
_HEADER = struct.Struct(">4sBBI8s")
_LENGTH = struct.Struct(">H")
LOOPBACK: Final = "127.0.0.1"


# ---------------------------------------------------------------------------
# The heartbeat datagram


@dataclass(frozen=True, slots=True)
class Beat:
    group: str
    broker_name: str
    service: str
    alive: bool = True
    interval_ms: int = 500
    instance: bytes = b"\0" * 8


def encode_beat(beat: Beat) -> bytes:
    """The datagram for ``beat`` (format in the module docstring)."""
    if len(beat.instance) != 8:
        raise ValueError("instance must be 8 bytes")
    if not 1 <= beat.interval_ms <= 0xFFFFFFFF:
        raise ValueError(f"interval out of range: {beat.interval_ms}")
    out = [_HEADER.pack(MAGIC, VERSION, 1 if beat.alive else 0, beat.interval_ms,
                        beat.instance)]
    for text in (beat.group, beat.broker_name, beat.service):
        data = text.encode("utf-8")
        if not data or len(data) > MAX_STRING:
            raise ValueError(f"heartbeat field must be 1-{MAX_STRING} bytes: {text!r}")
        out += [_LENGTH.pack(len(data)), data]
    return b"".join(out)


def decode_beat(data: bytes) -> Beat | None:
    """The beat in ``data``, or None if it is not a valid version-1 heartbeat."""
    if len(data) < _HEADER.size:
        return None
    magic, version, status, interval, instance = _HEADER.unpack_from(data)
    if magic != MAGIC or version != VERSION or status not in (0, 1) or interval < 1:
        return None
    pos = _HEADER.size
    texts: list[str] = []
    for _ in range(3):
        if pos + _LENGTH.size > len(data):
            return None
        (length,) = _LENGTH.unpack_from(data, pos)
        pos += _LENGTH.size
        if length == 0 or pos + length > len(data):
            return None
        try:
            texts.append(data[pos:pos + length].decode("utf-8"))
        except UnicodeDecodeError:
            return None
        pos += length
    if pos != len(data):
        return None
    return Beat(texts[0], texts[1], texts[2], status == 1, interval, instance)


# ---------------------------------------------------------------------------
# Ageing: which services are up, fed with datagrams and a clock


@dataclass(frozen=True, slots=True)
class ServiceUp:
    service: str
    broker_name: str


@dataclass(frozen=True, slots=True)
class ServiceDown:
    service: str
    reason: str  # "dead" (it said so) or "expired" (its beats stopped)


@dataclass(slots=True)
class _Known:
    broker_name: str
    instance: bytes
    last_beat: float
    interval_s: float


class DiscoveryTracker:
    """The services of one group, as heard in heartbeats. Pure: no I/O, no clock of its own.

    ``receive(datagram, now)`` and ``expire(now)`` return the events to report: a
    ``ServiceUp`` once per service that appears (again after it went down), a
    ``ServiceDown`` when it says "dead" or misses ``missed_beats`` of its intervals.
    Times are seconds on any monotonic clock.
    """

    def __init__(self, group: str, instance: bytes,
                 missed_beats: int = MISSED_BEATS_BEFORE_DOWN) -> None:
        self.group = group
        self.instance = instance
        self.missed_beats = missed_beats
        self._known: dict[str, _Known] = {}
        self.dropped = 0  # datagrams that were not heartbeats
        self.other_groups = 0  # heartbeats of other groups
        self.own = 0  # our own heartbeats, looped back
        self.stale = 0  # "dead" from a service we do not know (or an earlier run of it)

    @property
    def services(self) -> dict[str, str]:
        """Service URI -> broker name of every service currently up."""
        return {service: k.broker_name for service, k in self._known.items()}

    def receive(self, data: bytes, now: float) -> list[ServiceUp | ServiceDown]:
        beat = decode_beat(data)
        if beat is None:
            self.dropped += 1
            return []
        if beat.group != self.group:
            self.other_groups += 1
            return []
        if beat.instance == self.instance:
            self.own += 1
            return []
        known = self._known.get(beat.service)
        if not beat.alive:
            # Only the instance that is up may take itself down: a late "dead" from a
            # broker's previous run must not remove its restarted successor.
            if known is None or known.instance != beat.instance:
                self.stale += 1
                return []
            del self._known[beat.service]
            return [ServiceDown(beat.service, "dead")]
        events: list[ServiceUp | ServiceDown] = []
        if known is not None and known.broker_name != beat.broker_name:
            # Another broker now answers at this address: report it as a new service.
            del self._known[beat.service]
            events.append(ServiceDown(beat.service, "replaced"))
            known = None
        if known is None:
            events.append(ServiceUp(beat.service, beat.broker_name))
            self._known[beat.service] = _Known(beat.broker_name, beat.instance, now,
                                               beat.interval_ms / 1000)
        else:
            known.instance = beat.instance
            known.last_beat = max(known.last_beat, now)
            known.interval_s = beat.interval_ms / 1000
        return events

    def expire(self, now: float) -> list[ServiceUp | ServiceDown]:
        gone = [service for service, k in self._known.items()
                if now - k.last_beat >= self.missed_beats * k.interval_s]
        for service in gone:
            del self._known[service]
        return [ServiceDown(service, "expired") for service in gone]

    def next_expiry(self) -> float | None:
        """When the next service would expire without further beats (None: nothing known)."""
        if not self._known:
            return None
        return min(k.last_beat + self.missed_beats * k.interval_s for k in self._known.values())


# ---------------------------------------------------------------------------
# The agent: a UDP socket and a timer around the tracker


class MulticastDiscoveryAgent:
    """Advertise ``advertise`` (when given) and report the group's other services.

    ``on_up(service_uri, broker_name)`` and ``on_down(service_uri)`` run in the event
    loop; an exception they raise is logged and does not stop the agent.
    """

    def __init__(self, uri: str, *, broker_name: str, advertise: str | None,
                 on_up: Callable[[str, str], None], on_down: Callable[[str], None]) -> None:
        self.settings = parse_multicast_uri(uri)
        self.uri = uri
        if not broker_name:
            raise ValueError("broker_name must not be empty")
        if advertise is not None and not advertise.strip():
            raise ValueError("advertise must be a service URI or None")
        for text, what in ((broker_name, "broker_name"), (advertise or "x", "advertise")):
            if len(text.encode("utf-8")) > MAX_STRING:
                raise ValueError(f"{what} is longer than {MAX_STRING} bytes")
        self.broker_name = broker_name
        self.advertise = advertise
        self.on_up = on_up
        self.on_down = on_down
        self.instance = os.urandom(8)
        self.tracker = DiscoveryTracker(self.settings.group, self.instance)
        self._transport: asyncio.DatagramTransport | None = None
        self._timer: asyncio.Task[None] | None = None
        self._send_error: str | None = None
        self._wake = asyncio.Event()

    @property
    def services(self) -> dict[str, str]:
        return self.tracker.services

    @property
    def running(self) -> bool:
        return self._transport is not None

    async def start(self) -> None:
        if self._transport is not None:
            return
        loop = asyncio.get_running_loop()
        sock = self._open_socket()
        try:
            transport, _ = await loop.create_datagram_endpoint(
                lambda: _Protocol(self), sock=sock)
        except BaseException:
            sock.close()
            raise
        self._transport = transport
        self._send_beat(alive=True)
        self._timer = loop.create_task(self._tick(), name=f"discovery {self.uri}")

    async def stop(self) -> None:
        """Say "dead" (if advertising) and close; known services are not reported down."""
        if self._transport is None:
            return
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await timer
        self._send_beat(alive=False)
        transport, self._transport = self._transport, None
        transport.close()
        await asyncio.sleep(0)  # let the transport's close callback run

    # -- internals ------------------------------------------------------------

    def _open_socket(self) -> socket.socket:
        s = self.settings
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_UDP)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if hasattr(socket, "SO_REUSEPORT"):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            try:
                # Binding the group address filters out other groups' traffic (Linux).
                sock.bind((s.address, s.port))
            except OSError:
                sock.bind(("", s.port))
            joined = []
            for interface in self._join_interfaces():
                mreq = socket.inet_aton(s.address) + socket.inet_aton(interface)
                try:
                    sock.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, mreq)
                    joined.append(interface)
                except OSError as exc:
                    log.debug("cannot join %s on %s: %s", s.address, interface, exc)
            if not joined:
                raise OSError(f"cannot join multicast group {s.address} on any interface")
            send_on = self._send_interface()
            if send_on is not None:
                sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF,
                                socket.inet_aton(send_on))
            sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP, 1)
            sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, s.time_to_live)
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        return sock

    def _join_interfaces(self) -> list[str]:
        if self.settings.interface is not None:
            return [self.settings.interface]
        return [LOOPBACK, "0.0.0.0"]  # 0.0.0.0: the kernel's default multicast interface

    def _send_interface(self) -> str | None:
        """Where beats go out (module docstring); None = the kernel's default route."""
        if self.settings.interface is not None:
            return self.settings.interface
        if self.advertise is None:
            return None
        host = urllib.parse.urlsplit(self.advertise).hostname or ""
        try:
            if host == "localhost" or ipaddress.ip_address(host).is_loopback:
                return LOOPBACK
        except ValueError:
            pass
        return None

    def _send_beat(self, *, alive: bool) -> None:
        if self.advertise is None or self._transport is None:
            return
        beat = Beat(self.settings.group, self.broker_name, self.advertise, alive,
                    self.settings.keepalive_interval_ms, self.instance)
        target = (self.settings.address, self.settings.port)
        try:
            self._transport.sendto(encode_beat(beat), target)
        except OSError as exc:
            self._sent_failed(exc)

    def _sent_failed(self, exc: OSError) -> None:
        # No default multicast route (e.g. a container without one): use loopback.
        if self.settings.interface is None and self._transport is not None:
            sock = self._transport.get_extra_info("socket")
            if sock is not None:
                try:
                    sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF,
                                    socket.inet_aton(LOOPBACK))
                except OSError:
                    pass
        message = f"{type(exc).__name__}: {exc}"
        if message != self._send_error:  # once per kind of failure, not once per beat
            log.warning("discovery %s: cannot send heartbeat: %s", self.uri, message)
            self._send_error = message

    async def _tick(self) -> None:
        """Beat every interval, and wake when a known service is due to expire (its
        sender's interval may be shorter than ours) or a new one arrived."""
        loop = asyncio.get_running_loop()
        interval = self.settings.keepalive_interval_ms / 1000
        next_beat = loop.time() + interval
        while True:
            wake = next_beat
            expiry = self.tracker.next_expiry()
            if expiry is not None:
                wake = min(wake, expiry)
            self._wake.clear()
            # asyncio.timeout, not wait_for: under Python 3.11, wait_for swallows a
            # cancellation (the stop's) that lands as the wake-up completes, and this
            # loop would beat on while the stop waited for it.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, wake - loop.time())):
                    await self._wake.wait()
            now = loop.time()
            if now >= next_beat:
                self._send_beat(alive=True)
                next_beat = now + interval
            self._dispatch(self.tracker.expire(now))

    def _datagram(self, data: bytes) -> None:
        loop = asyncio.get_running_loop()
        events = self.tracker.receive(data, loop.time())
        if any(isinstance(e, ServiceUp) for e in events):
            # Answer a newcomer at once rather than at our next beat: a broker that just
            # started learns of us within a round trip, not a keep-alive interval.
            self._send_beat(alive=True)
            self._wake.set()  # its expiry may come before the timer's next wake-up
        self._dispatch(events)

    def _dispatch(self, events: list[ServiceUp | ServiceDown]) -> None:
        for event in events:
            try:
                if isinstance(event, ServiceUp):
                    log.info("discovery %s: %s up at %s", self.uri, event.broker_name,
                             event.service)
                    self.on_up(event.service, event.broker_name)
                else:
                    log.info("discovery %s: %s down (%s)", self.uri, event.service,
                             event.reason)
                    self.on_down(event.service)
            except Exception:
                log.exception("discovery %s: callback for %s failed", self.uri, event)


class _Protocol(asyncio.DatagramProtocol):
    def __init__(self, agent: MulticastDiscoveryAgent) -> None:
        self.agent = agent

    def datagram_received(self, data: bytes, addr: tuple[str | object, int]) -> None:
        self.agent._datagram(data)

    def error_received(self, exc: Exception) -> None:
        if isinstance(exc, OSError):
            self.agent._sent_failed(exc)
