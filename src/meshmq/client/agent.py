"""Apache Stratos Python Cartridge Agent compatibility: ``agent.conf`` broker lists.

The agent's behaviour (Stratos 4.1.5):

* ``mb.urls=host:port,host:port`` lists the brokers; the agent uses the *first available*
  one, in list order (``randomize=false``).
* The **publisher** publishes each event to the first available broker and keeps
  retrying until ``mb.publisher.timeout`` seconds (default 900) have passed; then the
  event is dropped with a logged warning and counted (``EventPublisher.dropped``).
* Every **topic subscription** keeps its own connection to the first available broker,
  checks it is alive periodically (MQTT keep-alive / STOMP heart-beats every
  ``mb.alive.check.interval`` seconds) and, when it dies, cycles through the list for
  ever until one answers.
* MQTT by default, as the agent; ``mb.protocol=stomp`` selects STOMP.

The better mode the agent lacks: ``mb.durable=true`` makes every subscription durable
(an MQTT persistent session / a STOMP durable topic subscription under
``mb.client.id``), so events published while a subscriber is away or failing over wait
for it on its broker instead of being missed. (They wait on *that* broker: with
independent brokers a subscriber that moves elsewhere sees them when it comes back.)

Failures the application sees (the Stratos agent only logs them):

* **A refused login is permanent.** When a broker refuses ``mb.username`` /
  ``mb.password``, the agent stops retrying: ``publish()`` and ``wait_subscribed()``
  raise :class:`~meshmq.client.errors.AuthenticationFailedError`, and ``on_event``
  receives a ``FAILED`` event whose ``error`` is that exception. (A broker with no users
  configured accepts any login.)
* **Missed events are counted.** Without ``mb.durable``, events published while a
  subscriber is away are not delivered to it (the agent's semantics). The publisher
  numbers its events per topic (``agent-seq: <publisher>:<n>``, a STOMP header / MQTT 5
  user property); a subscriber that sees a gap adds it to ``TopicSubscriber.missed``
  (``Agent.missed``), logs a warning and emits an ``EVENTS_MISSED`` event (``topic``,
  ``missed``). A gap shows when the publisher's next event arrives; events of a publisher
  the subscriber has not heard from yet, and MQTT 3.1.1 messages, carry no baseline.

meshmq keys beyond Stratos': ``mb.protocol``, ``mb.durable``, ``mb.client.id``,
``mb.alive.check.interval`` (s, 30), ``mb.retry.initial.delay`` and
``mb.retry.max.delay`` (ms, 2000 and 60000: Stratos retries in 2..60 s steps).
"""

from __future__ import annotations

import asyncio
import logging
import re
import threading
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from meshmq.errors import ConfigError

from .aio import FailoverClient, Subscription
from .connection import Dialer
from .errors import AuthenticationFailedError, ClientError, OperationTimeoutError
from .options import parse_failover
from .types import Event, EventKind, Message

log = logging.getLogger("meshmq.client.agent")

__all__ = ["Agent", "AgentConfig", "EventPublisher", "TopicSubscriber", "load_agent_conf",
           "parse_agent_conf"]

T = TypeVar("T")

#: The publisher's per-topic event number: ``<publisher id>:<n>``, n = 1, 2, ...
SEQ_HEADER = "agent-seq"

_HOST_PORT = re.compile(r"^\[?([A-Za-z0-9_.:-]+?)\]?:(\d{1,5})$")


