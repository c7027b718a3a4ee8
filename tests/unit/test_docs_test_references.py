"""Every test file, and every test function, the documentation points readers to exists:
the docs say "this runs as a test" only where it does."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).parents[2]
DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
# tests/dir/test_file.py, optionally ::test_name
REFERENCE = re.compile(r"(tests/[\w/]+\.py)(?:::(\w+))?")


def _references() -> list[tuple[Path, str, str | None]]:
    found = []
    for doc in DOCS:
        for match in REFERENCE.finditer(doc.read_text()):
            found.append((doc, match.group(1), match.group(2)))
    return found


def _functions(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {node.name for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)}


def test_the_docs_point_to_tests() -> None:
    assert len(_references()) >= 10  # the pattern still finds the docs' references


def test_every_test_the_docs_name_exists() -> None:
    missing = []
    for doc, file, name in _references():
        path = ROOT / file
        where = f"{doc.relative_to(ROOT)}: {file}" + (f"::{name}" if name else "")
        if not path.is_file():
            missing.append(f"{where} (no such file)")
        elif name is not None and name not in _functions(path):
            missing.append(f"{where} (no such test)")
    assert not missing, "\n".join(missing)
