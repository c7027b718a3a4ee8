"""Admin commands over the management API: ``meshmq queue|dlq|connection|bridge ...``.

Each command is one or a few API requests (docs/operations.md lists them) and prints a
table for people or, with ``--json``, the API's own answer for scripts. Moving many
messages goes in batches of message ids so the operator sees progress and an
interrupted move leaves every message in the source or the target, never lost.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

from meshmq.cli.management_client import (
    DEFAULT_URL,
    ManagementClient,
    ManagementError,
    password_for,
    quoted,
)

MOVE_BATCH = 1000


def _client(args: argparse.Namespace) -> ManagementClient:
    return ManagementClient(args.url, user=args.user, password=password_for(args.user),
                            cafile=args.cafile)


def table(rows: Sequence[dict[str, Any]], columns: Sequence[tuple[str, str]]) -> str:
    """Rows as aligned columns; ``columns`` are (field, heading) pairs."""
    cells = [[_cell(row.get(field)) for field, _ in columns] for row in rows]
    widths = [max([len(head)] + [len(r[i]) for r in cells])
              for i, (_, head) in enumerate(columns)]
    lines = ["  ".join(head.ljust(w) for (_, head), w in zip(columns, widths, strict=True))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip()
              for r in cells]
    return "\n".join(line.rstrip() for line in lines)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.1f}"
    if isinstance(value, list | tuple):
        return ",".join(_cell(v) for v in value) or "-"
    return str(value)


def _emit(args: argparse.Namespace, answer: Any, human: Callable[[], str]) -> int:
    print(json.dumps(answer, indent=2) if args.json else human())
    return 0


def _queue_path(name: str) -> str:
    return f"/api/destinations/queue/{quoted(name)}"


# ------------------------------------------------------------------ queue


def cmd_queue_list(args: argparse.Namespace) -> int:
    answer = _client(args).get("/api/destinations", type="queue", filter=args.filter)
    return _emit(args, answer, lambda: table(answer["destinations"], (
        ("name", "QUEUE"), ("depth", "DEPTH"), ("enqueued", "ENQUEUED"),
        ("dequeued", "DEQUEUED"), ("consumers", "CONSUMERS"), ("producers", "PRODUCERS"),
        ("in_flight", "INFLIGHT"), ("enqueue_rate", "IN/S"), ("dequeue_rate", "OUT/S"))))


def cmd_queue_browse(args: argparse.Namespace) -> int:
    answer = _client(args).get(f"/api/queues/{quoted(args.queue)}/messages",
                               offset=args.offset, limit=args.limit, selector=args.selector)

    def human() -> str:
        shown = answer["messages"]
        head = (f"{answer['total']} message(s) in {args.queue}"
                f"{' matching the selector' if args.selector else ''}; showing "
                f"{len(shown)} from {answer['offset']}")
        return head + "\n" + table(shown, (
            ("message_id", "MESSAGE ID"), ("priority", "PRI"), ("persistent", "PERSISTENT"),
            ("redelivered", "REDELIVERED"), ("size", "SIZE"), ("body_preview", "BODY")))
    return _emit(args, answer, human)


def cmd_queue_purge(args: argparse.Namespace) -> int:
    answer = _client(args).post(_queue_path(args.queue) + "/purge")
    return _emit(args, answer, lambda: f"purged {answer['purged']} message(s) from "
                                       f"{args.queue}")


def cmd_queue_delete(args: argparse.Namespace) -> int:
    answer = _client(args).delete(_queue_path(args.queue))
    return _emit(args, answer, lambda: f"deleted queue {args.queue} with "
                                       f"{answer.get('messages', 0)} message(s)")


def cmd_queue_create(args: argparse.Namespace) -> int:
    answer = _client(args).post("/api/destinations", {"type": "queue", "name": args.queue})
    return _emit(args, answer, lambda: f"created queue {args.queue}")


def cmd_queue_move(args: argparse.Namespace) -> int:
    client = _client(args)
    target = args.to if "://" in args.to else f"queue://{args.to}"
    verb = "copied" if args.copy else "moved"
    total = _move_in_batches(client, args.queue, target, args.selector, args.copy,
                             progress=None if args.json else _progress(verb))
    if not args.json and sys.stderr.isatty():
        sys.stderr.write("\n")
    return _emit(args, {verb: total}, lambda: f"{verb} {total} message(s) from {args.queue} "
                                              f"to {target}")


def _progress(verb: str) -> Callable[[int, int], None]:
    def show(done: int, total: int) -> None:
        if sys.stderr.isatty():
            sys.stderr.write(f"\r{verb} {done} of {total}")
        else:
            sys.stderr.write(f"{verb} {done} of {total}\n")
        sys.stderr.flush()
    return show


def _move_in_batches(client: ManagementClient, queue: str, target: str,
                     selector: str | None, copy: bool,
                     progress: Callable[[int, int], None] | None) -> int:
    """Move (or copy) every message matching ``selector``, a page of ids at a time.

    A move takes each page from the head of what still matches; a copy leaves the
    messages where they are, so it walks the queue by offset instead."""
    path = f"/api/queues/{quoted(queue)}"
    done, offset, total = 0, 0, None
    while True:
        page = client.get(path + "/messages", offset=offset, limit=MOVE_BATCH,
                          selector=selector)
        if total is None:
            total = int(page["total"])
        ids = [m["message_id"] for m in page["messages"]]
        if not ids:
            return done
        answer = client.post(path + "/move", {"to": target, "message_ids": ids,
                                              "copy": copy})
        moved = int(answer.get("copied" if copy else "moved", 0))
        done += moved
        if copy:
            offset += len(ids)
        elif moved == 0:
            return done  # nothing of this page could move (consumed meanwhile): stop
        if progress is not None:
            progress(done, max(total, done))


def cmd_dlq_retry(args: argparse.Namespace) -> int:
    body: dict[str, Any] = {}
    if args.selector:
        body["selector"] = args.selector
    answer = _client(args).post(f"/api/queues/{quoted(args.queue)}/retry", body)
    return _emit(args, answer, lambda: f"retried {answer['retried']} message(s) from "
                                       f"{args.queue} to their original destinations")


# ------------------------------------------------------------------ connections


def cmd_connection_list(args: argparse.Namespace) -> int:
    answer = _client(args).get("/api/connections")

    def human() -> str:
        rows = [{**c, "subs": len(c.get("subscriptions") or ())}
                for c in answer["connections"]]
        return table(rows, (("id", "ID"), ("protocol", "PROTOCOL"), ("user", "USER"),
                            ("address", "ADDRESS"), ("client_id", "CLIENT ID"),
                            ("subs", "SUBS"), ("messages_in", "IN"),
                            ("messages_out", "OUT")))
    return _emit(args, answer, human)


def cmd_connection_close(args: argparse.Namespace) -> int:
    answer = _client(args).delete(f"/api/connections/{quoted(args.id)}")
    return _emit(args, answer, lambda: f"closed connection {args.id}")


# ------------------------------------------------------------------ bridges


def cmd_bridge_list(args: argparse.Namespace) -> int:
    answer = _client(args).get("/api/network")

    def human() -> str:
        rows = []
        for connector in answer.get("connectors", []):
            bridges = connector.get("bridges") or [{}]
            for b in bridges:
                err = b.get("last_error") or {}
                rows.append({"connector": connector["name"], "cstate": connector["state"],
                             **b, "error": err.get("kind")})
        for b in answer.get("inbound", []):
            err = b.get("last_error") or {}
            rows.append({"connector": "(inbound)", "cstate": "-", **b,
                         "error": err.get("kind")})
        return table(rows, (("connector", "CONNECTOR"), ("cstate", "CONNECTOR STATE"),
                            ("peer", "PEER"), ("direction", "DIRECTION"),
                            ("state", "BRIDGE STATE"), ("forwarded", "FORWARDED"),
                            ("in_flight", "INFLIGHT"), ("reconnects", "RECONNECTS"),
                            ("error", "LAST ERROR")))
    return _emit(args, answer, human)


def _bridge_action(action: str) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        answer = _client(args).post(
            f"/api/network/connectors/{quoted(args.connector)}/{action}")
        return _emit(args, answer, lambda: f"connector {args.connector}: "
                                           f"{answer.get('state', action)}")
    return run


# ------------------------------------------------------------------ parser


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", default=DEFAULT_URL,
                   help=f"management HOST:PORT or https://HOST:PORT (default {DEFAULT_URL})")
    p.add_argument("--user", help="log in as this user (HTTP Basic); the password comes "
                   "from $MESHMQ_PASSWORD or is asked for")
    p.add_argument("--cafile", metavar="FILE", help="https: the CA bundle that signed the "
                   "endpoint's certificate")
    p.add_argument("--json", action="store_true", help="print the API's JSON answer")


def add_parsers(sub: Any) -> None:
    def command(group: Any, name: str, func: Callable[[argparse.Namespace], int],
                helptext: str) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = group.add_parser(name, help=helptext)
        _common(p)
        p.set_defaults(func=func)
        return p

    q = sub.add_parser("queue", help="list, browse, purge, move, create or delete queues")
    qs = q.add_subparsers(dest="action", required=True)
    p = command(qs, "list", cmd_queue_list, "queues with depth, counts and rates")
    p.add_argument("--filter", help="only queues whose name contains this text")
    p = command(qs, "browse", cmd_queue_browse, "messages of a queue, without consuming")
    p.add_argument("queue")
    p.add_argument("--selector", help="JMS selector, e.g. \"priority > 4\"")
    p.add_argument("--offset", type=int, default=0)
    p.add_argument("--limit", type=int, default=50)
    p = command(qs, "purge", cmd_queue_purge, "remove every message not in flight")
    p.add_argument("queue")
    p = command(qs, "move", cmd_queue_move, "move (or copy) messages to a destination")
    p.add_argument("queue")
    p.add_argument("--to", required=True, metavar="DEST",
                   help="a queue name, or queue://NAME / topic://NAME")
    p.add_argument("--selector", help="only messages matching this JMS selector")
    p.add_argument("--copy", action="store_true", help="copy; leave the originals")
    p = command(qs, "create", cmd_queue_create, "create a queue")
    p.add_argument("queue")
    p = command(qs, "delete", cmd_queue_delete, "delete a queue and its messages")
    p.add_argument("queue")

    d = sub.add_parser("dlq", help="retry dead-lettered messages")
    ds = d.add_subparsers(dest="action", required=True)
    p = command(ds, "retry", cmd_dlq_retry,
                "send dead-lettered messages back to their original destinations")
    p.add_argument("queue", nargs="?", default="ActiveMQ.DLQ",
                   help="the dead-letter queue (default ActiveMQ.DLQ)")
    p.add_argument("--selector", help="only messages matching this JMS selector")

    c = sub.add_parser("connection", help="list or close client connections")
    cs = c.add_subparsers(dest="action", required=True)
    command(cs, "list", cmd_connection_list, "client connections")
    p = command(cs, "close", cmd_connection_close, "close a client connection")
    p.add_argument("id")

    b = sub.add_parser("bridge", help="list network bridges; stop or start a connector")
    bs = b.add_subparsers(dest="action", required=True)
    command(bs, "list", cmd_bridge_list, "network connectors and their bridges")
    for action in ("stop", "start"):
        p = command(bs, action, _bridge_action(action), f"{action} a network connector")
        p.add_argument("connector", help="the network connector's name")


__all__ = ["ManagementError", "add_parsers", "table"]
