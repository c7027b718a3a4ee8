"""``meshmq``: a thin shell over configuration, the runtime and management.

Every user error ends in one line on stderr and a non-zero exit status, never a
traceback: a broker that cannot be reached, a port in use, a bad configuration.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import ssl
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from meshmq import __version__
from meshmq.cli import admin, passwd, shards
from meshmq.cli.management_client import ManagementClient, ManagementError, password_for
from meshmq.errors import ConfigError, MeshmqError


def _version_text() -> str:
    from meshmq.build import describe

    return f"meshmq {__version__} ({describe()})"


DESCRIPTION = """\
meshmq: an ActiveMQ-compatible message broker (STOMP 1.0-1.2, MQTT 3.1.1/5) that forms
networks of brokers and master/slave pairs."""

EPILOG = """\
examples:
  meshmq broker                                   STOMP on 127.0.0.1:61613, MQTT on :1883,
                                                  management on :8161, journal in ./data
  meshmq broker --stomp 127.0.0.1:61700           another STOMP port (other listeners kept)
  meshmq broker --stomp 127.0.0.1:0               let the OS choose (the log says which)
  meshmq broker --config examples/meshmq.toml     or an activemq.xml
  meshmq send /queue/orders "hello" --persistent
  meshmq receive /queue/orders --count 1
  meshmq stat --url 127.0.0.1:8161
  meshmq queue list                               admin commands: queue, dlq, connection,
  meshmq queue move orders --to orders.retry      bridge (docs/operations.md)
  meshmq passwd                                   hash a password for [[auth.users]]

