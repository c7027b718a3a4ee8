"""The Jolokia-compatible reads over real HTTP, as a Nagios user's check runs them against
ActiveMQ (urllib reads with an Origin header, exit status by threshold). What each mbean
and attribute answers is tested without a socket in
tests/unit/management/test_management_jolokia.py."""

from __future__ import annotations

import json
import urllib.request

from tests.interop.stomp_helpers import RawClient
from tests.support.brokers import ThreadBroker

BROKER = "org.apache.activemq:type=Broker,brokerName=test"
QUEUE = BROKER + ",destinationType=Queue,destinationName="


def send(client: RawClient, dest: str, n: int) -> None:
    for i in range(n):
        client.send_frame("SEND", [("destination", dest), ("receipt", f"r{i}")], b"x")
        assert client.read_frame().command == "RECEIPT"


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
