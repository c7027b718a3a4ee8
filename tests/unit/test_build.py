"""The build under test is the one the run asked for, and the compile list is sound.

./dev/test runs the suite twice: on the editable (pure Python) install, then with
``MESHMQ_EXPECT_COMPILED=1`` against the mypyc-compiled wheel (dev/build-compiled). A
stale compiled module shadowing the sources, or a wheel that silently fell back to
pure Python, fails here rather than hiding in the numbers.
"""

from __future__ import annotations

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