docs: docs/config.md (every option), docs/networks.md, docs/ha.md, docs/client.md"""


class UsageError(MeshmqError):
    """A command-line argument that cannot be used as given (exit status 2)."""

    code = "usage"


def _hostport(text: str, default_port: int, option: str) -> tuple[str, int]:
    """HOST:PORT, HOST or :PORT; port 0 is kept (the OS chooses)."""
    try:
        parsed = urlparse(text if "://" in text else f"x://{text}")
        port = parsed.port
    except ValueError:
        raise UsageError(f"{option} {text!r} is not HOST:PORT (a port is 0 to "
                         "65535)") from None
    return parsed.hostname or "127.0.0.1", default_port if port is None else port


def _unreachable(command: str, where: str, exc: BaseException) -> int:
    reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    print(f"meshmq {command}: cannot reach a broker at {where}: {reason} (is one running "
          "there? point --url at it)", file=sys.stderr)
    return 2


def _stomp_failure(command: str, where: str, exc: MeshmqError, connected: bool) -> int:
    """One line for a STOMP conversation that went wrong, and what to change."""
    text = str(exc)
    if connected:
        print(f"meshmq {command}: the broker at {where} refused: "
              f"{text.removeprefix('broker error: ')}", file=sys.stderr)
        return 1
    if text.startswith("broker error"):  # an ERROR frame: a broker that refused us
        print(f"meshmq {command}: the broker at {where} refused the connection: {text} "
              "(check --user and --password)", file=sys.stderr)
        return 2
    print(f"meshmq {command}: {where} does not answer as a STOMP broker ({text}); point "
          "--url at the broker's STOMP HOST:PORT (default 127.0.0.1:61613)",
          file=sys.stderr)
    return 2


def cmd_broker(args: argparse.Namespace) -> int:
    from meshmq.config.model import BrokerConfig, ListenerConfig, ManagementConfig

    if args.config:
        from meshmq.config.load import load_config

        config = load_config(Path(args.config))
    else:
        config = BrokerConfig()
    changes: dict[str, Any] = {}
    if args.data:
        changes["data_directory"] = Path(args.data)
    if args.stomp or args.mqtt:
        # Each flag replaces the plain listener of its protocol; every other configured
        # listener (the other protocol, TLS, WebSocket, broker links) is kept.
        listeners = list(config.listeners)
        for flag, protocol, default_port in ((args.stomp, "stomp", 61613),
                                             (args.mqtt, "mqtt", 1883)):
            if not flag:
                continue
            host, port = _hostport(flag, default_port, f"--{protocol}")
            kept = [lst for lst in listeners if lst.protocol != protocol]
            replaced = next((lst for lst in listeners if lst.protocol == protocol), None)
            new = ListenerConfig(name=protocol, protocol=protocol, host=host, port=port)
            if replaced is not None:
                new = dataclasses.replace(replaced, host=host, port=port)
            listeners = [*kept, new]
        changes["listeners"] = tuple(listeners)
    if args.management is not None:
        if args.management in ("off", "none", ""):
            changes["management"] = ManagementConfig(enabled=False)
        else:
            host, port = _hostport(args.management, 8161, "--management")
            # Only the address changes: TLS and the admin group stay as configured.
            changes["management"] = dataclasses.replace(config.management, enabled=True,
                                                        host=host, port=port)
    if args.no_fsync:
        changes["store"] = dataclasses.replace(config.store, fsync=False)
    if args.accept_data_loss:
        changes["store"] = dataclasses.replace(changes.get("store", config.store),
                                               accept_data_loss=True)
    if args.memory_store:
        changes["persistent"] = False
    if args.shards is not None:
        changes["shards"] = _shards_flag(args.shards)
    if changes:
        config = dataclasses.replace(config, **changes)
    from meshmq.config.model import sharding_conflict
    from meshmq.node.layout import check_layout

    conflict = sharding_conflict(config)
    if conflict is not None:
        raise ConfigError(conflict[0], file=config.source, option="broker.shards")
    if config.shards > 1 and config.ha.role == "witness":  # stores no messages
        import asyncio

        from meshmq.cli.logsetup import apply_logging
        from meshmq.node.witness import run_node_witness

        apply_logging(config.logging, args.log_level, config.source)
        return asyncio.run(run_node_witness(config))
    # A directory a node's shards stored into is not one broker's store (nor the reverse).
    from meshmq.core.shards import PLACEMENTS

    check_layout(config.data_directory, config.shards, config.broker_name,
                 config.store_directory,
                 persistent=config.persistent and config.store.kind != "postgres",
                 placement=PLACEMENTS[config.sharding.placement])
    from meshmq.cli.logsetup import apply_logging

    apply_logging(config.logging, args.log_level, config.source)
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    import asyncio

    if config.shards > 1:
        from meshmq.node.supervisor import run_node

        # Each shard is this Python running meshmq.cli.shard (the same sources).
        command = [sys.executable, "-m", "meshmq.cli.shard"]
        return asyncio.run(run_node(config, command, args.log_level))
    from meshmq.transport.runtime import run_broker

    return asyncio.run(run_broker(config))


def _shards_flag(text: str) -> int:
    """--shards N or auto, checked as [broker] shards is."""
    import os

    from meshmq.config.model import parse_shards
    from meshmq.core.shards import MAX_SHARDS

    try:
        return parse_shards(text, MAX_SHARDS, os.cpu_count())
    except ValueError as exc:
        raise UsageError(f"--shards {exc}") from None


_TLS_SCHEMES = ("ssl", "stomp+ssl", "stomp+nio+ssl")


def _stomp_address(args: argparse.Namespace) -> tuple[str, int, ssl.SSLContext | None]:
    """--url and the TLS options: TLS for a stomp+ssl:// (ssl://) URL or when --cafile or
    --cert is given; the broker's certificate is always verified."""
    from meshmq.client.errors import TlsSetupError
    from meshmq.client.tls import TlsSettings, client_context

    scheme = args.url.partition("://")[0].lower() if "://" in args.url else ""
    tls = scheme in _TLS_SCHEMES or args.cafile is not None or args.cert is not None
    if args.key is not None and args.cert is None:
        raise UsageError("--key needs --cert (the client certificate the key belongs to)")
    host, port = _hostport(args.url, 61612 if tls else 61613, "--url")
    if not tls:
        return host, port, None
    try:
        context = client_context(TlsSettings(cafile=args.cafile, certfile=args.cert,
                                             keyfile=args.key))
    except TlsSetupError as exc:
        raise UsageError(str(exc)) from None
    return host, port, context


