"""MQTT state across a broker crash: a real subprocess broker (fsync on) killed with
SIGKILL and restarted on the same data directory.

* retained messages (and their clearing) survive;
* a persistent session's subscription and its queued QoS 1 messages survive;
* QoS 2: PUBREC received, broker killed, restarted; the client resumes its session,
  sends PUBREL and gets PUBCOMP, and the message reaches a persistent subscriber exactly
  once.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.interop.mqtt_helpers import LEVELS, RawMqtt, uid
from tests.support.brokers import ProcessBroker

from meshmq.protocol.mqtt import Properties, Pubcomp, Publish, Pubrec, Pubrel, ReasonCode

pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]


class Crashy:
    """A subprocess broker with STOMP and MQTT listeners that can be SIGKILLed."""

    def __init__(self, tmp_path: Path) -> None:
        self.config = tmp_path / "meshmq.toml"
        self.config.write_text(f"""
[broker]
name = "mqtt-crashy"
data_directory = "{tmp_path / 'data'}"

[[listeners]]
name = "stomp"
url = "stomp://127.0.0.1:0"

[[listeners]]
name = "mqtt"
url = "mqtt://127.0.0.1:0"

[store]
fsync = true

[mqtt]
sys_interval_ms = 0

[management]
enabled = false
""")
        self.log = tmp_path / "broker.log"
        self.proc: ProcessBroker | None = None
        self.clients: list[RawMqtt] = []

    def start(self) -> None:
        self.proc = ProcessBroker(self.config, self.log).start()
        assert "mqtt" in self.proc.ports, self.log.read_text()

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.kill9()
        for c in self.clients:
            c.close()
        self.clients.clear()

    def raw(self, level: int) -> RawMqtt:
        assert self.proc is not None
        r = RawMqtt(self.proc.ports["mqtt"], level)
        self.clients.append(r)
        return r

    def stop(self) -> None:
        for c in self.clients:
            c.close()
        if self.proc is not None and self.proc.proc is not None \
                and self.proc.proc.poll() is None:
            self.proc.terminate()


@pytest.fixture
def crashy(tmp_path: Path) -> Iterator[Crashy]:
    c = Crashy(tmp_path)
    c.start()
    try:
        yield c
    finally:
        c.stop()


def persistent(raw: RawMqtt, cid: str) -> bool:
    props = Properties(session_expiry_interval=3600) if raw.level == 5 else None
    return raw.connect(cid, clean=False, properties=props).session_present


@pytest.mark.parametrize("level", LEVELS)
def test_retained_message_survives_sigkill(crashy: Crashy, level: int) -> None:
    kept = uid("keep/")
    cleared = uid("cleared/")
    pub = crashy.raw(level)
    pub.connect(uid("pub"))
    pub.publish(kept, b"old", qos=1, retain=True)
    pub.publish(kept, b"survivor", qos=1, retain=True)
    pub.publish(cleared, b"gone soon", qos=1, retain=True)
    pub.publish(cleared, b"", qos=1, retain=True)  # PUBACK after the fsync
    crashy.kill9()
    crashy.start()
    sub = crashy.raw(level)
    sub.connect(uid("sub"))
    sub.subscribe(kept, cleared, qos=1)
    got = sub.ping()
    assert [(p.topic, p.payload, p.retain) for p in got] == \
        [(kept, b"survivor", True)]  # type: ignore[union-attr]


@pytest.mark.parametrize("level", LEVELS)
def test_persistent_session_and_queued_qos1_survive_sigkill(crashy: Crashy,
                                                             level: int) -> None:
    cid = uid("durable")
    topic = uid("queued/")
    sub = crashy.raw(level)
    assert persistent(sub, cid) is False
    sub.subscribe(topic, qos=1)
    sub.disconnect()
    sub.until_closed()
    pub = crashy.raw(level)
    pub.connect(uid("pub"))
    for i in range(3):
        pub.publish(topic, b"q%d" % i, qos=1)
    crashy.kill9()
    crashy.start()
    back = crashy.raw(level)
    assert persistent(back, cid) is True
    got = back.publishes(3)
    assert [(p.topic, p.payload, p.qos) for p in got] == \
        [(topic, b"q0", 1), (topic, b"q1", 1), (topic, b"q2", 1)]
    for p in got:
        back.ack(p)
    # the subscription itself came back too: a new message is delivered live
    pub2 = crashy.raw(level)
    pub2.connect(uid("pub2"))
    pub2.publish(topic, b"after restart", qos=1)
    live = back.expect(Publish)
    assert live.payload == b"after restart"
    back.ack(live)
    assert back.ping() == []


@pytest.mark.parametrize("level", LEVELS)
def test_qos2_pubrel_after_sigkill_completes_exactly_once(crashy: Crashy, level: int) -> None:
    topic = uid("q2crash/")
    sub_id = uid("q2sub")
    sub = crashy.raw(level)
    persistent(sub, sub_id)
    sub.subscribe(topic, qos=2)
    sub.disconnect()
    sub.until_closed()

    pub_id = uid("q2pub")
    pub = crashy.raw(level)
    persistent(pub, pub_id)
    pub.send(Publish(topic, b"exactly once", qos=2, packet_id=321))
    rec = pub.expect(Pubrec)
    assert rec.packet_id == 321 and rec.reason_code == ReasonCode.SUCCESS
    crashy.kill9()  # before PUBREL
    crashy.start()

    again = crashy.raw(level)
    present = persistent(again, pub_id)
    again.send(Pubrel(321))
    comp = again.expect(Pubcomp)
    assert comp.packet_id == 321
    again.publish(topic, b"marker", qos=1)

    back = crashy.raw(level)
    assert persistent(back, sub_id) is True
    first = back.expect(Publish)
    assert (first.payload, first.qos) == (b"exactly once", 2)
    back.ack(first)
    second = back.expect(Publish)
    assert second.payload == b"marker"  # nothing in between: delivered exactly once
    back.ack(second)
    assert back.ping() == []
    # the publisher's session (with its unfinished QoS 2 exchange) survived: CONNACK says
    # so (a client told "no session" must discard its state and never send PUBREL) and
    # the PUBREL finds its packet identifier (not 0x92)
    assert (present, comp.reason_code) == (True, ReasonCode.SUCCESS)
