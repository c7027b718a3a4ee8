"""The Jolokia-compatible reads over real HTTP: the Broker and Queue/Topic mbeans from the
broker's own statistics, pattern reads, bulk POSTs, Jolokia's error shape, and the kind
of check a Nagios user runs against ActiveMQ (urllib reads, exit status by threshold)."""

from __future__ import annotations

import json
import urllib.request
from typing import Any
from urllib.parse import quote

from meshmq import __version__
from tests.interop.stomp_helpers import RawClient
from tests.management.http import call, get
from tests.support.brokers import ThreadBroker, poll

BROKER = "org.apache.activemq:type=Broker,brokerName=test"
QUEUE = BROKER + ",destinationType=Queue,destinationName="


def send(client: RawClient, dest: str, n: int) -> None:
    for i in range(n):
        client.send_frame("SEND", [("destination", dest), ("receipt", f"r{i}")], b"x")
        assert client.read_frame().command == "RECEIPT"


def read(port: int, mbean: str, attrs: str = "") -> Any:
    path = "/api/jolokia/read/" + quote(mbean, safe=":=,*") + (f"/{attrs}" if attrs else "")
    return get(port, path)


def check_queue_depth(port: int, queue: str, warn: int, crit: int) -> tuple[int, str]:
    """What a Nagios plugin does: read QueueSize, exit 0/1/2 by threshold."""
    url = (f"http://127.0.0.1:{port}/api/jolokia/read/"
           f"org.apache.activemq:type=Broker,brokerName=*,destinationType=Queue,"
           f"destinationName={queue}/QueueSize")
    req = urllib.request.Request(url, headers={"Origin": "http://localhost"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        answer = json.loads(resp.read())
    if answer["status"] != 200:
        return 3, f"UNKNOWN - {answer['error']}"
    size = next(iter(answer["value"].values()))["QueueSize"]
    code = 2 if size >= crit else 1 if size >= warn else 0
    return code, f"{('OK', 'WARNING', 'CRITICAL')[code]} - {queue} QueueSize={size}"


def test_broker_mbean(broker: ThreadBroker) -> None:
    port = broker.management_port
    client = RawClient(broker)
    client.connect()
    send(client, "/queue/a", 3)
    send(client, "/topic/t", 2)
    answer = read(port, BROKER)
    assert answer["status"] == 200 and answer["request"] == {"type": "read", "mbean": BROKER}
    assert isinstance(answer["timestamp"], int)
    value = answer["value"]
    stat = broker.stats()
    assert value["BrokerName"] == "test" and value["BrokerVersion"] == __version__
    assert value["TotalEnqueueCount"] == 5
    assert value["TotalMessageCount"] == 3
    assert value["CurrentConnectionsCount"] == 1
    assert value["TotalConnectionsCount"] == 1
    client.close()
    again = RawClient(broker)
    again.connect()
    poll(lambda: read(port, BROKER, "CurrentConnectionsCount")["value"] == 1,
         what="the first connection gone")
    assert read(port, BROKER, "TotalConnectionsCount")["value"] == 2
    again.close()
    assert value["Slave"] is False
    assert value["MemoryLimit"] == stat["memory"]["limit"]
    assert value["Queues"] == [{"objectName": "org.apache.activemq:brokerName=test,"
                                "destinationName=a,destinationType=Queue,type=Broker"}]
    one = read(port, BROKER, "TotalMessageCount")
    assert one["value"] == 3 and one["request"]["attribute"] == "TotalMessageCount"
    two = read(port, BROKER, "BrokerName,Slave")
    assert two["value"] == {"BrokerName": "test", "Slave": False}
    client.close()


def test_queue_mbean_and_pattern_read(broker: ThreadBroker) -> None:
    port = broker.management_port
    client = RawClient(broker)
    client.connect()
    send(client, "/queue/orders", 4)
    send(client, "/queue/invoices", 1)
    client.send_frame("SUBSCRIBE", [("destination", "/queue/invoices"), ("id", "1"),
                                    ("ack", "client")])
    client.read_frame()  # the one message, not acknowledged: in flight
    poll(lambda: read(port, QUEUE + "invoices", "InFlightCount")["value"] == 1,
         what="the delivery in flight")
    orders = read(port, QUEUE + "orders")["value"]
    assert orders["Name"] == "orders" and orders["QueueSize"] == 4
    assert orders["EnqueueCount"] == 4 and orders["ConsumerCount"] == 0
    assert orders["MemoryUsageByteCount"] == broker.destination_stats("orders")["memory"]
    every = read(port, BROKER + ",destinationType=Queue,destinationName=*",
                 "QueueSize,ConsumerCount")["value"]
    assert every == {
        "org.apache.activemq:brokerName=test,destinationName=invoices,"
        "destinationType=Queue,type=Broker": {"QueueSize": 1, "ConsumerCount": 1},
        "org.apache.activemq:brokerName=test,destinationName=orders,"
        "destinationType=Queue,type=Broker": {"QueueSize": 4, "ConsumerCount": 0}}
    client.close()


def test_errors_have_jolokias_shape(broker: ThreadBroker) -> None:
    port = broker.management_port
    missing = read(port, QUEUE + "nope")
    assert missing["status"] == 404
    assert missing["error_type"] == "javax.management.InstanceNotFoundException"
    assert "nope" in missing["error"]
    bad_attr = read(port, BROKER, "NoSuchThing")
    assert bad_attr["status"] == 404
    assert bad_attr["error_type"] == "javax.management.AttributeNotFoundException"
    assert "NoSuchThing" in bad_attr["error"]
    malformed = read(port, "no-colon-here")
    assert malformed["status"] == 400 and "DOMAIN:key=value" in malformed["error"]
    other_broker = read(port, "org.apache.activemq:type=Broker,brokerName=other")
    assert other_broker["status"] == 404


def test_post_single_and_bulk(broker: ThreadBroker) -> None:
    port = broker.management_port
    status, answer = call(port, "POST", "/api/jolokia",
                          {"type": "read", "mbean": BROKER, "attribute": "BrokerName"})
    assert status == 200 and answer["value"] == "test"
    status, answers = call(port, "POST", "/api/jolokia", [
        {"type": "read", "mbean": BROKER, "attribute": ["Slave", "TotalMessageCount"]},
        {"type": "exec", "mbean": BROKER, "operation": "stop"},
        {"type": "version"}])
    assert status == 200 and [a["status"] for a in answers] == [200, 400, 200]
    assert answers[0]["value"] == {"Slave": False, "TotalMessageCount": 0}
    assert "\"exec\" is not served" in answers[1]["error"].replace("'", "\"")
    assert answers[2]["value"]["agent"] == f"meshmq {__version__}"
    status, answer = call(port, "POST", "/api/jolokia", "just text")
    assert status == 200 and answer["status"] == 400


def test_a_nagios_style_check(broker: ThreadBroker) -> None:
    port = broker.management_port
    client = RawClient(broker)
    client.connect()
    send(client, "/queue/jobs", 1)
    assert check_queue_depth(port, "jobs", warn=5, crit=10) == (0, "OK - jobs QueueSize=1")
    send(client, "/queue/jobs", 5)
    assert check_queue_depth(port, "jobs", warn=5, crit=10) == (
        1, "WARNING - jobs QueueSize=6")
    send(client, "/queue/jobs", 4)
    assert check_queue_depth(port, "jobs", warn=5, crit=10)[0] == 2
    code, text = check_queue_depth(port, "absent", warn=5, crit=10)
    assert code == 3 and text.startswith("UNKNOWN")
    client.close()