def _tls_failure(command: str, where: str, exc: ssl.SSLError) -> int:
    from meshmq.client.tls import describe_tls_failure

    cert = describe_tls_failure(where, exc, ca_hint="pass the broker's CA with --cafile FILE",
                                cert_hint="pass one with --cert FILE (and --key FILE)")
    print(f"meshmq {command}: {cert or f'{where}: TLS failed: {exc}'}", file=sys.stderr)
    return 2


def cmd_send(args: argparse.Namespace) -> int:
    from meshmq.client.simple_stomp import SimpleStompClient

    host, port, tls = _stomp_address(args)
    headers: dict[str, str] = {}
    for header in args.header:
        name, eq, value = header.partition("=")
        if not eq or not name:
            raise UsageError(f"--header {header!r} is not NAME=VALUE")
        headers[name] = value
    if args.persistent:
        headers["persistent"] = "true"
    bodies: list[bytes]
    if args.body is not None:
        bodies = [args.body.encode()] * args.count
    else:
        bodies = [line.rstrip("\n").encode() for line in sys.stdin]
    connected = False
    try:
        with SimpleStompClient(host, port, login=args.user, passcode=args.password,
                               tls=tls) as client:
            connected = True
            for body in bodies:
                client.send(args.destination, body, headers, confirm=not args.no_receipt)
    except ssl.SSLError as exc:
        return _tls_failure("send", f"{host}:{port}", exc)
    except OSError as exc:
        return _unreachable("send", f"{host}:{port}", exc)
    except MeshmqError as exc:
        return _stomp_failure("send", f"{host}:{port}", exc, connected)
    print(f"sent {len(bodies)} message(s) to {args.destination}", file=sys.stderr)
    return 0


def cmd_receive(args: argparse.Namespace) -> int:

    host, port, tls = _stomp_address(args)
    if args.durable and not args.client_id:
        raise UsageError("--durable needs --client-id (a durable subscription belongs to "
                         "one client id)")
    state = {"connected": False}
    try:
        received = _receive(args, host, port, tls, state)
    except ssl.SSLError as exc:
        return _tls_failure("receive", f"{host}:{port}", exc)
    except OSError as exc:
        return _unreachable("receive", f"{host}:{port}", exc)
    except MeshmqError as exc:
        return _stomp_failure("receive", f"{host}:{port}", exc, state["connected"])
    print(f"received {received} message(s) from {args.destination}", file=sys.stderr)
    return 0 if args.count <= 0 or received >= args.count else 1


def _receive(args: argparse.Namespace, host: str, port: int, tls: ssl.SSLContext | None,
             state: dict[str, bool]) -> int:
    from meshmq.client.simple_stomp import SimpleStompClient

    received = 0
    with SimpleStompClient(host, port, login=args.user, passcode=args.password,
                           client_id=args.client_id, tls=tls) as client:
        state["connected"] = True
        extra = {}
        if args.selector:
            extra["selector"] = args.selector
        if args.durable:
            extra["activemq.subscriptionName"] = args.durable
        client.subscribe(args.destination, ack="client-individual", headers=extra)
        while args.count <= 0 or received < args.count:
            frame = client.receive(timeout=args.timeout)
            if frame is None:
                break
            if args.json:
                print(json.dumps({"headers": dict(frame.headers),
                                  "body": frame.body.decode("utf-8", "replace")}))
            else:
                sys.stdout.write(frame.body.decode("utf-8", "replace") + "\n")
            sys.stdout.flush()
            client.ack(frame)
            received += 1
    return received


