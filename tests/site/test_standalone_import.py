"""The site agent stands on its own: a process embedding it loads none of central.

``controlroom.site`` and every module under it import nothing of central's API, console,
error instance, site-call half or notification outbox; what both sides need lives below
them, in the pure telemetry contract (``controlroom.telemetry``) and
``controlroom.runtime``. The contract itself imports no database code and nothing of
either half. Nor does the site load a database it never uses: the provider registry
imports a provider on first use, so neither psycopg, the PostgreSQL provider nor central's
schema (``db/tables.py``) is loaded. Each check runs in a fresh interpreter, since this
test process has long loaded everything.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from collections.abc import Callable

CENTRAL = (
    "controlroom.api",
    "controlroom.web",
    "controlroom.errors",
    "controlroom.sitecalls",
    "controlroom.notifications",
)
BELOW_TELEMETRY = ("controlroom.telemetry", "controlroom.exceptions", "controlroom.runtime")
NOT_ON_SQLITE = ("psycopg", "controlroom.db.providers.postgresql", "controlroom.db.tables")

# Imports a package (argv[1]) and every module under it, and prints as JSON which
# controlroom, sqlalchemy and psycopg modules each import loaded first.
_PROBE = """
import importlib, json, pkgutil, sys

def loaded():
    return {m for m in sys.modules if m.split(".")[0] in ("controlroom", "sqlalchemy", "psycopg")}

before = loaded()
package = importlib.import_module(sys.argv[1])
firsts = {sys.argv[1]: sorted(loaded() - before)}
for info in pkgutil.walk_packages(package.__path__, sys.argv[1] + "."):
    before = loaded()
    importlib.import_module(info.name)
    firsts[info.name] = sorted(loaded() - before)
print(json.dumps(firsts))
"""


@functools.cache  # one fresh interpreter per package: the tests only read its answer
def _modules_loaded_by(package: str) -> dict[str, list[str]]:
    """``package`` and each module under it, mapped to the controlroom, sqlalchemy and
    psycopg modules its import loaded first, in a fresh interpreter on this ``sys.path``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    answer = subprocess.run(
        [sys.executable, "-c", _PROBE, package],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert answer.returncode == 0, answer.stderr
    firsts: dict[str, list[str]] = json.loads(answer.stdout)
    return firsts


def _within(name: str, packages: tuple[str, ...]) -> bool:
    return any(name == package or name.startswith(package + ".") for package in packages)


def _offenders(firsts: dict[str, list[str]], is_bad: Callable[[str], bool]) -> dict[str, list[str]]:
    """Each module whose import loaded a module ``is_bad`` says it must not, with those."""
    return {
        module: bad
        for module, loaded in firsts.items()
        if (bad := [name for name in loaded if is_bad(name)])
    }


def test_the_site_agent_imports_nothing_of_central() -> None:
    firsts = _modules_loaded_by("controlroom.site")
    assert {"controlroom.site.store", "controlroom.site.service"} <= set(firsts)  # walked
    assert _offenders(firsts, lambda name: _within(name, CENTRAL)) == {}


def test_the_site_agent_loads_no_postgresql_code_nor_central_s_schema() -> None:
    firsts = _modules_loaded_by("controlroom.site")
    everything = {name for loaded in firsts.values() for name in loaded}
    assert "controlroom.db.providers.sqlite" in everything  # the probe sees the providers
    assert _offenders(firsts, lambda name: _within(name, NOT_ON_SQLITE)) == {}


def test_the_telemetry_contract_imports_no_database_code_and_neither_half() -> None:
    firsts = _modules_loaded_by("controlroom.telemetry")
    assert {"controlroom.telemetry.contract", "controlroom.telemetry.widths"} <= set(firsts)
    offenders = _offenders(
        firsts, lambda name: name != "controlroom" and not _within(name, BELOW_TELEMETRY)
    )
    assert offenders == {}
