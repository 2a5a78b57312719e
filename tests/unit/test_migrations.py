"""The migrations are frozen and name their databases: no migration imports live feature
code (changing it would change what an old migration does to a new database), and each
migration refuses a database it has no DDL for before emitting a statement, rather than
fall into another provider's DDL (a MariaDB database, its SQL generated offline)."""

from __future__ import annotations

import ast
import io
from pathlib import Path
from types import ModuleType

import pytest
from alembic.migration import MigrationContext
from alembic.operations import Operations
from alembic.script import ScriptDirectory

from controlroom.db.migrate import MIGRATIONS_DIR

ALLOWED = "controlroom.db.migrations"
"""The one controlroom package a migration may import: the migrations' own helpers."""

SCRIPTS = ScriptDirectory(str(MIGRATIONS_DIR))
REVISIONS = sorted(script.revision for script in SCRIPTS.walk_revisions())


def migration(revision: str) -> ModuleType:
    script = SCRIPTS.get_revision(revision)
    assert script is not None
    return script.module


def imported_modules(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            names.append(node.module)
    return names


def test_every_migration_is_checked() -> None:
    assert len(REVISIONS) == len(list((MIGRATIONS_DIR / "versions").glob("0*.py")))


@pytest.mark.parametrize("path", sorted((MIGRATIONS_DIR / "versions").glob("*.py")), ids=str)
def test_no_migration_imports_controlroom_code(path: Path) -> None:
    # Feature packages (errors, sitecalls, api, web, site) above all, but also the
    # providers and db.types: a migration keeps its own copy of what it runs.
    foreign = [
        name
        for name in imported_modules(path)
        if name.split(".")[0] == "controlroom" and not name.startswith(ALLOWED)
    ]
    assert foreign == [], f"{path.name} imports live code: {foreign}"


@pytest.mark.parametrize("step", ["upgrade", "downgrade"])
@pytest.mark.parametrize("revision", REVISIONS)
def test_each_migration_refuses_a_database_it_has_no_ddl_for(revision: str, step: str) -> None:
    sql = io.StringIO()
    context = MigrationContext.configure(
        url="mariadb://root@127.0.0.1:3306/test", opts={"as_sql": True, "output_buffer": sql}
    )
    with Operations.context(context), pytest.raises(NotImplementedError) as refused:
        getattr(migration(revision), step)()
    assert f"migration {revision} " in str(refused.value)
    assert "mariadb" in str(refused.value)
    assert sql.getvalue() == ""  # refused before its first statement


def test_each_migrations_message_is_one_line() -> None:
    """Alembic logs a migration's message (its docstring's first paragraph) at every start
    that migrates: a line break in it left a bare line in serve's log (fresh-user pass,
    sixth)."""
    broken = [s.revision for s in SCRIPTS.walk_revisions() if "\n" in (s.doc or "").strip()]
    assert broken == []