@dataclass(frozen=True, slots=True)
class AgentConfig:
    urls: tuple[tuple[str, int], ...]
    username: str | None = None
    password: str | None = None
    publisher_timeout: float = 900.0  # seconds (mb.publisher.timeout)
    protocol: str = "mqtt"
    durable: bool = False
    client_id: str | None = None
    alive_check_interval: int = 30  # seconds
    retry_initial_delay: int = 2000  # ms
    retry_max_delay: int = 60_000  # ms

    def failover_uri(self, *, timeout_ms: int = -1) -> str:
        scheme = "mqtt" if self.protocol == "mqtt" else "stomp"
        hosts = ",".join(f"{scheme}://{f'[{h}]' if ':' in h else h}:{p}" for h, p in self.urls)
        return (f"failover:({hosts})?randomize=false&maxReconnectAttempts=-1"
                f"&initialReconnectDelay={self.retry_initial_delay}"
                f"&maxReconnectDelay={self.retry_max_delay}&timeout={timeout_ms}")


def parse_agent_conf(text: str, *, file: str | None = None) -> AgentConfig:
    """Read the ``mb.*`` properties of an agent.conf (other keys are the agent's own)."""
    props: dict[str, tuple[str, int]] = {}
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        m = re.match(r"^([^=:\s]+)\s*[=:]\s*(.*)$", line)
        if m is None:
            raise ConfigError(f"expected key=value, got {line!r}", file=file, line=lineno)
        props[m.group(1)] = (m.group(2).strip(), lineno)

    def get(key: str) -> str | None:
        return props[key][0] if key in props else None

    def fail(key: str, message: str) -> ConfigError:
        return ConfigError(message, file=file, line=props.get(key, ("", None))[1], option=key)

    urls_text = get("mb.urls")
    if urls_text is None and get("mb.ip") is not None:  # the pre-4.1.5 single broker keys
        urls_text = f"{get('mb.ip')}:{get('mb.port') or '1883'}"
    if not urls_text:
        raise ConfigError("mb.urls is missing (mb.urls=host:port,host:port)", file=file,
                          option="mb.urls")
    urls = []
    for part in urls_text.split(","):
        entry = part.strip()
        m = _HOST_PORT.match(entry)
        if m is None or int(m.group(2)) > 65535:
            raise fail("mb.urls", f"{entry!r} is not host:port")
        urls.append((m.group(1), int(m.group(2))))

    def number(key: str, default: float, minimum: float = 0) -> float:
        value = get(key)
        if value is None or value == "":
            return default
        try:
            parsed = float(value)
        except ValueError:
            raise fail(key, f"expected a number, got {value!r}") from None
        if parsed < minimum:
            raise fail(key, f"must be at least {minimum:g}, got {value!r}")
        return parsed

    protocol = (get("mb.protocol") or "mqtt").lower()
    if protocol not in ("mqtt", "stomp"):
        raise fail("mb.protocol", f"must be mqtt or stomp, got {protocol!r}")
    durable_text = (get("mb.durable") or "false").lower()
    if durable_text not in ("true", "false"):
        raise fail("mb.durable", f"must be true or false, got {durable_text!r}")
    known = {"mb.urls", "mb.username", "mb.password", "mb.publisher.timeout", "mb.protocol",
             "mb.durable", "mb.client.id", "mb.alive.check.interval", "mb.retry.initial.delay",
             "mb.retry.max.delay", "mb.ip", "mb.port"}
    for key in props:
        if key.startswith("mb.") and key not in known:
            log.warning("%s: unknown agent option %s ignored", file or "agent.conf", key)
    return AgentConfig(
        urls=tuple(urls), username=get("mb.username") or None,
        password=get("mb.password") or None,
        publisher_timeout=number("mb.publisher.timeout", 900.0),
        protocol=protocol, durable=durable_text == "true",
        client_id=get("mb.client.id") or None,
        alive_check_interval=int(number("mb.alive.check.interval", 30, 1)),
        retry_initial_delay=int(number("mb.retry.initial.delay", 2000)),
        retry_max_delay=int(number("mb.retry.max.delay", 60_000)))


def load_agent_conf(path: Path | str) -> AgentConfig:
    p = Path(path)
    return parse_agent_conf(p.read_text(encoding="utf-8"), file=str(p))


