"""meshmq.client (and the pure uri/backoff modules) import no broker internals, so an
application can use the client without the broker's layers."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).parents[2] / "src" / "meshmq"
ALLOWED = ("meshmq.protocol", "meshmq.errors", "meshmq.uri", "meshmq.backoff",
           "meshmq.client")


def imported_modules(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
    return {m for m in found if m.startswith("meshmq")}


def test_client_uri_and_backoff_depend_only_on_protocol_and_errors() -> None:
    files = [*sorted((SRC / "client").glob("*.py")), SRC / "uri.py", SRC / "backoff.py"]
    bad = {f"{f.name}: {m}" for f in files for m in imported_modules(f)
           if not m.startswith(ALLOWED)}
    assert not bad, f"client code imports broker internals: {sorted(bad)}"
