"""Jolokia reads that monitoring templates rely on, through the real management application
without a socket: topic and dead-letter queue mbeans, ``*`` and ``?`` patterns, GET path
escapes, ActiveMQ's Uptime text, the version request, and Jolokia's error shape (HTTP 200
with ``status``, ``error_type`` and ``error``) for each kind of bad request."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import pytest
from tests.support.memory_broker import memory_config
from tests.support.memory_management import MemoryManagement, memory_management

from meshmq import __version__
from meshmq.config.model import StoreConfig
from meshmq.management.routes_jolokia import _uptime_text, split_path

BROKER = "org.apache.activemq:type=Broker,brokerName=test"
QUEUE = BROKER + ",destinationType=Queue,destinationName="
TOPIC = BROKER + ",destinationType=Topic,destinationName="
MALFORMED = "javax.management.MalformedObjectNameException"
NOT_FOUND = "javax.management.InstanceNotFoundException"
NO_ATTRIBUTE = "javax.management.AttributeNotFoundException"
BAD_REQUEST = "java.lang.IllegalArgumentException"


def canonical(kind: str, name: str) -> str:
    return (f"org.apache.activemq:brokerName=test,destinationName={name},"
            f"destinationType={kind},type=Broker")


@pytest.fixture
def api() -> Iterator[MemoryManagement]:
    with memory_management(memory_config(broker_name="test")) as api:
        for kind, name in (("queue", "orders.eu"), ("queue", "orders.us"),
                           ("queue", "ActiveMQ.DLQ"), ("queue", "DLQ.orders"),
                           ("topic", "prices")):
            api.ok("POST", "/api/destinations", {"type": kind, "name": name}, 201)
        for body in ("a", "b"):
            api.ok("POST", "/api/destinations/queue/orders.eu/send",
                   {"body": body, "persistent": False}, 201)
        api.ok("POST", "/api/destinations/topic/prices/send", {"body": "1.5"}, 201)
        yield api


def read(api: MemoryManagement, mbean: str, attrs: str = "") -> Any:
    path = "/api/jolokia/read/" + quote(mbean, safe=":=,*") + (f"/{attrs}" if attrs else "")
    return api.get(path)


def post(api: MemoryManagement, body: object) -> Any:
    status, answer = api.call("POST", "/api/jolokia", body)
    assert status == 200, answer  # Jolokia answers errors inside a 200
    return answer


@pytest.mark.parametrize(("path", "parts"), [
    pytest.param("a:b=c/Attr", ["a:b=c", "Attr"], id="plain"),
    pytest.param("a:path=x!/y/Attr", ["a:path=x/y", "Attr"], id="escaped-slash"),
    pytest.param("a:name=hi!!/Attr", ["a:name=hi!", "Attr"], id="escaped-bang"),
    pytest.param("a:b=c//Attr/", ["a:b=c", "Attr"], id="empty-parts-dropped"),
])
def test_get_paths_split_on_slashes_with_jolokias_escapes(path: str,
                                                          parts: list[str]) -> None:
    assert split_path(path) == parts


@pytest.mark.parametrize(("ms", "text"), [
    pytest.param(0, "0.000 seconds", id="zero"),
    pytest.param(59_999, "59.999 seconds", id="under-a-minute"),
    pytest.param(60_000, "1 minute", id="one-minute"),
    pytest.param(3_720_000, "1 hour 2 minutes", id="hours-and-minutes"),
    pytest.param(2 * 86_400_000 + 61_000, "2 days 1 minute", id="days-skip-zero-hours"),
])
def test_uptime_is_written_as_activemq_writes_it(ms: int, text: str) -> None:
    assert _uptime_text(ms) == text


def test_a_topic_mbean_counts_what_was_published(api: MemoryManagement) -> None:
    answer = read(api, TOPIC + "prices", "Name,EnqueueCount,QueueSize,DLQ")
    assert answer["status"] == 200
    assert answer["value"] == {"Name": "prices", "EnqueueCount": 1, "QueueSize": 0,
                               "DLQ": False}


def test_the_broker_lists_its_topics_by_canonical_name(api: MemoryManagement) -> None:
    topics = read(api, BROKER, "Topics")["value"]
    assert {"objectName": canonical("Topic", "prices")} in topics
    assert all(t["objectName"].endswith("destinationType=Topic,type=Broker") for t in topics)


def test_dead_letter_queues_say_so(api: MemoryManagement) -> None:
    every = read(api, QUEUE + "*", "DLQ")["value"]
    assert every == {canonical("Queue", "ActiveMQ.DLQ"): {"DLQ": True},
                     canonical("Queue", "DLQ.orders"): {"DLQ": True},
                     canonical("Queue", "orders.eu"): {"DLQ": False},
                     canonical("Queue", "orders.us"): {"DLQ": False}}


def test_a_question_mark_matches_one_character(api: MemoryManagement) -> None:
    value = read(api, QUEUE + "orders.?s", "QueueSize")["value"]
    assert value == {canonical("Queue", "orders.us"): {"QueueSize": 0}}


def test_a_pattern_over_the_destination_type_finds_queues_and_topics(
        api: MemoryManagement) -> None:
    value = read(api, BROKER + ",destinationType=*,destinationName=*",
                 "EnqueueCount")["value"]
    assert value[canonical("Queue", "orders.eu")] == {"EnqueueCount": 2}
    assert value[canonical("Topic", "prices")] == {"EnqueueCount": 1}


def test_a_pattern_over_the_broker_name_answers_a_map(api: MemoryManagement) -> None:
    value = read(api, "org.apache.activemq:type=Broker,brokerName=*", "BrokerName")["value"]
    assert value == {"org.apache.activemq:brokerName=test,type=Broker": {"BrokerName": "test"}}


def test_a_queue_mbean_reports_its_memory_share(api: MemoryManagement) -> None:
    value = read(api, QUEUE + "orders.eu", "MemoryUsageByteCount,MemoryLimit,"
                 "MemoryPercentUsage")["value"]
    limit = api.broker.runtime.broker.usage.limit
    assert value["MemoryLimit"] == limit > 0
    assert value["MemoryUsageByteCount"] > 0
    assert value["MemoryPercentUsage"] == int(100 * value["MemoryUsageByteCount"] / limit)


@pytest.mark.parametrize(("persistent", "kind", "expected"), [
    pytest.param(False, "journal", False, id="persistent-false"),
    pytest.param(True, "memory", False, id="memory-store"),
    pytest.param(True, "journal", True, id="journal"),
])
def test_persistent_says_whether_messages_reach_a_disk(persistent: bool, kind: str,
                                                        expected: bool) -> None:
    config = memory_config(broker_name="test", persistent=persistent,
                           store=StoreConfig(kind=kind))
    with memory_management(config) as api:
        assert read(api, BROKER, "Persistent")["value"] is expected


def test_an_attribute_list_answers_a_map_even_for_one_name(api: MemoryManagement) -> None:
    as_list = post(api, {"type": "read", "mbean": BROKER, "attribute": ["BrokerName"]})
    as_name = post(api, {"type": "read", "mbean": BROKER, "attribute": "BrokerName"})
    assert as_list["value"] == {"BrokerName": "test"}
    assert as_name["value"] == "test"
    assert as_list["request"]["attribute"] == ["BrokerName"]  # the request is echoed


def test_the_version_request_names_the_agent(api: MemoryManagement) -> None:
    answer = api.get("/api/jolokia/version")
    assert answer["status"] == 200
    assert answer["value"]["agent"] == f"meshmq {__version__}"
    assert answer["value"]["info"]["version"] == __version__
    assert answer["request"] == {"type": "version"}


# Each row: an mbean name GET reads, and the Jolokia error it must get.
@pytest.mark.parametrize(("mbean", "attrs", "status", "error_type", "words"), [
    pytest.param("org.apache.activemq:type=", "", 400, MALFORMED, "key=value expected",
                 id="key-without-value"),
    pytest.param("org.apache.activemq:", "", 400, MALFORMED, "Key properties cannot be empty",
                 id="no-keys"),
    pytest.param("java.lang:type=Memory", "", 404, NOT_FOUND, "java.lang:type=Memory",
                 id="other-domain"),
    pytest.param(BROKER + ",destinationType=Stack,destinationName=orders.eu", "", 404,
                 NOT_FOUND, "destinationType=Stack", id="unknown-destination-type"),
    pytest.param(BROKER + ",service=Health", "", 404, NOT_FOUND, "service=Health",
                 id="unknown-key"),
    pytest.param(QUEUE + "nothing.*", "", 404, NOT_FOUND, "No MBean found for pattern",
                 id="pattern-matches-nothing"),
    pytest.param(QUEUE + "*", "QueueSize,Colour", 404, NO_ATTRIBUTE,
                 "No such attribute: Colour", id="pattern-attribute"),
])
def test_each_bad_read_has_jolokias_error_shape(api: MemoryManagement, mbean: str,
                                                attrs: str, status: int, error_type: str,
                                                words: str) -> None:
    answer = read(api, mbean, attrs)
    assert (answer["status"], answer["error_type"]) == (status, error_type)
    assert words in answer["error"] and answer["error"].startswith(error_type)
    assert "value" not in answer


# Each row: a POSTed body, and the words of the IllegalArgumentException it must get.
@pytest.mark.parametrize(("body", "words"), [
    pytest.param({"type": "read"}, "a read needs \"mbean\"", id="no-mbean"),
    pytest.param({"type": "read", "mbean": 5}, "a read needs \"mbean\"", id="mbean-number"),
    pytest.param({"type": "read", "mbean": BROKER, "attribute": [1]},
                 "\"attribute\" must be a name or a list of names", id="attribute-numbers"),
    pytest.param({"type": "read", "mbean": BROKER, "attribute": {"a": 1}},
                 "\"attribute\" must be a name or a list of names", id="attribute-object"),
    pytest.param({"type": "write", "mbean": BROKER}, "request type 'write' is not served",
                 id="write"),
    pytest.param({"mbean": BROKER}, "request type None is not served", id="no-type"),
    pytest.param(None, "the body must be a request object", id="empty"),
    pytest.param([{"type": "version"}, "read"], "the body must be a request object",
                 id="bulk-with-a-string"),
])
def test_each_bad_post_is_an_illegal_argument(api: MemoryManagement, body: object,
                                              words: str) -> None:
    answer = post(api, body)
    assert (answer["status"], answer["error_type"]) == (400, BAD_REQUEST)
    assert words in answer["error"]


def test_a_post_that_is_not_json_is_an_illegal_argument(api: MemoryManagement) -> None:
    reply = api.request("POST", "/api/jolokia", b"{type: read}",
                        {"Content-Type": "application/json"})
    assert reply.status == 200
    answer = reply.json()
    assert (answer["status"], answer["error_type"]) == (400, BAD_REQUEST)
    assert "the body is not valid JSON" in answer["error"]


def test_one_bad_request_of_a_bulk_leaves_the_others_answered(api: MemoryManagement) -> None:
    answers = post(api, [{"type": "read", "mbean": QUEUE + "orders.eu",
                          "attribute": "QueueSize"},
                         {"type": "read", "mbean": QUEUE + "gone", "attribute": "QueueSize"},
                         {"type": "read", "mbean": QUEUE + "orders.us",
                          "attribute": "QueueSize"}])
    assert [a["status"] for a in answers] == [200, 404, 200]
    assert [a.get("value") for a in answers] == [2, None, 0]
