"""The DDL of counts the database keeps: signed counts per key of a table's rows that meet
a condition, kept by triggers in the transaction that changes a row, whatever code changes
it (docs/decisions.md "The database keeps the counts").

The mechanism of the failed messages' tallies and group counts (migrations 0012, 0014,
0016), written once for any counted table:

- the counts table holds the key's columns and ``n``; a key's count is the SUM of its rows;
- PostgreSQL: statement-level ``AFTER INSERT/UPDATE/DELETE`` triggers read the
  statement's transition tables and append one row per key whose count the statement
  changed (its net change), so two writers never wait on one counter row;
  ``Provider.compact_counts`` folds them to one row per key. Each statement runs by
  ``EXECUTE``, planned on each call with the transition tables' sizes (migration 0016).
  ``TRUNCATE`` of the counted table empties the counts;
- SQLite (one writer at a time): row-level triggers keep one row per key, updated in
  place, deleted when it reaches 0.

The condition may read only key columns (an update that changes no key column changes no
count, and SQLite's update trigger fires on the key's columns only).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from alembic import op


@dataclass(frozen=True)
class CountedRows:
    """Rows of ``table`` meeting ``condition`` counted per ``key`` in ``counts``."""

    table: str
    counts: str
    key: tuple[str, ...]
    condition: Callable[[str], str]
    """The condition on a row, given the row's name (``new``, a transition table's)."""
    name: str
    """The prefix of the triggers' (and PostgreSQL functions') names."""
    nullable: tuple[str, ...] = ()
    """Key columns that may be NULL (one value, as ``GROUP BY`` takes it)."""

    @property
    def columns(self) -> str:
        return ", ".join(self.key)

    def fill(self) -> str:
        """The statement counting the rows stored before the triggers."""
        return (
            f"INSERT INTO {self.counts} ({self.columns}, n) "
            f"SELECT {self.columns}, count(*) FROM {self.table} AS counted "
            f"WHERE {self.condition('counted')} GROUP BY {self.columns}"
        )


_OPERATIONS = ("insert", "update", "delete")


def create_postgresql_triggers(rows: CountedRows) -> None:
    """The statement-level triggers of ``rows`` (and their functions)."""

    def changes(alias: str, sign: str) -> str:
        return f"SELECT {rows.columns}, {sign}1 AS n FROM {alias} WHERE {rows.condition(alias)}"

    added, removed = changes("new_rows", ""), changes("old_rows", "-")
    bodies = {
        "insert": (added, "NEW TABLE AS new_rows"),
        "update": (f"{added} UNION ALL {removed}", "OLD TABLE AS old_rows NEW TABLE AS new_rows"),
        "delete": (removed, "OLD TABLE AS old_rows"),
    }
    for operation, (changed, referencing) in bodies.items():
        statement = (
            f"INSERT INTO {rows.counts} ({rows.columns}, n) "
            f"SELECT {rows.columns}, sum(n) FROM ({changed}) AS changes "
            f"GROUP BY {rows.columns} HAVING sum(n) <> 0"
        )
        op.execute(
            f"CREATE FUNCTION {rows.name}_{operation}() RETURNS trigger LANGUAGE plpgsql "
            f"AS $$ BEGIN EXECUTE $statement$ {statement} $statement$; RETURN NULL; END $$"
        )
        op.execute(
            f"CREATE TRIGGER {rows.name}_{operation} AFTER {operation.upper()} ON {rows.table} "
            f"REFERENCING {referencing} FOR EACH STATEMENT "
            f"EXECUTE FUNCTION {rows.name}_{operation}()"
        )
    # TRUNCATE waits for every writer of the table to finish: what is left is nothing.
    op.execute(
        f"CREATE FUNCTION {rows.name}_truncate() RETURNS trigger LANGUAGE plpgsql "
        f"AS $$ BEGIN DELETE FROM {rows.counts}; RETURN NULL; END $$"
    )
    op.execute(
        f"CREATE TRIGGER {rows.name}_truncate AFTER TRUNCATE ON {rows.table} "
        f"FOR EACH STATEMENT EXECUTE FUNCTION {rows.name}_truncate()"
    )


def drop_postgresql_triggers(rows: CountedRows) -> None:
    for operation in (*_OPERATIONS, "truncate"):
        op.execute(f"DROP TRIGGER {rows.name}_{operation} ON {rows.table}")
        op.execute(f"DROP FUNCTION {rows.name}_{operation}()")


def _sqlite_add(rows: CountedRows, row: str, sign: str) -> str:
    """Statements adding ``sign`` 1 to the count of ``row``'s key when ``row`` meets the
    condition (one row per key, none at 0)."""
    same = " AND ".join(
        f"{c} IS {row}.{c}" if c in rows.nullable else f"{c} = {row}.{c}" for c in rows.key
    )
    counted = rows.condition(row)
    values = ", ".join(f"{row}.{c}" for c in rows.key)
    return (
        f"UPDATE {rows.counts} SET n = n {sign} 1 WHERE {same} AND {counted}; "
        f"INSERT INTO {rows.counts} ({rows.columns}, n) SELECT {values}, {sign}1 "
        f"WHERE {counted} AND NOT EXISTS (SELECT 1 FROM {rows.counts} WHERE {same}); "
        f"DELETE FROM {rows.counts} WHERE {same} AND n = 0; "
    )


def create_sqlite_triggers(rows: CountedRows) -> None:
    """The row-level triggers of ``rows``."""
    changed = " OR ".join(f"old.{c} IS NOT new.{c}" for c in rows.key)
    op.execute(
        f"CREATE TRIGGER {rows.name}_insert AFTER INSERT ON {rows.table} "
        f"WHEN {rows.condition('new')} BEGIN {_sqlite_add(rows, 'new', '+')}END"
    )
    op.execute(
        f"CREATE TRIGGER {rows.name}_update AFTER UPDATE OF {rows.columns} ON {rows.table} "
        f"WHEN {changed} "
        f"BEGIN {_sqlite_add(rows, 'old', '-')}{_sqlite_add(rows, 'new', '+')}END"
    )
    op.execute(
        f"CREATE TRIGGER {rows.name}_delete AFTER DELETE ON {rows.table} "
        f"WHEN {rows.condition('old')} BEGIN {_sqlite_add(rows, 'old', '-')}END"
    )


def drop_sqlite_triggers(rows: CountedRows) -> None:
    for operation in _OPERATIONS:
        op.execute(f"DROP TRIGGER {rows.name}_{operation}")
