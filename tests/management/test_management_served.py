"""The management app as operators reach it: a real broker's listener over real HTTP,
one request per resource family. What each route answers is tested without a socket
(tests/unit/management/); this proves the served app routes and answers them."""

from __future__ import annotations

import http.client

from tests.interop.stomp_helpers import RawClient
from tests.management.http import all_ids, call, get, ok, q
from tests.support.brokers import ThreadBroker


def test_each_resource_family_answers_over_http(broker: ThreadBroker) -> None:
    port = broker.management_port
    client = RawClient(broker)
    client.connect()
    client.send_frame("SEND", [("destination", "/queue/served"), ("receipt", "r")], b"hello")
    assert client.read_frame().command == "RECEIPT"

    document = get(port, "/api/broker")
    assert document["name"] == "test"
    assert document["limits"]["max_connections"] == {"stomp": 1000}  # per listener
    served = get(port, f"/api/destinations/queue/{q('served')}")
    assert served["depth"] == 1
    (message_id,) = all_ids(port, "served")
    message = get(port, f"/api/queues/{q('served')}/messages/{q(message_id)}")
    assert message["body"] == "hello"
    assert ok(port, "POST", "/api/destinations", {"type": "topic", "name": "made"},
              status=201)["name"] == "made"
    connections = get(port, "/api/connections")["connections"]
    assert [c["protocol"] for c in connections] == ["stomp"]
    assert get(port, "/api/network")["connectors"] == []
    jolokia = get(port, "/api/jolokia/read/org.apache.activemq:type=Broker,brokerName=test"
                        "/BrokerName")
    assert jolokia["value"] == "test"
    status, body = call(port, "GET", "/api/nothing-here")
    assert status == 404 and "error" in body
    assert ok(port, "POST", f"/api/destinations/queue/{q('served')}/purge") == {"purged": 1}

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", "/metrics")
        resp = conn.getresponse()
        text = resp.read().decode()
    finally:
        conn.close()
    assert resp.status == 200
    assert "meshmq_messages_enqueued" in text
    client.close()
