"""The layer rules (pyproject.toml, ``[tool.importlinter]``) hold for the source tree.

The rules are about the source, whichever build the suite runs: lint-imports reads
``src/`` in a process of its own, so the compiled build's modules play no part.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def lint_imports(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run(
        [sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command;"
         " sys.exit(lint_imports_command())", "--no-cache", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False)


def test_layer_contracts_are_kept() -> None:
    result = lint_imports()
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_a_broken_rule_is_reported(tmp_path: Path) -> None:
    """The check can fail: a contract the tree breaks (the journal imports the core) is
    reported as broken."""
    config = tmp_path / "contracts.toml"
    config.write_text(
        '[tool.importlinter]\nroot_package = "meshmq"\n\n'
        "[[tool.importlinter.contracts]]\n"
        'name = "stores do not import the core"\ntype = "forbidden"\n'
        'source_modules = ["meshmq.store.journal"]\nforbidden_modules = ["meshmq.core"]\n')
    result = lint_imports("--config", str(config))
    assert result.returncode != 0
    assert "meshmq.store.journal" in result.stdout and "BROKEN" in result.stdout