def cmd_stat(args: argparse.Namespace) -> int:
    client = ManagementClient(args.url, user=args.user, password=password_for(args.user),
                              cafile=args.cafile, timeout=10)
    if args.shard is not None:  # one shard of a node, through the node's endpoint
        try:
            stat: dict[str, Any] = client.get(f"/api/shards/{args.shard}/stat")
        except ManagementError as exc:
            # A node names its shards in its 404; one broker has no such route.
            if "(404)" in str(exc) and "the node has no shard" not in str(exc):
                raise ManagementError(f"{args.url} is one broker, not a node of shards: "
                                      "--shard is for a node (broker.shards > 1)") from None
            raise
    else:
        stat = client.get("/api/stat")
    shards = stat.get("shards") or []
    # A node of shards: its processes and links as well (the node's own endpoint).
    node: dict[str, Any] = client.get("/api/shards") if shards else {}
    rows: list[dict[str, Any]] = node.get("shards") or []
    if args.json:
        print(json.dumps({**stat, "shard_processes": rows, "shard_totals": node["totals"]}
                         if rows else stat, indent=2))
        return 0
    name = f"shard {args.shard} of {stat['broker']}" if args.shard is not None \
        else stat["broker"]
    print(f"broker {name}  connections {stat['connections']}  memory "
          f"{stat['memory']['used']}/{stat['memory']['limit']} ({stat['memory']['percent']}%)")
    if shards:  # which of them answered
        down = [str(s["shard"]) for s in shards if s.get("state") != "up"]
        placement = node.get("placement")
        print(f"shards {len(shards)}  up {len(shards) - len(down)}"
              + (f"  placement {placement}" if placement else "")
              + (f"  not answering: {', '.join(down)}" if down else ""))
        print(shard_tables(rows, node.get("totals")))
    _print_stat(stat)
    return 0


