"""What both ends of a link share (``network.endpoint``), without a broker: the
connector settings an initiator sends in HELLO so that a duplex responder forwards by
the same rules (never its secrets), how a responder checks them, and how frames of an
established link reach its halves (and which frames are the peer's protocol error)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from meshmq.config.model import NetworkConnectorConfig
from meshmq.errors import RemoteProtocolError
from meshmq.network.endpoint import (
    BYE_CAUSE,
    MIRRORED,
    LinkEnd,
    client_uris_of,
    management_url_of,
    mirror_config,
    mirror_json,
)
from meshmq.network.forwarder import noted_destination
from meshmq.protocol.wire import AckStatus, FrameType, WireFrame, encode_acks

CUSTOM = NetworkConnectorConfig(
    uri="static:(ssl://hub:61617)", name="to-hub", username="spoke", password="s3cret",
    ssl_cafile=Path("/ca.pem"), ssl_certfile=Path("/me.pem"), ssl_keyfile=Path("/me.key"),
    verify_hostname=False, ssl_ciphers="ECDHE+AESGCM", duplex=True,
    conduit_subscriptions=False, network_ttl=3, message_ttl=2, consumer_ttl=4,
    decrease_network_consumer_priority=False, consumer_priority_base=-9, prefetch_size=50,
    always_sync_send=False, suppress_duplicate_queue_subscriptions=True,
    excluded_destinations=("queue://secret.>",),
    dynamically_included_destinations=("queue://>",),
    statically_included_destinations=("queue://audit",), bridge_temp_destinations=False,
    dynamic_only=True, replay_when_no_consumers=True, replay_delay_ms=5, selector_aware=True,
    redistribution=False, redistribution_delay_ms=7, rate_limit=10, rate_duration_ms=500,
    backoff_multiplier=1.5, heartbeat_ms=1500, interest_resync_ms=9000)


def frame(ftype: FrameType, body: object = None) -> WireFrame:
    return WireFrame(ftype, b"" if body is None else json.dumps(body).encode())


# ---------------------------------------------------------------- mirrored settings
def test_a_duplex_responder_gets_every_forwarding_rule_of_the_initiator() -> None:
    mirrored = mirror_config(json.loads(json.dumps(mirror_json(CUSTOM))))
    for name in MIRRORED:
        assert getattr(mirrored, name) == getattr(CUSTOM, name), name


def test_secrets_addresses_and_tls_files_never_leave_the_broker() -> None:
    sent = mirror_json(CUSTOM)
    assert not {"uri", "username", "password", "verify_hostname", "ssl_cafile",
                "ssl_certfile", "ssl_keyfile", "ssl_ciphers"} & set(sent)
    assert "s3cret" not in json.dumps(sent)
    mirrored = mirror_config(json.loads(json.dumps(sent)))
    assert (mirrored.username, mirrored.password, mirrored.ssl_cafile) == (None, None, None)


def test_settings_an_older_peer_does_not_send_keep_their_defaults() -> None:
    mirrored = mirror_config({"network_ttl": 2, "a_future_option": "ignored"})
    assert mirrored == dataclasses.replace(NetworkConnectorConfig(uri="duplex:"),
                                           network_ttl=2)


@pytest.mark.parametrize(("name", "value", "fragment"), [
    ("conduit_subscriptions", "yes", "must be a boolean"),
    ("duplex", 1, "must be a boolean"),
    ("network_ttl", True, "must be an integer"),
    ("prefetch_size", "1000", "must be an integer"),
    ("backoff_multiplier", None, "must be a number"),
    ("excluded_destinations", "queue://a", "must be a list of strings"),
    ("statically_included_destinations", ["queue://a", 5], "must be a list of strings"),
    ("name", 5, "has a bad type"),
    ("message_ttl", [2], "has a bad type"),
    ("message_ttl", "2", "has a bad type"),
    ("consumer_ttl", True, "has a bad type"),
    ("prefetch_size", 2.5, "must be an integer"),
])
def test_a_setting_of_the_wrong_type_is_the_peers_protocol_error(name: str, value: object,
                                                                 fragment: str) -> None:
    with pytest.raises(RemoteProtocolError) as err:
        mirror_config({name: value})
    assert str(err.value) == f"HELLO config {name} {fragment}"


@pytest.mark.parametrize(("name", "value"), [("message_ttl", None), ("message_ttl", 2),
                                             ("consumer_ttl", -1), ("backoff_multiplier", 3),
                                             ("backoff_multiplier", 1.25)])
def test_optional_ttls_and_float_settings_take_their_kinds_of_value(name: str,
                                                                    value: object) -> None:
    assert getattr(mirror_config({name: value}), name) == value


def test_a_hello_config_that_is_not_an_object_is_refused() -> None:
    with pytest.raises(RemoteProtocolError, match="HELLO config must be an object"):
        mirror_config(["network_ttl", 2])


# ---------------------------------------------------------------- client URIs, console
def test_client_uris_and_the_management_url_are_optional() -> None:
    assert client_uris_of({}) == ()
    assert management_url_of({}) is None and management_url_of({"management_url": ""}) is None
    assert client_uris_of({"client_uris": ["stomp://b:61613", "mqtt://b:1883"]}) == \
        ("stomp://b:61613", "mqtt://b:1883")
    assert management_url_of({"management_url": "https://b:8162"}) == "https://b:8162"


@pytest.mark.parametrize("uris", ["stomp://b:61613", ["stomp://b:61613", None], {"a": 1}])
def test_client_uris_that_are_not_a_list_of_strings_are_refused(uris: object) -> None:
    with pytest.raises(RemoteProtocolError, match="client_uris must be a list of strings"):
        client_uris_of({"client_uris": uris})


def test_a_management_url_that_is_not_a_string_is_refused() -> None:
    with pytest.raises(RemoteProtocolError, match="management_url must be a string"):
        management_url_of({"management_url": 8161})


# ---------------------------------------------------------------- frames of a live link
class FakeLink:
    def __init__(self) -> None:
        self.closed_with: str | None = None

    def close(self, cause: str = "closed locally") -> None:
        self.closed_with = cause


class FakeForwarder:
    def __init__(self) -> None:
        self.synced = False
        self.interest: list[tuple[str, dict[str, Any]]] = []
        self.acks: list[list[tuple[int, AckStatus]]] = []
        self.ranges: list[list[tuple[int, int, AckStatus]]] = []

    def apply_interest(self, op: str, body: dict[str, Any]) -> None:
        self.interest.append((op, body))
        if op == "sync":
            self.synced = True

    def on_acks(self, acks: list[tuple[int, AckStatus]]) -> None:
        self.acks.append(acks)

    def on_ack_ranges(self, runs: list[tuple[int, int, AckStatus]]) -> None:
        self.ranges.append(runs)


class End(LinkEnd):
    def __init__(self, forwarding: bool) -> None:
        self.forwarder = FakeForwarder() if forwarding else None  # type: ignore[assignment]
        self.synced_calls = 0
        self.refusals: list[tuple[str, str]] = []

    def on_synced(self) -> None:
        self.synced_calls += 1

    def on_refused(self, code: str, message: str) -> None:
        self.refusals.append((code, message))


def route(end: End, f: WireFrame) -> FakeLink:
    link = FakeLink()
    end.route(link, f)  # type: ignore[arg-type]
    return link


def test_only_the_first_full_sync_completes_the_handshake() -> None:
    end = End(forwarding=True)
    route(end, frame(FrameType.INTEREST, {"op": "update", "add": [], "remove": []}))
    assert end.synced_calls == 0
    route(end, frame(FrameType.INTEREST, {"op": "sync", "items": []}))
    route(end, frame(FrameType.INTEREST, {"op": "sync", "items": []}))
    assert end.synced_calls == 1
    assert isinstance(end.forwarder, FakeForwarder)
    assert [op for op, _ in end.forwarder.interest] == ["update", "sync", "sync"]


def test_hold_notes_reach_the_forwarding_half_and_are_no_sync() -> None:
    end = End(forwarding=True)
    route(end, frame(FrameType.INTEREST, {"op": "hold", "dest": "queue://q"}))
    route(end, frame(FrameType.INTEREST, {"op": "release", "dest": "queue://q"}))
    assert end.synced_calls == 0
    assert isinstance(end.forwarder, FakeForwarder)
    assert [op for op, _ in end.forwarder.interest] == ["hold", "release"]


@pytest.mark.parametrize(("body", "fragment"), [
    ({"op": "hold"}, "INTEREST hold and release need a destination"),
    ({"op": "hold", "dest": 5}, "INTEREST hold and release need a destination"),
    ({"op": "release", "dest": ""}, "INTEREST hold and release need a destination"),
    ({"op": "hold", "dest": "q"}, "INTEREST hold names a bad destination: not a destination"),
    ({"op": "hold", "dest": "box://q"}, "unknown destination kind"),
])
def test_a_hold_note_without_a_good_destination_is_the_peers_protocol_error(
        body: dict[str, object], fragment: str) -> None:
    with pytest.raises(RemoteProtocolError, match=fragment):
        noted_destination(body)
    assert str(noted_destination({"op": "hold", "dest": "topic://a.b"})) == "topic://a.b"


def test_acks_reach_the_forwarding_half() -> None:
    end = End(forwarding=True)
    route(end, WireFrame(FrameType.ACKS, encode_acks([(1, AckStatus.STORED),
                                                      (2, AckStatus.DUPLICATE)])[5:]))
    assert isinstance(end.forwarder, FakeForwarder)
    assert end.forwarder.acks == [[(1, AckStatus.STORED), (2, AckStatus.DUPLICATE)]]


def test_ack_ranges_reach_the_forwarding_half_as_runs() -> None:
    end = End(forwarding=True)
    acks = [(1, AckStatus.STORED), (2, AckStatus.STORED), (3, AckStatus.DUPLICATE)]
    route(end, WireFrame(FrameType.ACK_RANGES, encode_acks(acks, as_ranges=True)[5:]))
    assert isinstance(end.forwarder, FakeForwarder)
    assert end.forwarder.ranges == [[(1, 2, AckStatus.STORED), (3, 3, AckStatus.DUPLICATE)]]


def test_a_goodbye_closes_the_link_as_a_clean_shutdown_with_its_reason() -> None:
    link = route(End(forwarding=False), frame(FrameType.BYE, {"reason": "maintenance"}))
    assert link.closed_with == f"{BYE_CAUSE} (maintenance)"
    link = route(End(forwarding=False), frame(FrameType.BYE, {}))
    assert link.closed_with == f"{BYE_CAUSE} (no reason given)"


def test_a_refusal_on_a_live_link_is_recorded_then_closes_it() -> None:
    end = End(forwarding=False)
    link = route(end, frame(FrameType.REFUSE, {"code": "loop", "message": "same name"}))
    assert end.refusals == [("loop", "same name")]
    assert link.closed_with == "refused by the remote: loop: same name"


@pytest.mark.parametrize(("forwarding", "f", "fragment"), [
    (False, WireFrame(FrameType.MESSAGES, b""), "MESSAGES on a link that does not receive"),
    (False, WireFrame(FrameType.MESSAGES_AGAIN, b""),
     "MESSAGES_AGAIN on a link that does not receive"),
    (False, WireFrame(FrameType.ACKS, b""), "ACKS on a link that does not forward"),
    (False, WireFrame(FrameType.ACK_RANGES, b""), "ACK_RANGES on a link that does not forward"),
    (False, frame(FrameType.INTEREST, {"op": "sync"}),
     "INTEREST on a link that does not forward"),
    (True, frame(FrameType.INTEREST, {"op": "replace"}),
     "INTEREST op must be sync, update, hold or release, not 'replace'"),
    (True, frame(FrameType.HELLO, {}), "unexpected HELLO frame"),
    (True, frame(FrameType.WELCOME, {}), "unexpected WELCOME frame"),
])
def test_a_frame_the_link_cannot_take_is_the_peers_protocol_error(
        forwarding: bool, f: WireFrame, fragment: str) -> None:
    with pytest.raises(RemoteProtocolError, match=fragment):
        route(End(forwarding=forwarding), f)
