"""Every refusal of the admin API is an HTTP 4xx (or a logged 500) with a JSON body whose
``error`` says what was wrong, through the real application without a socket: aiohttp's
own 404/405/413, bodies that are not JSON objects, each field of the wrong type, query
numbers out of range, names that are no destination, and the core's conflicts."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
from tests.support.memory_broker import memory_config
from tests.support.memory_management import MemoryManagement, memory_management

from meshmq.config.model import StreamPolicy
from meshmq.management import app as management_app
from meshmq.management import routes_core


@pytest.fixture
def api() -> Iterator[MemoryManagement]:
    config = memory_config(streams=(StreamPolicy(match="queue://stream.>"),))
    with memory_management(config) as api:
        api.ok("POST", "/api/destinations", {"type": "queue", "name": "work"}, 201)
        yield api


def refused(api: MemoryManagement, method: str, path: str, body: object = None,
            raw: bytes | None = None) -> tuple[int, str]:
    """The status and ``error`` of a refused request; the body must be JSON."""
    if raw is not None:
        reply = api.request(method, path, raw, {"Content-Type": "application/json"})
        assert reply.content_type == "application/json", reply.text
        status, answer = reply.status, reply.json()
    else:
        status, answer = api.call(method, path, body)
    assert 400 <= status < 600, (method, path, status, answer)
    assert isinstance(answer["error"], str) and answer["error"], answer
    return status, str(answer["error"])


def test_an_unknown_path_is_a_json_404_naming_it(api: MemoryManagement) -> None:
    reply = api.request("GET", "/api/nothing/here")
    assert reply.status == 404 and reply.content_type == "application/json"
    assert reply.json() == {"error": "no such resource: /api/nothing/here"}


def test_a_method_a_route_does_not_serve_is_405_listing_the_allowed_ones(
        api: MemoryManagement) -> None:
    status, answer = api.call("DELETE", "/api/health")
    assert status == 405
    assert answer == {"error": "method DELETE not allowed on /api/health",
                      "allowed": ["GET", "HEAD"]}


def test_a_body_over_the_limit_is_413_in_json(api: MemoryManagement) -> None:
    too_big = b" " * (management_app.MAX_REQUEST_BODY + 1)
    status, error = refused(api, "POST", "/api/destinations", raw=too_big)
    assert status == 413 and "Too Large" in error
    # The broker serves the next request as before.
    assert api.get("/api/health")["status"] == "ok"


def test_a_handler_that_fails_is_a_logged_500_and_the_broker_keeps_serving(
        api: MemoryManagement, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    def broken(body: object, status: int = 200) -> Any:
        raise RuntimeError("a bug in a handler")

    monkeypatch.setattr(routes_core, "reply", broken)
    with caplog.at_level(logging.ERROR, logger="meshmq.management"):
        status, answer = api.call("GET", "/api/stat")
    assert status == 500
    assert answer == {"error": "internal error; the broker log has the details"}
    assert "management request GET /api/stat failed" in caplog.text
    assert "a bug in a handler" in caplog.text  # the traceback is in the log
    assert api.get("/api/destinations/queue/work")["name"] == "work"


@pytest.mark.parametrize(("raw", "words"), [
    pytest.param(b"{not json", "the request body is not valid JSON", id="syntax"),
    pytest.param(b"\xff\xfe{}", "the request body is not valid JSON", id="not-utf8"),
    pytest.param(b'["queue", "x"]', "the request body must be a JSON object", id="array"),
    pytest.param(b'"queue"', "the request body must be a JSON object", id="string"),
])
def test_a_body_that_is_not_a_json_object_is_400(api: MemoryManagement, raw: bytes,
                                                 words: str) -> None:
    status, error = refused(api, "POST", "/api/destinations", raw=raw)
    assert status == 400 and error.startswith(words)


# Each row: a request whose body has one field wrong, and the error it must get.
FIELD_ERRORS = [
    pytest.param("/api/destinations", {"name": "x"},
                 "the request body needs a 'type' field (a string)", id="create-no-type"),
    pytest.param("/api/destinations", {"type": "queue", "name": 7},
                 "'name' must be a string, not int", id="create-name-int"),
    pytest.param("/api/destinations/queue/work/send", {"body": {"text": "x"}},
                 "'body' must be a string, not dict", id="send-body-object"),
    pytest.param("/api/destinations/queue/work/send", {"headers": ["a=b"]},
                 "'headers' must be an object of property names and values",
                 id="send-headers-array"),
    pytest.param("/api/destinations/queue/work/send", {"headers": {"tags": ["a"]}},
                 "header 'tags': a value must be a string, number or boolean, not list",
                 id="send-header-list"),
    pytest.param("/api/destinations/queue/work/send", {"headers": {"who": None}},
                 "header 'who': a value must be a string, number or boolean, not NoneType",
                 id="send-header-null"),
    pytest.param("/api/destinations/queue/work/send", {"persistent": "yes"},
                 "'persistent' must be true or false", id="send-persistent-string"),
    pytest.param("/api/queues/work/move", {"to": "queue://x", "copy": 1},
                 "'copy' must be true or false", id="move-copy-int"),
    pytest.param("/api/queues/work/move", {"to": ["queue://x"]},
                 "'to' must be a string, not list", id="move-to-list"),
    pytest.param("/api/queues/work/move", {"to": "queue://x", "selector": 3},
                 "'selector' must be a string, not int", id="move-selector-int"),
    pytest.param("/api/queues/work/move", {"to": "queue://x", "message_ids": ["ID:1", 2]},
                 "'message_ids' must be a list of message id strings",
                 id="move-ids-not-strings"),
    pytest.param("/api/queues/work/retry", {"message_ids": "ID:1"},
                 "'message_ids' must be a list of message id strings", id="retry-ids-string"),
]


@pytest.mark.parametrize(("path", "body", "error"), FIELD_ERRORS)
def test_a_field_of_the_wrong_type_is_400_naming_it(api: MemoryManagement, path: str,
                                                    body: dict[str, Any], error: str) -> None:
    assert refused(api, "POST", path, body) == (400, error)
    # Nothing was done: the queue is still empty and no other destination appeared.
    assert [d["name"] for d in api.get("/api/destinations")["destinations"]] == ["work"]
    assert api.get("/api/destinations/queue/work")["depth"] == 0


@pytest.mark.parametrize(("query", "error"), [
    pytest.param("offset=first", "offset='first' is not a whole number", id="offset-word"),
    pytest.param("offset=-1", "offset=-1 is out of range: use 0 to ", id="offset-negative"),
    pytest.param("limit=2.5", "limit='2.5' is not a whole number", id="limit-fraction"),
    pytest.param("limit=1001", "limit=1001 is out of range: use 0 to 1000", id="limit-high"),
])
def test_browse_paging_numbers_out_of_range_are_400(api: MemoryManagement, query: str,
                                                    error: str) -> None:
    status, message = refused(api, "GET", f"/api/queues/work/messages?{query}")
    assert status == 400 and message.startswith(error)


def test_browse_limit_zero_answers_the_total_without_messages(api: MemoryManagement) -> None:
    for i in range(3):
        api.ok("POST", "/api/destinations/queue/work/send", {"body": f"m{i}"}, 201)
    page = api.get("/api/queues/work/messages?limit=0")
    assert (page["total"], page["limit"], page["messages"]) == (3, 0, [])


# Each row: a path naming something that is not one destination.
@pytest.mark.parametrize(("method", "path", "body", "error"), [
    pytest.param("GET", "/api/destinations/stack/x", None,
                 "unknown destination type 'stack': use queue or topic", id="kind"),
    pytest.param("GET", "/api/queues/a..b/messages", None,
                 "destination 'a..b' has an empty segment", id="empty-segment"),
    pytest.param("POST", "/api/destinations/queue/orders.*/send", {"body": "x"},
                 "queue://orders.* is a wildcard; name one destination", id="wildcard"),
    pytest.param("POST", "/api/destinations", {"type": "topic", "name": "prices.>"},
                 "topic://prices.> is a wildcard; name one destination",
                 id="create-wildcard"),
    pytest.param("POST", "/api/queues/work/move", {"to": "topic://ActiveMQ.Advisory.Queue"},
                 "is written only by the broker", id="move-to-advisory"),
    pytest.param("POST", "/api/destinations/topic/ActiveMQ.Advisory.Queue/send",
                 {"body": "x"}, "is written only by the broker", id="send-to-advisory"),
    pytest.param("POST", "/api/queues/work/move", {"to": "queue://work"},
                 "is the queue the messages are in; name another one", id="move-to-itself"),
    pytest.param("POST", "/api/queues/work/move", {"to": "orders"},
                 "'to' must be queue://NAME or topic://NAME, not 'orders'", id="move-no-kind"),
])
def test_a_name_that_is_not_one_destination_is_400(api: MemoryManagement, method: str,
                                                   path: str, body: object,
                                                   error: str) -> None:
    status, message = refused(api, method, path, body)
    assert status == 400 and error in message


def test_a_topic_has_nothing_to_purge(api: MemoryManagement) -> None:
    api.ok("POST", "/api/destinations", {"type": "topic", "name": "news"}, 201)
    assert refused(api, "POST", "/api/destinations/topic/news/purge") == (
        400, "only queues hold messages to purge; a topic keeps none")


@pytest.mark.parametrize(("method", "path"), [
    pytest.param("GET", "/api/destinations/topic/absent", id="describe-topic"),
    pytest.param("DELETE", "/api/destinations/topic/absent", id="delete-topic"),
    pytest.param("DELETE", "/api/destinations/queue/absent", id="delete-queue"),
    pytest.param("POST", "/api/destinations/queue/absent/purge", id="purge"),
    pytest.param("POST", "/api/queues/absent/retry", id="retry"),
    pytest.param("DELETE", "/api/queues/absent/messages/ID:1", id="delete-message"),
])
def test_an_absent_destination_is_404_naming_it(api: MemoryManagement, method: str,
                                                path: str) -> None:
    status, message = refused(api, method, path)
    assert status == 404 and "'absent'" in message


def test_a_topic_with_a_subscriber_is_not_deleted(api: MemoryManagement) -> None:
    api.ok("POST", "/api/destinations", {"type": "topic", "name": "news"}, 201)
    client = api.broker.stomp()
    client.connect()
    client.send("SUBSCRIBE", {"destination": "/topic/news", "id": "1", "receipt": "r"})
    client.expect("RECEIPT")
    status, message = refused(api, "DELETE", "/api/destinations/topic/news")
    assert status == 409
    assert message.startswith("topic 'news' has 1 subscriber(s); close them first")
    assert api.get("/api/destinations/topic/news")["consumers"] == 1


@pytest.mark.parametrize(("method", "path", "body"), [
    pytest.param("POST", "/api/destinations/queue/stream.log/purge", None, id="purge"),
    pytest.param("POST", "/api/queues/stream.log/move", {"to": "queue://copy"}, id="move"),
    pytest.param("GET", "/api/queues/stream.log/messages", None, id="browse"),
])
def test_a_stream_is_not_managed_like_a_queue(api: MemoryManagement, method: str, path: str,
                                              body: object) -> None:
    api.ok("POST", "/api/destinations/queue/stream.log/send", {"body": "event"}, 201)
    status, message = refused(api, method, path, body)
    assert status == 409
    assert message.startswith("queue 'stream.log' is a stream: it keeps every message")