def _client(config: AgentConfig, *, client_id: str | None, durable: bool,
            on_event: Callable[[Event], None] | None, timeout_ms: int = -1,
            dialer: Dialer | None = None) -> FailoverClient:
    interval = config.alive_check_interval
    return FailoverClient(
        "", spec=parse_failover(config.failover_uri(timeout_ms=timeout_ms)),
        login=config.username, passcode=config.password, client_id=client_id,
        durable=durable, keep_alive=interval,
        heartbeat_ms=(interval * 1000, interval * 1000), on_event=on_event, dialer=dialer)


class EventPublisher:
    """Publishes to the first available broker; drops an event after the timeout."""

    def __init__(self, config: AgentConfig, *,
                 on_event: Callable[[Event], None] | None = None,
                 dialer: Dialer | None = None) -> None:
        self.config = config
        self.client = _client(config, client_id=None if config.protocol == "stomp"
                              else f"pub-{uuid.uuid4().hex[:10]}", durable=False,
                              on_event=on_event, dialer=dialer)
        self.published = 0
        self.dropped = 0
        self.publisher_id = uuid.uuid4().hex[:12]
        self._seq: dict[str, int] = {}  # topic -> number of the last event published

    async def publish(self, topic: str, payload: bytes | str) -> bool:
        """True once a broker confirmed the event; False if it was dropped."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.publisher_timeout
        destination = topic if self.config.protocol == "mqtt" else stomp_topic(topic)
        seq = self._seq[topic] = self._seq.get(topic, 0) + 1
        try:
            await self.client.connect(timeout=max(0.0, deadline - loop.time()))
            await self.client.send(destination, payload,
                                   {SEQ_HEADER: f"{self.publisher_id}:{seq}"},
                                   timeout=max(0.0, deadline - loop.time()))
        except AuthenticationFailedError:
            raise  # permanent: not a drop, the application must fix the credentials
        except (OperationTimeoutError, ClientError) as exc:
            self.dropped += 1
            log.warning("event on %s dropped after %g s without a broker (%d dropped so "
                        "far): %s", topic, self.config.publisher_timeout, self.dropped, exc)
            return False
        self.published += 1
        return True

    async def close(self) -> None:
        await self.client.close()


class TopicSubscriber:
    """One topic subscription with its own connection, cycling the broker list for ever."""

    def __init__(self, config: AgentConfig, topic: str, callback: Callable[[Message], None],
                 *, on_event: Callable[[Event], None] | None = None,
                 dialer: Dialer | None = None) -> None:
        self.config = config
        self.topic = topic
        self.callback = callback
        durable = config.durable
        client_id = None
        if durable:
            base = config.client_id or "cartridge-agent"
            client_id = f"{base}-{re.sub(r'[^A-Za-z0-9_.-]', '_', topic)}"
        elif config.protocol == "mqtt":
            client_id = f"sub-{uuid.uuid4().hex[:10]}"
        self.client = _client(config, client_id=client_id, durable=durable and
                              config.protocol == "mqtt", on_event=on_event, dialer=dialer)
        self.subscription: Subscription | None = None
        self._task: asyncio.Task[None] | None = None
        self._on_event = on_event
        self.missed = 0  # events known not to have arrived (sequence gaps)
        self._last_seq: dict[tuple[str, str], int] = {}  # (publisher, topic) -> last n

    def start(self) -> None:
        """Subscribe in the background: returns at once, even with no broker up."""
        self._task = asyncio.create_task(self._subscribe(), name=f"agent sub {self.topic}")
        self._task.add_done_callback(self._subscribe_done)

    def _subscribe_done(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("subscription to %s failed: %s", self.topic, exc)

    def _deliver(self, msg: Message) -> None:
        self._check_sequence(msg)
        self.callback(msg)

    def _check_sequence(self, msg: Message) -> None:
        publisher, _, number = msg.headers.get(SEQ_HEADER, "").rpartition(":")
        if not publisher or not number.isdigit():
            return
        key, seq = (publisher, msg.destination), int(number)
        last = self._last_seq.get(key)
        if last is not None and seq <= last:
            return  # a repeat: nothing new
        self._last_seq[key] = seq
        if last is None or seq == last + 1:
            return
        gap = seq - last - 1
        self.missed += gap
        log.warning("%d event(s) on %s from publisher %s did not arrive (%d missed so far):"
                    " published while this non-durable subscription was away; "
                    "mb.durable=true keeps them", gap, msg.destination, publisher,
                    self.missed)
        if self._on_event is not None:
            try:
                self._on_event(Event(EventKind.EVENTS_MISSED, self.client.endpoint,
                                     topic=msg.destination, missed=gap))
            except Exception:
                log.exception("agent event listener failed on events-missed")

    async def _subscribe(self) -> None:
        durable_name = None
        destination = self.topic
        if self.config.protocol == "stomp":
            destination = stomp_topic(self.topic)
            if self.config.durable:
                durable_name = f"agent-{self.topic}"
        self.subscription = await self.client.subscribe(
            destination, qos=1, durable_name=durable_name, callback=self._deliver)

    async def wait_subscribed(self, timeout: float | None = None) -> None:
        assert self._task is not None, "start() first"
        async with asyncio.timeout(timeout):
            await asyncio.shield(self._task)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, ClientError):
                pass
        await self.client.close()


def stomp_topic(mqtt_topic: str) -> str:
    """An MQTT topic (filter) as a STOMP topic: ``a/+/#`` -> ``/topic/a.*.>``."""
    parts = ["*" if p == "+" else ">" if p == "#" else p for p in mqtt_topic.split("/")]
    return "/topic/" + ".".join(parts)


