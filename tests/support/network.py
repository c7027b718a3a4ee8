"""Subprocess brokers joined into networks, for failure tests: each node has fixed
loopback ports (from the OS, reserved before start) so it can be killed and restarted
where its peers' connectors expect it."""

from __future__ import annotations

import json
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.brokers import ProcessBroker, poll
from tests.support.ports import free_port

# Broker links are admitted only for a configured user (or a verified certificate): every
# test node has this one, and its connectors use it unless a test says otherwise.
LINK_USER = ("link", "link-secret")


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {value!r} as TOML")


@dataclass
class Node:
    """One broker of a test network (``meshmq broker`` subprocess)."""

    name: str
    root: Path
    connectors: list[dict[str, Any]] = field(default_factory=list)
    broker: dict[str, Any] = field(default_factory=dict)
    auth_users: list[tuple[str, str]] = field(default_factory=list)
    data_dir: Path | None = None  # shared by a master/slave pair
    ha: dict[str, Any] = field(default_factory=dict)  # the [ha] table
    listeners: list[dict[str, Any]] = field(default_factory=list)  # more [[listeners]]
    stomp: int = field(default_factory=free_port)
    tcp: int = field(default_factory=free_port)
    mgmt: int = field(default_factory=free_port)
    proc: ProcessBroker | None = None

    host = "127.0.0.1"

    @property
    def port(self) -> int:  # the STOMP port: test clients take a Node like a broker
        return self.stomp

    @property
    def uri(self) -> str:
        return f"tcp://127.0.0.1:{self.tcp}"

    def connect_to(self, uri: str, **options: Any) -> Node:
        if "username" not in options and "ssl_certfile" not in options:
            options["username"], options["password"] = LINK_USER
        options.setdefault("initial_reconnect_delay_ms", 100)
        options.setdefault("max_reconnect_delay_ms", 500)
        options.setdefault("heartbeat_ms", 500)
        self.connectors.append({"uri": uri, **options})
        return self

    def write_config(self) -> Path:
        self.root.mkdir(parents=True, exist_ok=True)
        data = self.data_dir or self.root / "data"
        lines = ["[broker]", f"name = {_toml_value(self.name)}",
                 f"data_directory = {_toml_value(str(data))}"]
        lines += [f"{k} = {_toml_value(v)}" for k, v in self.broker.items()]
        lines += ["", "[store]", "fsync = false", "", "[management]",
                  f"port = {self.mgmt}", ""]
        if self.ha:
            lines += ["[ha]", *(f"{k} = {_toml_value(v)}" for k, v in self.ha.items()), ""]
        for name, proto, port in (("stomp", "stomp", self.stomp), ("tcp", "tcp", self.tcp)):
            lines += ["[[listeners]]", f'name = "{name}"', f'protocol = "{proto}"',
                      'host = "127.0.0.1"', f"port = {port}", ""]
        lines += ["[auth]", f"anonymous_access = {_toml_value(not self.auth_users)}", ""]
        for user, password in [LINK_USER, *self.auth_users]:
            lines += ["[[auth.users]]", f"name = {_toml_value(user)}",
                      f"password = {_toml_value(password)}", ""]
        for extra in self.listeners:
            lines += ["[[listeners]]", *(f"{k} = {_toml_value(v)}" for k, v in extra.items()),
                      ""]
        for nc in self.connectors:
            lines.append("[[network_connectors]]")
            lines += [f"{k} = {_toml_value(v)}" for k, v in nc.items()]
            lines.append("")
        path = self.root / "broker.toml"
        path.write_text("\n".join(lines))
        return path

    def start(self) -> Node:
        self.proc = ProcessBroker(self.write_config(), self.root / "broker.log").start()
        return self

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.kill9()
        self.proc = None

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc = None

    def stat(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.mgmt}/api/stat",
                                    timeout=10) as resp:
            return json.loads(resp.read())  # type: ignore[no-any-return]

    def bridges(self, direction: str = "outbound") -> list[dict[str, Any]]:
        return [b for b in self.stat()["network"]["bridges"] if b["direction"] == direction]

    def destination(self, name: str, kind: str = "queue") -> dict[str, Any]:
        for d in self.stat()["destinations"]:
            if d["name"] == name and d["type"] == kind:
                return d  # type: ignore[no-any-return]
        return {"name": name, "depth": 0, "consumers": 0, "enqueued": 0, "dequeued": 0}

    def wait_forwarding(self, count: int = 1) -> None:
        poll(lambda: sum(b["state"] == "forwarding" for b in self.bridges()) >= count,
             what=f"{self.name}: {count} bridge(s) forwarding")

    def wait_consumers(self, queue: str, count: int) -> None:
        poll(lambda: self.destination(queue)["consumers"] == count,
             what=f"{self.name}: {count} consumers on {queue}")

    def log(self) -> str:
        return (self.root / "broker.log").read_text(errors="replace")
