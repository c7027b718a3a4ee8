"""PEP 517 build backend: setuptools, plus the hot path compiled with mypyc.

Why: the broker is one asyncio thread and CPU-bound per message; compiling the modules
every message passes through (codecs, core, sessions) with mypyc roughly halves that
CPU (bench/hotpath.py; docs/benchmarks.md). mypyc compiles the project's own typed
source, so there is one implementation: the compiled build and the pure-Python one run
the same code and the same tests.

- ``pip install .`` (a wheel) compiles the modules listed in ``[tool.meshmq.compile]`` of
  pyproject.toml. The result is an ordinary platform wheel that needs nothing at run time.
- ``pip install -e .`` (editable) stays pure Python, so source edits take effect at once;
  nothing is ever written next to the sources.
- ``MESHMQ_COMPILE=0`` in the environment builds a pure-Python wheel (no compiler).
- Should the C build fail (no compiler, no Python headers), the wheel falls back to
  pure Python with a warning: compiled modules are an accelerator, never a requirement.
"""

from __future__ import annotations

import os
import sys
import tomllib
from pathlib import Path
from typing import Any

from setuptools import build_meta as _setuptools
from setuptools.build_meta import _BuildMetaBackend

ROOT = Path(__file__).resolve().parent.parent
# mypyc's output depends on its version: pin what CI has tested (see pyproject's test extra).
MYPY_REQUIREMENT = "mypy==2.4.1"
MYPY_BUILD_FLAGS = ["--ignore-missing-imports", "--no-warn-return-any",
                    "--allow-subclassing-any", "--no-warn-unused-ignores"]


def compile_wanted() -> bool:
    return os.environ.get("MESHMQ_COMPILE", "1").strip().lower() not in ("0", "no", "false")


def compiled_modules() -> list[str]:
    """Source paths to compile, from ``[tool.meshmq.compile] modules``."""
    with (ROOT / "pyproject.toml").open("rb") as f:
        table = tomllib.load(f).get("tool", {}).get("meshmq", {}).get("compile", {})
    modules = table.get("modules", [])
    if not isinstance(modules, list) or not all(isinstance(m, str) for m in modules):
        raise ValueError("pyproject.toml: [tool.meshmq.compile] modules must be a list of "
                         "module names")
    paths = []
    for name in modules:
        path = ROOT / "src" / (name.replace(".", "/") + ".py")
        if not path.is_file():
            raise ValueError(f"pyproject.toml: [tool.meshmq.compile] modules: {name!r} is not "
                             f"a module ({path} does not exist)")
        paths.append(str(path.relative_to(ROOT)))
    return paths


def _extensions() -> list[Any]:
    from mypyc.build import mypycify

    old = Path.cwd()
    os.chdir(ROOT)  # mypy reads [tool.mypy] from ./pyproject.toml
    try:
        # The isolated build environment has setuptools and mypy only: optional and
        # runtime dependencies (wsproto, psycopg, uvloop) are not importable there.
        # Type-checking with them is CI's job (mypy --strict); here they are Any.
        exts = mypycify([*MYPY_BUILD_FLAGS, *compiled_modules()], opt_level="3",
                        debug_level="0", group_name="meshmq")
    finally:
        os.chdir(old)
    for ext in exts:
        ext.optional = True  # a failed C build leaves the pure-Python modules in the wheel
    return list(exts)


class _Backend(_BuildMetaBackend):
    def __init__(self) -> None:
        super().__init__()
        self.compiling = False

    def run_setup(self, setup_script: str = "setup.py") -> None:
        if not self.compiling:
            super().run_setup(setup_script)
            return
        from setuptools import setup

        print(f"meshmq: compiling {len(compiled_modules())} hot-path modules with mypyc "
              "(MESHMQ_COMPILE=0 to skip)", file=sys.stderr)
        setup(ext_modules=_extensions())

    def get_requires_for_build_wheel(self, config_settings: Any = None) -> list[str]:
        base = super().get_requires_for_build_wheel(config_settings)
        return [*base, MYPY_REQUIREMENT] if compile_wanted() else base

    def build_wheel(self, wheel_directory: str, config_settings: Any = None,
                    metadata_directory: str | None = None) -> str:
        self.compiling = compile_wanted()
        try:
            return super().build_wheel(wheel_directory, config_settings, metadata_directory)
        finally:
            self.compiling = False


_BACKEND = _Backend()
get_requires_for_build_wheel = _BACKEND.get_requires_for_build_wheel
get_requires_for_build_sdist = _BACKEND.get_requires_for_build_sdist
prepare_metadata_for_build_wheel = _BACKEND.prepare_metadata_for_build_wheel
build_wheel = _BACKEND.build_wheel
build_sdist = _BACKEND.build_sdist
get_requires_for_build_editable = _setuptools.get_requires_for_build_editable
prepare_metadata_for_build_editable = _setuptools.prepare_metadata_for_build_editable
build_editable = _setuptools.build_editable
