"""The layers of ARCHITECTURE.md hold: imports run downwards only, the site agent library
imports neither half of central, and the console's routers never import the module that
mounts them. The rules are the import-linter contracts in pyproject.toml (``make lint``
runs them too); this test keeps ``make test`` from passing past a broken one."""

from __future__ import annotations

from pathlib import Path

import pytest
from importlinter.cli import lint_imports

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def test_every_import_contract_is_kept(capsys: pytest.CaptureFixture[str]) -> None:
    exit_code = lint_imports(config_filename=str(PYPROJECT), no_cache=True, no_logo=True)
    assert exit_code == 0, capsys.readouterr().out
