"""The layers of ARCHITECTURE.md hold: imports run downwards only, the site agent library
imports neither half of central, and the console's routers never import the module that
mounts them. The rules are the import-linter contracts in pyproject.toml (``make lint``
runs them too); this test keeps ``make test`` from passing past a broken one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def test_every_import_contract_is_kept() -> None:
    # In a process of its own: import-linter configures logging with dictConfig, which
    # disables every logger that exists already, and later tests would see no records.
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    linted = subprocess.run(
        [LINT_IMPORTS, "--config", ROOT / "pyproject.toml", "--no-cache"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=300,
        check=False,
    )
    assert linted.returncode == 0, linted.stdout + linted.stderr
