"""Which build of meshmq is running: the mypyc-compiled hot path or pure Python.

``pip install .`` builds the hot-path modules listed in pyproject.toml's
``[tool.meshmq.compile]`` with mypyc (build_backend/meshmq_build.py); an editable
install (``pip install -e .``) runs the same source as plain Python. Operators see the
build in the startup log, ``meshmq --version`` and ``/api/stat``.
"""

from __future__ import annotations

import importlib

# One module from each layer the compiled build covers; all or none are compiled.
_PROBES = ("meshmq.protocol.stomp.parser", "meshmq.core.queue", "meshmq.transport.stomp_server")


def compiled_modules() -> list[str]:
    """The probe modules that are loaded from a compiled extension."""
    found = []
    for name in _PROBES:
        path = getattr(importlib.import_module(name), "__file__", "") or ""
        if not path.endswith(".py"):
            found.append(name)
    return found


def compiled() -> bool:
    return len(compiled_modules()) == len(_PROBES)


def describe() -> str:
    done = compiled_modules()
    if len(done) == len(_PROBES):
        return "hot path compiled with mypyc"
    if not done:
        return "pure Python, not compiled (`pip install .` compiles the hot path)"
    return f"partly compiled ({', '.join(done)}): reinstall with `pip install .`"
