"""The build under test is the one the run asked for, and the compile list is sound.

./dev/test runs the suite twice: on the editable (pure Python) install, then with
``MESHMQ_EXPECT_COMPILED=1`` against the mypyc-compiled wheel (dev/build-compiled). A
stale compiled module shadowing the sources, or a wheel that silently fell back to
pure Python, fails here rather than hiding in the numbers.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import os
import sys
import tomllib
from pathlib import Path
from types import ModuleType

import pytest

from meshmq import build

ROOT = Path(__file__).resolve().parents[2]


def _backend() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "meshmq_build", ROOT / "build_backend" / "meshmq_build.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("meshmq_build", module)
    spec.loader.exec_module(module)
    return module


def test_build_flavour_is_the_one_asked_for() -> None:
    expect_compiled = os.environ.get("MESHMQ_EXPECT_COMPILED") == "1"
    assert build.compiled() is expect_compiled, build.describe()
    if expect_compiled:
        assert build.describe() == "hot path compiled with mypyc"
    else:
        assert build.compiled_modules() == []
        assert build.describe().startswith("pure Python")


def test_every_listed_module_exists_and_the_probes_are_listed() -> None:
    backend = _backend()
    paths = backend.compiled_modules()
    assert paths and all((ROOT / p).is_file() for p in paths)
    with (ROOT / "pyproject.toml").open("rb") as f:
        listed = tomllib.load(f)["tool"]["meshmq"]["compile"]["modules"]
    assert set(build._PROBES) <= set(listed)
    for name in listed:
        importlib.import_module(name)


def test_compile_can_be_switched_off(monkeypatch: pytest.MonkeyPatch) -> None:
    backend = _backend()
    monkeypatch.delenv("MESHMQ_COMPILE", raising=False)
    assert backend.compile_wanted() is True
    monkeypatch.setenv("MESHMQ_COMPILE", "0")
    assert backend.compile_wanted() is False


# Module globals of compiled modules that stay plain on purpose: tests change them with
# monkeypatch, which a Final (inlined by mypyc) would ignore in the compiled build.
PLAIN_GLOBALS = {"CONSUMERS_CLOSED_PER_TURN", "SCAN_LIMIT"}


def _plain_constants(source: str) -> list[str]:
    """Names bound once at module level, as a value, without ``Final``."""
    tree = ast.parse(source)
    bound: dict[str, int] = {}
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else (
            [node.target] if isinstance(node, ast.AnnAssign) else [])
        for target in targets:
            for name in ast.walk(target):
                if isinstance(name, ast.Name):
                    bound[name.id] = bound.get(name.id, 0) + 1
    found = []
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 \
                and isinstance(node.targets[0], ast.Name):
            name, value = node.targets[0].id, node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) \
                and node.value is not None:
            annotation = ast.unparse(node.annotation)
            if annotation.startswith("Final") or "TypeAlias" in annotation:
                continue
            name, value = node.target.id, node.value
        else:
            continue
        if name in PLAIN_GLOBALS or name in ("log", "__all__") or bound[name] > 1:
            continue
        if isinstance(value, ast.Call) and ast.unparse(value.func) in (
                "TypeVar", "NewType", "logging.getLogger"):
            continue
        text = ast.unparse(value)
        if isinstance(value, ast.BinOp | ast.Subscript | ast.Name) and (
                text[:1].isupper() or "|" in text or text.startswith(("tuple[", "dict["))):
            continue  # a type alias (``Outcome = Delivery | None``)
        found.append(name)
    return found


def test_the_compiled_modules_constants_are_final() -> None:
    """mypyc inlines a ``Final`` module constant (or keeps it in a C static); a plain
    module global costs a dictionary look-up at every use, on the hot path per message."""
    plain = {}
    for path in _backend().compiled_modules():
        names = _plain_constants((ROOT / path).read_text())
        if names:
            plain[path] = names
    assert not plain, f"mark these module constants Final (or list them in PLAIN_GLOBALS " \
        f"with the reason): {plain}"


def test_the_final_check_finds_plain_constants() -> None:
    source = ("from typing import Final\nA = 1\nB: Final = 2\nC: int = 3\n"
              "T = TypeVar('T')\nAlias = int | None\nlog = logging.getLogger('x')\n"
              "D = 1\nD = 2\nSCAN_LIMIT = 5\n")
    assert _plain_constants(source) == ["A", "C"]