class Agent:
    """The blocking facade, for the agent's threads: ``Agent(load_agent_conf(path))``,
    then ``publish()`` and ``subscribe()`` from any thread; ``close()`` at the end."""

    def __init__(self, config: AgentConfig, *,
                 on_event: Callable[[Event], None] | None = None) -> None:
        """``on_event`` (called on the agent's loop thread) receives the failover events
        of every connection, ``FAILED`` with an ``AuthenticationFailedError`` when the
        login is refused, and ``EVENTS_MISSED`` from subscribers."""
        self.config = config
        self.on_event = on_event
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name="meshmq-agent")
        self._thread.start()
        self._subscribers: list[TopicSubscriber] = []

        async def make() -> EventPublisher:
            return EventPublisher(config, on_event=on_event)

        self.publisher = self._call(make())

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def publish(self, topic: str, payload: bytes | str) -> bool:
        """Blocks until published or dropped (``mb.publisher.timeout``); raises
        ``AuthenticationFailedError`` when the login is refused."""
        return self._call(self.publisher.publish(topic, payload))

    @property
    def dropped(self) -> int:
        return self.publisher.dropped

    @property
    def missed(self) -> int:
        """Events the subscribers know they missed (see ``TopicSubscriber.missed``)."""
        return sum(sub.missed for sub in self._subscribers)

    def subscribe(self, topic: str, callback: Callable[[Message], None]) -> TopicSubscriber:
        """Start a subscription; ``callback`` runs on the agent's loop thread."""
        async def make() -> TopicSubscriber:
            sub = TopicSubscriber(self.config, topic, callback, on_event=self.on_event)
            sub.start()
            return sub

        sub = self._call(make())
        self._subscribers.append(sub)
        return sub

    def wait_subscribed(self, sub: TopicSubscriber, timeout: float = 30) -> None:
        self._call(sub.wait_subscribed(timeout))

    def close(self) -> None:
        async def stop() -> None:
            for sub in self._subscribers:
                await sub.close()
            await self.publisher.close()

        try:
            self._call(stop())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            if not self._thread.is_alive():
                self._loop.close()
