"""The databases the migrations are written for, named by every branch of their DDL.

Every ``upgrade`` and ``downgrade`` starts with ``dialect = migrating(revision)``, which
refuses any other database before the migration emits a statement: a third provider gets
its own branches first, and never falls into SQLite's (or PostgreSQL's) DDL. Every branch
on the answer names each dialect and ends in ``else: unsupported(dialect, revision)``, so
that a dialect added to ``Dialect`` makes mypy show each branch that lacks it.
"""

from __future__ import annotations

from typing import Literal, Never, NoReturn

from alembic import op

Dialect = Literal["postgresql", "sqlite"]


def migrating(revision: str) -> Dialect:
    """The dialect of the database migration ``revision`` runs on (online, or offline
    SQL generation). Raises ``NotImplementedError`` naming that dialect and ``revision``
    for any database but PostgreSQL and SQLite."""
    name = op.get_context().dialect.name
    if name == "postgresql":
        return "postgresql"
    if name == "sqlite":
        return "sqlite"
    _refuse(name, revision)


def unsupported(dialect: Never, revision: str) -> NoReturn:
    """The ``else`` of a branch on ``migrating``'s answer: unreachable while the branch
    names every ``Dialect`` (mypy checks it). Raises ``NotImplementedError``."""
    _refuse(dialect, revision)


def _refuse(name: str, revision: str) -> NoReturn:
    raise NotImplementedError(
        f"migration {revision} has no DDL for the {name} database "
        "(it is written for postgresql and sqlite only)"
    )
