"""Feature code says nothing only some databases understand: a CTE fence
(``MATERIALIZED``), the place of NULL in a sort (``NULLS FIRST/LAST``), ``RETURNING`` of
an ``UPDATE`` or of an upsert. Each goes through a hook of ``db.providers.Provider``, so
adding a database is its provider module, not a hunt through the features (MariaDB
10.11 refuses the first three and answers the last differently). ARCHITECTURE.md "The
provider seam"."""

from __future__ import annotations

import ast
from pathlib import Path

import controlroom
from controlroom.db.engine import create_store_engine

PACKAGE = Path(controlroom.__file__).parent
STORE_DEFINITIONS = ("db/providers/", "db/migrations/", "db/tables.py")
"""Where database-specific SQL belongs (the provider modules, the migrations' per-provider
branches, the tables' per-provider column and index variants)."""


def feature_modules() -> list[Path]:
    return [
        path
        for path in sorted(PACKAGE.rglob("*.py"))
        if not path.relative_to(PACKAGE).as_posix().startswith(STORE_DEFINITIONS)
    ]


def root_call(node: ast.expr) -> ast.expr:
    """The start of a method chain: ``sa.delete(t)`` of ``sa.delete(t).where(...).x(...)``."""
    while True:
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            inner = node.func.value
            if isinstance(inner, ast.Call | ast.Attribute):
                node = inner
                continue
        if isinstance(node, ast.Attribute):
            node = node.value
            continue
        return node


def is_delete(node: ast.expr) -> bool:
    """``sa.delete(...)``: ``DELETE ... RETURNING`` every provider has (MariaDB since 10.0)."""
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "delete"
    )


def test_feature_code_leaves_fences_null_order_and_returning_to_the_provider() -> None:
    found = []
    for path in feature_modules():
        text = path.read_text()
        where = path.relative_to(PACKAGE)
        for word in ("MATERIALIZED", "nulls_first", "nulls_last", "nullsfirst", "nullslast"):
            if word in text:
                found.append(f"{where}: {word}")
        for node in ast.walk(ast.parse(text)):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "returning"
                and not is_delete(root_call(node.func.value))
            ):
                found.append(f"{where}:{node.lineno}: .returning() of a non-DELETE")

    assert found == []


def test_a_postgres_url_is_taken_for_postgresql() -> None:
    """Fresh-user pass: ``postgres://`` (Heroku's and many libraries' spelling) was
    refused as an unsupported provider; SQLAlchemy itself no longer takes it."""
    engine = create_store_engine("postgres://postgres@127.0.0.1:5432/controlroom")
    try:
        assert engine.dialect.name == "postgresql"
        assert engine.url.drivername == "postgresql+psycopg"
    finally:
        engine.dispose()