def _duration(ms: object) -> str:
    if not isinstance(ms, int):
        return "-"
    minutes, seconds = divmod(ms // 1000, 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{seconds:02d}s" \
        if minutes else f"{seconds}s"


def _rate(value: object) -> str:
    return f"{value:.1f}" if isinstance(value, int | float) else "-"


def shard_tables(rows: list[dict[str, Any]], totals: dict[str, Any] | None = None) -> str:
    """``/api/shards`` as two tables: each shard's process and what it owns (messages
    in and out of its destinations and their rates per second, CPU seconds and the
    share of a core over the last second, journal bytes on disk), the node's sums as
    the last row; then each link's counters (a link ``0->1`` is shard 0's to shard 1:
    what 0 sent 1 as owner, what 0 delivered to 1's consumers, and 1's sends parked at
    0's memory limit)."""
    shown = [{**row, "uptime": _duration(row.get("uptime_ms")),
              "in_rate": _rate(row.get("in_rate")), "out_rate": _rate(row.get("out_rate")),
              "cpu_percent": _rate(row.get("cpu_percent"))} for row in rows]
    if totals is not None:
        shown.append({**totals, "shard": "node", "in_rate": _rate(totals.get("in_rate")),
                      "out_rate": _rate(totals.get("out_rate")),
                      "cpu_percent": _rate(totals.get("cpu_percent")),
                      "pid": "", "state": "", "restarts": "", "uptime": ""})
    procs = admin.table(shown, (
        ("shard", "SHARD"), ("pid", "PID"), ("state", "STATE"), ("restarts", "RESTARTS"),
        ("uptime", "UPTIME"), ("connections", "CONNECTIONS"), ("destinations", "DESTS"),
        ("messages_in", "IN"), ("messages_out", "OUT"), ("in_rate", "IN/S"),
        ("out_rate", "OUT/S"), ("cpu_seconds", "CPU-S"), ("cpu_percent", "CPU%"),
        ("journal_bytes", "JOURNAL")))
    links = [{"link": f"{row['shard']}->{link.get('shard')}", **link}
             for row in rows for link in row.get("links") or ()]
    if not links:
        return procs
    return procs + "\n" + admin.table(links, (
        ("link", "LINK"), ("up", "UP"), ("sent", "SENT"),
        ("delivered_out", "DELIVERED OUT"), ("parked", "PARKED")))


def ha_line(ha: dict[str, Any]) -> str | None:
    """``meshmq stat``'s line about high availability (None without it). A replicated
    node of shards replicates each shard's log on its own: one position per shard."""
    mode = ha.get("mode", "none")
    if mode == "none":
        return None
    if mode != "replicated":
        return (f"role {ha['role']}  ha {mode}  epoch {ha['epoch']}  lease held by "
                f"{ha.get('lease_holder')} (epoch {ha.get('lease_epoch')})")
    head = f"role {ha['role']}  ha replicated  term {ha['term']}  master {ha.get('leader')}"
    shards = ha.get("shards")
    if shards is None:
        return f"{head}  log {ha.get('last')}  commit {ha.get('commit')}"
    logs = ", ".join(f"s{i} {s.get('last')}" + (f" commit {s['commit']}"
                                                if s.get("commit") is not None else "")
                     + ("" if s.get("up", True) else " (not answering)")
                     for i, s in enumerate(shards))
    return f"{head}  shards {len(shards)}  logs {logs or 'not known yet'}"


def _print_stat(stat: dict[str, Any]) -> None:
    line = ha_line(stat.get("ha") or {})
    if line is not None:
        print(line)
    if stat.get("failed_logins"):
        print(f"logins failed {stat['failed_logins']}  addresses slowed "
              f"{stat.get('login_slowed_addresses', 0)}")
    denied = stat.get("denied") or {}
    if denied.get("total"):
        users = ", ".join(f"{u} {n}" for u, n in sorted(denied.get("by_user", {}).items(),
                                                        key=lambda kv: -kv[1])[:5])
        print(f"denied {denied['total']} (not authorized; by user: {users})")
    if stat.get("persistent_refused"):
        print(f"store  refusing persistent messages: {stat['persistent_refused']}")
    cols = ("type", "name", "depth", "enqueued", "dequeued", "consumers", "producers",
            "inflight")
    rows = [[str(d.get(c, "")) for c in cols] for d in stat["destinations"]]
    widths = [max(len(c), *(len(r[i]) for r in rows)) if rows else len(c)
              for i, c in enumerate(cols)]
    print("  ".join(c.upper().ljust(w) for c, w in zip(cols, widths, strict=True)))
    for r in rows:
        print("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)))
    for sub in stat.get("durable_subscriptions", []):
        print(f"durable {sub['clientId']}:{sub['name']} on {sub['destination']} pending "
              f"{sub['pending']} {'active' if sub['active'] else 'offline'}")
    for b in stat.get("network", {}).get("bridges", []):
        print(bridge_line(b))


def bridge_line(b: dict[str, Any]) -> str:
    """``meshmq stat``'s line for one bridge of ``/api/stat``'s ``network.bridges``."""
    err = b.get("last_error") or {}
    line = (f"bridge {b['name']} ({b['direction']}) {b['state']} remote "
            f"{b.get('remote_broker') or '-'} forwarded {b['forwarded']} received "
            f"{b['received']} rate {b['forward_rate']}/s demand {b['demand']}")
    if b.get("refused"):
        line += f" refused {b['refused']} (not authorized on {b.get('remote_broker')})"
    if b.get("held"):
        line += (f" held {','.join(b['held'])} (its consumers on "
                 f"{b.get('remote_broker')} are behind)")
    if err and b["state"] != "forwarding":
        line += f"  last error: {err.get('kind')}: {err.get('message')}"
    return line


def cmd_audit(args: argparse.Namespace) -> int:
    """Delivery audit over trace files (PySpark; needs the ``spark`` extra)."""
    try:
        from meshmq.pipeline import audit_job
    except ImportError as exc:
        print(f"meshmq audit needs PySpark: pip install 'meshmq[spark]' ({exc})",
              file=sys.stderr)
        return 2
    from meshmq.pipeline import paths as locations

    if args.master.startswith("local"):
        # A wrong local path is one line before Spark starts (elsewhere a plain path
        # may name the cluster's default filesystem: checked once Spark is up).
        locations.check_local(args.trace_dirs)
    master = None if args.master == "submit" else args.master
    spark = audit_job.spark_session(master, progress_bar=sys.stderr.isatty())
    try:
        if args.follow:
            audit_job.follow(spark, args.trace_dirs, args.out, once=args.once,
                             interval=args.interval, stuck_after_ms=args.stuck_after_ms,
                             window=args.window)
            print(f"audit tables and report kept up to date in {args.out}", file=sys.stderr)
            return 0
        counts = audit_job.run_audit(spark, args.trace_dirs, args.out,
                                     stuck_after_ms=args.stuck_after_ms, window=args.window)
    finally:
        spark.stop()
    print(" ".join(f"{k}={v}" for k, v in counts.items()))
    print(f"report: {args.out.rstrip('/')}/report.md", file=sys.stderr)
    return 0


def cmd_witness(args: argparse.Namespace) -> int:
    import asyncio

    from meshmq.config.load import load_config
    from meshmq.transport.runtime import run_broker

    config = load_config(Path(args.config))
    if config.ha.mode != "replicated":
        print(f"{args.config}: a witness needs [ha] mode = \"replicated\"", file=sys.stderr)
        return 2
    config = dataclasses.replace(config, ha=dataclasses.replace(config.ha, role="witness"))
    from meshmq.cli.logsetup import apply_logging

    apply_logging(config.logging, args.log_level, config.source)
    if config.shards > 1:  # the witness of nodes of shards: one stream per shard
        from meshmq.node.witness import run_node_witness

        return asyncio.run(run_node_witness(config))
    return asyncio.run(run_broker(config))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="meshmq", description=DESCRIPTION, epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=_version_text())
    # Unset: [logging] level of the configuration file (default INFO).
    parser.add_argument("--log-level", type=str.upper,
                        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                        help="log level; wins over [logging] level")
    sub = parser.add_subparsers(dest="command", required=True)

    b = sub.add_parser(
        "broker", help="run one broker in the foreground",
        description="Run one broker in the foreground until Ctrl-C or SIGTERM. Without "
        "--config: STOMP on 127.0.0.1:61613, MQTT on 127.0.0.1:1883, management on "
        "127.0.0.1:8161, journal in ./data. Each of --stomp, --mqtt and --management "
        "changes one listener and keeps the others; a second broker on one host needs its "
        "own ports and --data.")
    b.add_argument("--config", metavar="FILE", help="meshmq.toml or activemq.xml")
    b.add_argument("--data", metavar="DIR", help="data directory (default ./data)")
    b.add_argument("--stomp", metavar="HOST:PORT",
                   help="STOMP listen address (default 127.0.0.1:61613; port 0: the OS "
                        "chooses); replaces only the plain STOMP listener")
    b.add_argument("--mqtt", metavar="HOST:PORT",
                   help="MQTT listen address (default 127.0.0.1:1883; port 0: the OS "
                        "chooses); replaces only the plain MQTT listener")
    b.add_argument("--management", metavar="HOST:PORT",
                   help="management endpoint (default 127.0.0.1:8161), or 'off'")
    b.add_argument("--no-fsync", action="store_true", help="do not fsync (unsafe; benchmarks)")
    b.add_argument("--accept-data-loss", action="store_true",
                   help="start even if a damaged journal segment holds data that cannot be "
                        "recovered (the damaged file is kept aside; docs/store-format.md)")
    b.add_argument("--memory-store", action="store_true", help="keep nothing on disk")
    b.add_argument("--shards", metavar="N",
                   help="run N shard processes on the same ports, or auto: one per CPU "
                        "(docs/shards.md)")
    b.set_defaults(func=cmd_broker)

    for name, func, helptext in (("send", cmd_send, "send messages"),
                                 ("receive", cmd_receive, "receive messages")):
        p = sub.add_parser(name, help=helptext)
        p.add_argument("destination", help="e.g. /queue/orders or /topic/prices")
        p.add_argument("--url", default="127.0.0.1:61613",
                       help="broker HOST:PORT, or stomp+ssl://HOST:PORT for TLS")
        p.add_argument("--user")
        p.add_argument("--password")
        p.add_argument("--cafile", metavar="FILE",
                       help="TLS: the CA bundle (PEM) that signed the broker's certificate "
                            "(default: the system's); implies TLS")
        p.add_argument("--cert", metavar="FILE",
                       help="TLS: a client certificate (PEM) to present; implies TLS")
        p.add_argument("--key", metavar="FILE",
                       help="TLS: the client certificate's private key (PEM), unless "
                            "--cert holds it")
        p.set_defaults(func=func)
        if name == "send":
            p.add_argument("body", nargs="?", help="message body (default: one per stdin line)")
            p.add_argument("--count", type=int, default=1)
            p.add_argument("--persistent", action="store_true")
            p.add_argument("--header", action="append", default=[], help="NAME=VALUE")
            p.add_argument("--no-receipt", action="store_true")
        else:
            p.add_argument("--count", type=int, default=1, help="0 = until --timeout")
            p.add_argument("--timeout", type=float, default=10.0)
            p.add_argument("--selector")
            p.add_argument("--durable", help="durable subscription name (needs --client-id)")
            p.add_argument("--client-id")
            p.add_argument("--json", action="store_true")

    w = sub.add_parser("witness", help="run a replicated-HA witness: votes, stores no "
                       "messages (docs/ha.md)")
    w.add_argument("--config", required=True, help="meshmq.toml with [ha] mode = "
                   "\"replicated\", listen and members")
    w.set_defaults(func=cmd_witness)

    passwd.add_parser(sub)
    admin.add_parsers(sub)
    shards.add_parser(sub)

    s = sub.add_parser("stat", help="show destinations of a running broker")
    s.add_argument("--url", default="127.0.0.1:8161",
                   help="management HOST:PORT, or https://HOST:PORT")
    s.add_argument("--user", help="log in as this user (HTTP Basic); the password comes "
                   "from $MESHMQ_PASSWORD or is asked for")
    s.add_argument("--cafile", metavar="FILE",
                   help="https: the CA bundle (PEM) that signed the endpoint's certificate "
                        "(default: the system's)")
    s.add_argument("--shard", type=int, metavar="K",
                   help="a node of shards: shard K's own figures (0 is the first)")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_stat)

    a = sub.add_parser("audit", help="delivery audit over trace files (PySpark)")
    a.add_argument("trace_dirs", nargs="+", metavar="TRACE_DIR",
                   help="trace directories or files, paths or URIs (file://, hdfs://, s3a://; "
                   "several brokers' traces together)")
    a.add_argument("--out", default="audit",
                   help="output directory, path or URI (default ./audit)")
    a.add_argument("--master", default="local[2]",
                   help="Spark master URL (default local[2]); 'submit' keeps spark-submit's")
    a.add_argument("--follow", action="store_true",
                   help="streaming: follow the directories and keep the tables up to date")
    a.add_argument("--once", action="store_true",
                   help="with --follow: process the files there now, then stop")
    a.add_argument("--interval", default="10 seconds", help="with --follow: trigger interval")
    a.add_argument("--stuck-after-ms", type=int, default=60_000,
                   help="pending this long counts as stuck (default 60000)")
    a.add_argument("--window", default="10 seconds", help="throughput window")
    a.set_defaults(func=cmd_audit)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from meshmq.cli.logsetup import enable_stack_dumps, start_logging

    start_logging(args.log_level or "INFO")
    enable_stack_dumps()
    try:
        code: int = args.func(args)
        return code
    except ConfigError as exc:
        print(f"meshmq: configuration error: {exc}", file=sys.stderr)
        return 2
    except (UsageError, passwd.PasswdError) as exc:
        print(f"meshmq {args.command}: {exc}", file=sys.stderr)
        return 2
    except ManagementError as exc:
        print(f"meshmq {args.command}: {exc}", file=sys.stderr)
        return exc.status
    except MeshmqError as exc:
        print(f"meshmq: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `meshmq stat | head`: the reader left; say nothing more.
        sys.stderr.close()
        return 0
    except OSError as exc:
        # The machine said no (a file or directory that cannot be used, a full disk):
        # the operator's to fix, so one line; the traceback with --log-level DEBUG.
        logging.getLogger("meshmq.cli").debug("%s failed", args.command, exc_info=True)
        where = f": {exc.filename}" if exc.filename else ""
        print(f"meshmq {args.command}: {exc.strerror or exc}{where}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
