"""Jolokia reads of the broker and queue MBeans, called through the real management
application without a socket: attribute selection, wildcard patterns, Jolokia's error
shape, and POSTed single and bulk requests."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import pytest
from tests.support.memory_broker import StompClient, memory_config
from tests.support.memory_management import MemoryManagement, memory_management

from meshmq import __version__

BROKER = "org.apache.activemq:type=Broker,brokerName=test"
QUEUE = BROKER + ",destinationType=Queue,destinationName="


@pytest.fixture
def api() -> Iterator[MemoryManagement]:
    with memory_management(memory_config(broker_name="test")) as api:
        yield api


def client(api: MemoryManagement) -> StompClient:
    c = api.broker.stomp()
    assert c.connect("1.0").command == "CONNECTED"
    return c


def send(c: StompClient, dest: str, n: int) -> None:
    for i in range(n):
        c.send("SEND", {"destination": dest, "receipt": f"r{i}"}, b"x")
        assert c.expect().command == "RECEIPT"


def read(api: MemoryManagement, mbean: str, attrs: str = "") -> Any:
    path = "/api/jolokia/read/" + quote(mbean, safe=":=,*") + (f"/{attrs}" if attrs else "")
    return api.get(path)


def statistics(api: MemoryManagement) -> dict[str, Any]:
    stats: dict[str, Any] = api.broker.runtime.broker.statistics()
    return stats


def test_broker_mbean(api: MemoryManagement) -> None:
    c = client(api)
    send(c, "/queue/a", 3)
    send(c, "/topic/t", 2)
    answer = read(api, BROKER)
    assert answer["status"] == 200 and answer["request"] == {"type": "read", "mbean": BROKER}
    assert isinstance(answer["timestamp"], int)
    value = answer["value"]
    stat = statistics(api)
    assert value["BrokerName"] == "test" and value["BrokerVersion"] == __version__
    assert value["TotalEnqueueCount"] == 5
    assert value["TotalMessageCount"] == 3
    assert value["CurrentConnectionsCount"] == 1
    assert value["TotalConnectionsCount"] == 1
    c.send("DISCONNECT")
    c.wait_closed()
    again = client(api)
    api.poll(lambda: read(api, BROKER, "CurrentConnectionsCount")["value"] == 1,
             what="the first connection gone")
    assert read(api, BROKER, "TotalConnectionsCount")["value"] == 2
    again.send("DISCONNECT")
    assert value["Slave"] is False
    assert value["MemoryLimit"] == stat["memory"]["limit"]
    assert value["Queues"] == [{"objectName": "org.apache.activemq:brokerName=test,"
                                "destinationName=a,destinationType=Queue,type=Broker"}]
    one = read(api, BROKER, "TotalMessageCount")
    assert one["value"] == 3 and one["request"]["attribute"] == "TotalMessageCount"
    two = read(api, BROKER, "BrokerName,Slave")
    assert two["value"] == {"BrokerName": "test", "Slave": False}


def test_queue_mbean_and_pattern_read(api: MemoryManagement) -> None:
    c = client(api)
    send(c, "/queue/orders", 4)
    send(c, "/queue/invoices", 1)
    c.send("SUBSCRIBE", {"destination": "/queue/invoices", "id": "1", "ack": "client"})
    c.expect("MESSAGE")  # the one message, not acknowledged: in flight
    api.poll(lambda: read(api, QUEUE + "invoices", "InFlightCount")["value"] == 1,
             what="the delivery in flight")
    orders = read(api, QUEUE + "orders")["value"]
    assert orders["Name"] == "orders" and orders["QueueSize"] == 4
    assert orders["EnqueueCount"] == 4 and orders["ConsumerCount"] == 0
    memory = next(d["memory"] for d in statistics(api)["destinations"] if d["name"] == "orders")
    assert orders["MemoryUsageByteCount"] == memory > 0
    every = read(api, BROKER + ",destinationType=Queue,destinationName=*",
                 "QueueSize,ConsumerCount")["value"]
    assert every == {
        "org.apache.activemq:brokerName=test,destinationName=invoices,"
        "destinationType=Queue,type=Broker": {"QueueSize": 1, "ConsumerCount": 1},
        "org.apache.activemq:brokerName=test,destinationName=orders,"
        "destinationType=Queue,type=Broker": {"QueueSize": 4, "ConsumerCount": 0}}


def test_errors_have_jolokias_shape(api: MemoryManagement) -> None:
    missing = read(api, QUEUE + "nope")
    assert missing["status"] == 404
    assert missing["error_type"] == "javax.management.InstanceNotFoundException"
    assert "nope" in missing["error"]
    bad_attr = read(api, BROKER, "NoSuchThing")
    assert bad_attr["status"] == 404
    assert bad_attr["error_type"] == "javax.management.AttributeNotFoundException"
    assert "NoSuchThing" in bad_attr["error"]
    malformed = read(api, "no-colon-here")
    assert malformed["status"] == 400 and "DOMAIN:key=value" in malformed["error"]
    other_broker = read(api, "org.apache.activemq:type=Broker,brokerName=other")
    assert other_broker["status"] == 404


def test_post_single_and_bulk(api: MemoryManagement) -> None:
    status, answer = api.call("POST", "/api/jolokia",
                              {"type": "read", "mbean": BROKER, "attribute": "BrokerName"})
    assert status == 200 and answer["value"] == "test"
    status, answers = api.call("POST", "/api/jolokia", [
        {"type": "read", "mbean": BROKER, "attribute": ["Slave", "TotalMessageCount"]},
        {"type": "exec", "mbean": BROKER, "operation": "stop"},
        {"type": "version"}])
    assert status == 200 and [a["status"] for a in answers] == [200, 400, 200]
    assert answers[0]["value"] == {"Slave": False, "TotalMessageCount": 0}
    assert "\"exec\" is not served" in answers[1]["error"].replace("'", "\"")
    assert answers[2]["value"]["agent"] == f"meshmq {__version__}"
    status, answer = api.call("POST", "/api/jolokia", "just text")
    assert status == 200 and answer["status"] == 400
