"""PostgreSQL, the production provider: psycopg 3, ``INSERT ... ON CONFLICT``.

Full-text search through the ``search_vector`` column (the terms the process computed,
as a ``tsvector``) and its GIN index (migration 0009); leases as session-level advisory
locks; SQLSTATE classification of errors (docs/design.md "Stores", "Transient failures").
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, ClassVar, Final

import psycopg
import psycopg.conninfo
import sqlalchemy as sa
from psycopg.types.array import ListBinaryDumper
from sqlalchemy.dialects.postgresql import ARRAY, TSQUERY, TSVECTOR, insert
from sqlalchemy.dialects.postgresql import psycopg as psycopg_dialect
from sqlalchemy.ext.compiler import compiles

from controlroom.db.leases import lease_key
from controlroom.db.providers._base import (
    AUDIT_PURGE_CHUNK,
    Assignments,
    Guard,
    OnConflictProvider,
    Returning,
    Row,
    SearchQuery,
    chunked,
    on_conflict_update,
)
from controlroom.db.providers._postgresql_roles import audit_log_exposure, grant_service_role
from controlroom.db.providers._postgresql_settings import server_settings_warnings
from controlroom.db.providers._postgresql_vacuum import vacuum_warnings
from controlroom.db.tables import (
    GROUP_HOURS_KEPT,
    failed_message_group_counts,
    failed_message_tallies,
    failed_message_tally_deltas,
)
from controlroom.db.transactions import begin_write
from controlroom.db.types import SearchTermsText, SearchTermsVector, UtcDateTime
from controlroom.exceptions import ErrorKind
from controlroom.runtime.lease import Lease
from controlroom.settings_sources import PORT_PROBLEM, is_host, is_ip_address

log = logging.getLogger(__name__)

# Memory for a search's bitmap of matching rows: at the default 4 MB, a term in 285,000
# of 1,000,000 rows made the bitmap lossy, and every row of a lossy page is rechecked
# against its detoasted search_vector (4 s instead of 1 s, benchmarks/query.py).
SEARCH_WORK_MEM = "64MB"

# Not modelled in db.tables (it exists on PostgreSQL only); a constant column name.
_SEARCH_VECTOR = sa.literal_column("failed_messages.search_vector", type_=TSVECTOR)

# SQLSTATE classes and codes that mean "try again": connection exceptions, serialization
# failure, deadlock, lock timeouts, admin shutdown, too many connections.
_TRANSIENT_SQLSTATE_PREFIXES = ("08", "40", "57P", "53")
_TRANSIENT_SQLSTATE_CODES = {"55P03", "57014"}
# Data exceptions (value too long, bad encoding, NUL) and program limits the input hit
# (a tsvector over 1 MB): the input is at fault, not the store.
_DATA_SQLSTATE_PREFIXES = ("22", "54")
_CANCEL_SECONDS = 5.0  # the longest a cancel request waits for the server


# The audit log is partitioned by month of occurred_at_utc (migration 0005). A partitioned
# table's unique keys must include the partition key, so event_id is kept unique across
# months by a table of its own: audit_event_ids. Partitions are made and dropped, and old
# events deleted, only by the owner's functions of migration 0019.
_AUDIT_EVENT_IDS = sa.Table(
    "audit_event_ids",
    sa.MetaData(),
    sa.Column("event_id", sa.String(36), primary_key=True),
    sa.Column("occurred_at_utc", UtcDateTime, nullable=False),
)


_TALLY_LOCK = lease_key("failed_message_tallies compaction")
_TALLY_KEY = [c.name for c in failed_message_tallies.c if c.name != "messages"]
_TALLY_COLUMNS = ", ".join(_TALLY_KEY)


def _tally_digest(table: str) -> str:
    """Migration 0015's index expression over ``table``'s key (the same text, so the
    planner matches it): the md5 of the text columns, never longer than 32 characters."""
    return (
        f"md5({table}.receiving_endpoint || '|' || coalesce({table}.receiving_host_id, '') "
        f"|| '|' || coalesce({table}.receiving_host, '') || '|' "
        f"|| coalesce({table}.message_type, ''))"
    )


# A key's tally found by status, system flag and digest (0015's index), then compared in
# full (NULL as one value), so keys of one digest never merge.
_SAME_TALLY_KEY = " AND ".join(
    [
        f"t.{c} = s.{c}"
        if c in ("status", "is_system_message", "receiving_endpoint")
        else f"t.{c} IS NOT DISTINCT FROM s.{c}"
        for c in _TALLY_KEY
    ]
    + [f"{_tally_digest('t')} = {_tally_digest('s')}"]
)
# One statement, one snapshot: the deltas it deletes are the ones it adds; a key with a
# tally before it is added to, any other gets its row (the NOT EXISTS reads the tallies as
# they were before the UPDATE, which adds no row).
_FOLD_TALLY_DELTAS = (
    f"WITH moved AS (DELETE FROM {failed_message_tally_deltas.name} "
    f"RETURNING {_TALLY_COLUMNS}, messages), "
    f"s AS (SELECT {_TALLY_COLUMNS}, sum(messages) AS messages FROM moved "
    f"GROUP BY {_TALLY_COLUMNS}), "
    f"added AS (UPDATE {failed_message_tallies.name} AS t "
    f"SET messages = t.messages + s.messages FROM s WHERE {_SAME_TALLY_KEY}) "
    f"INSERT INTO {failed_message_tallies.name} ({_TALLY_COLUMNS}, messages) "
    f"SELECT {_TALLY_COLUMNS}, messages FROM s WHERE NOT EXISTS "
    f"(SELECT FROM {failed_message_tallies.name} AS t WHERE {_SAME_TALLY_KEY})"
)


def _fold_counts(table: sa.Table) -> str:
    """The statement folding ``table``'s signed counts (key columns and ``n``, appended by
    statement triggers: migrations 0014, 0028) to one row per key, in one snapshot: only
    keys with more than one row, or a sum of 0, are rewritten; a key no write touched
    since the last fold keeps its row. A nullable key column matches NULL to NULL."""
    key = [c for c in table.c if c.name != "n"]
    columns = ", ".join(c.name for c in key)
    same = " AND ".join(
        f"c.{c.name} IS NOT DISTINCT FROM k.{c.name}" if c.nullable else f"c.{c.name} = k.{c.name}"
        for c in key
    )
    return (
        f"WITH keys AS (SELECT {columns} FROM {table.name} "
        f"GROUP BY {columns} HAVING count(*) > 1 OR sum(n) = 0), "
        f"folded AS (DELETE FROM {table.name} c USING keys k WHERE {same} "
        f"RETURNING {', '.join(f'c.{c.name}' for c in key)}, c.n) "
        f"INSERT INTO {table.name} ({columns}, n) "
        f"SELECT {columns}, sum(n) FROM folded "
        f"GROUP BY {columns} HAVING sum(n) <> 0"
    )


_FOLD_GROUP_COUNTS = _fold_counts(failed_message_group_counts)


def _listed(*values: str | Sequence[str] | None) -> list[str]:
    """The entries of libpq's comma-separated lists in ``values`` (a URL's part, or a
    query option given once or more), empty ones kept."""
    entries: list[str] = []
    for value in values:
        for item in [value] if isinstance(value, str) else value or ():
            entries.extend(item.split(","))
    return entries


_OPTION_VALUES: Final = {
    "sslmode": ("disable", "allow", "prefer", "require", "verify-ca", "verify-full"),
    "gssencmode": ("disable", "prefer", "require"),
    "channel_binding": ("disable", "prefer", "require"),
    "sslcertmode": ("disable", "allow", "require"),
    "sslnegotiation": ("postgres", "direct"),
    "load_balance_hosts": ("disable", "random"),
    "target_session_attrs": (
        "any", "read-write", "read-only", "primary", "standby", "prefer-standby"
    ),
}
"""The values libpq takes for its options of a few words (libpq's documentation,
"Parameter Key Words", PostgreSQL 17): any other it refuses before it connects, which
would be waited for as an unreachable store."""

_INTEGER_OPTIONS: Final = frozenset(
    {
        "connect_timeout",
        "keepalives",
        "keepalives_idle",
        "keepalives_interval",
        "keepalives_count",
        "tcp_user_timeout",
    }
)


def _option_value_problem(key: str, value: str | Sequence[str]) -> str | None:
    """Why libpq would refuse ``value`` of its option ``key`` before connecting, in a
    sentence naming the option but never quoting the value, or ``None``."""
    for item in [value] if isinstance(value, str) else value:
        if key in _OPTION_VALUES and item not in _OPTION_VALUES[key]:
            return f"its {key} must be one of {', '.join(_OPTION_VALUES[key])}"
        if key in _INTEGER_OPTIONS and not item.strip().lstrip("+-").isdigit():
            return f"its {key} must be a whole number"
    return None


class _IntegerListText(sa.types.TypeDecorator[Any]):
    """A list of integers as the text of a PostgreSQL array (``{1,2,3}``): how an array
    column's values travel as one element of an ``unnest`` parameter (an array of
    arrays would be one multidimensional array, which ``unnest`` flattens)."""

    impl = sa.Text
    cache_ok = True

    def process_bind_param(self, value: Sequence[int] | None, dialect: sa.Dialect) -> str | None:
        return None if value is None else "{" + ",".join(str(int(item)) for item in value) + "}"


_DIALECT = psycopg_dialect.dialect()  # type: ignore[no-untyped-call]  # unannotated in SQLAlchemy


def _array_element(column: sa.Column[Any]) -> tuple[Any, Callable[[Any], Any]]:
    """How ``column``'s values travel in one array parameter of ``unnest``: the array's
    element type, and the SQL that turns an element back into the column's value.

    Strings travel as unsized ``text``: a cast to ``varchar(n)[]`` would cut longer
    values silently, where the insert's assignment refuses them (nothing is truncated).
    """
    type_ = column.type.dialect_impl(_DIALECT)
    if isinstance(type_, SearchTermsVector):
        return SearchTermsText(), type_.bind_expression
    if isinstance(type_, ARRAY):
        if not isinstance(type_.item_type, sa.Integer):
            raise NotImplementedError(f"{column}: only integer arrays travel in an unnest")
        return _IntegerListText(), lambda element: sa.cast(element, type_)
    if isinstance(type_, sa.String):
        return sa.Text(), lambda element: element
    return column.type, lambda element: element


def _array_parameter(name: str) -> str:
    return f"{name}_values"


def _rows_of_arrays(table: sa.Table, names: Sequence[str]) -> sa.Select[Any]:
    """``SELECT ... FROM unnest(:a_values, :b_values, ...) WITH ORDINALITY ORDER BY
    ordinality``: the rows whose values ``_column_arrays`` binds, one array per column
    of ``names``, in the order given. The text is the same for any number of rows."""
    elements = [_array_element(table.c[name]) for name in names]
    arrays = [
        # One dimension: each element is one row's value (a list value stays one element).
        sa.bindparam(_array_parameter(name), type_=ARRAY(element_type, dimensions=1))
        for name, (element_type, _) in zip(names, elements, strict=True)
    ]
    each = (
        sa.func.unnest(*arrays)
        .table_valued(*names, with_ordinality="ordinality")
        .render_derived(name="incoming")
    )
    values = [
        to_value(each.c[name]).label(name)
        for name, (_, to_value) in zip(names, elements, strict=True)
    ]
    # In the given order: concurrent writers lock rows in the order the caller sorted.
    return sa.select(*values).order_by(each.c.ordinality)


def _column_arrays(names: Sequence[str], rows: Sequence[Row]) -> dict[str, list[Any]]:
    """The parameters of ``_rows_of_arrays(table, names)`` for ``rows``."""
    return {_array_parameter(name): [row[name] for row in rows] for name in names}


def _send_lists_in_binary(dbapi_connection: psycopg.Connection[Any], _record: Any) -> None:
    """Bind Python lists (the arrays of ``unnest`` statements, ``is_one_of``) in
    PostgreSQL's binary array format on this connection. psycopg's default text format
    quotes and escapes each element in Python (a regular expression substitution per
    quote or backslash: headers JSON and stack traces hold thousands), which cost more
    client CPU than the statement it fed (``benchmarks/ingest.py``); the binary format
    sends each element as its length and bytes. Lists with no element that is not
    ``None`` still go as text (psycopg's own fallback)."""
    dbapi_connection.adapters.register_dumper(list, ListBinaryDumper)


class _Explain(sa.sql.expression.Executable, sa.sql.expression.ClauseElement):
    """``EXPLAIN (FORMAT JSON) <query>``, the query's parameters bound as usual."""

    inherit_cache = False

    def __init__(self, query: sa.Select[Any]) -> None:
        self.query = query


@compiles(_Explain, "postgresql")
def _compile_explain(element: _Explain, compiler: sa.sql.compiler.SQLCompiler, **kw: Any) -> str:
    return "EXPLAIN (FORMAT JSON) " + compiler.process(element.query, **kw)


def _lexeme(term: str, *, prefix: bool = False) -> str:
    """``term`` as one quoted lexeme of ``tsquery`` input, as the server prints a
    ``tsvector``'s lexeme (quotes and backslashes doubled), so none of its characters is
    read as syntax; with ``prefix`` marked ``:*`` (any lexeme starting with it)."""
    quoted = "'" + term.replace("\\", "\\\\").replace("'", "''") + "'"
    return quoted + ":*" if prefix else quoted


def _tsquery_text(query: SearchQuery) -> str:
    """The ``tsquery`` input text of ``query``: an alternative's lexemes joined by ``&``,
    the alternatives by ``|``. One flat string, whatever the number of terms."""
    return " | ".join(
        "(" + " & ".join(lexemes) + ")"
        for terms in query.alternatives
        if (
            lexemes := [_lexeme(term) for term in terms.words]
            + [_lexeme(term, prefix=True) for term in terms.prefixes]
        )
    )


class AdvisoryLockLease:
    """A lease held as a session-level ``pg_try_advisory_lock`` on a dedicated connection.

    The lock lives exactly as long as that connection: when the process dies or the
    connection breaks, the server releases it and another process can take over. The
    connection runs in autocommit so holding the lock never holds a transaction open.
    Advisory locks are per database, so separate databases never contend.
    """

    def __init__(self, engine: sa.Engine, name: str) -> None:
        self.name = name
        self._engine = engine
        self._key = lease_key(name)
        self._conn: sa.Connection | None = None

    def hold(self) -> bool:
        if self._conn is not None:
            if self._still_connected(self._conn):
                return True
            log.warning("lost the connection holding lease %r", self.name)
            self._discard()
        conn = self._engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        try:
            acquired = conn.execute(sa.select(sa.func.pg_try_advisory_lock(self._key))).scalar_one()
        except BaseException:
            conn.invalidate()
            conn.close()
            raise
        if not acquired:
            conn.close()
            return False
        self._conn = conn
        return True

    def release(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        try:
            conn.execute(sa.select(sa.func.pg_advisory_unlock(self._key)))
            conn.close()
        except sa.exc.DBAPIError:
            # Never return a connection that may still hold the lock to the pool.
            conn.invalidate()
            conn.close()

    @staticmethod
    def _still_connected(conn: sa.Connection) -> bool:
        try:
            conn.execute(sa.text("SELECT 1"))
        except sa.exc.DBAPIError:
            return False
        return True

    def _discard(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.invalidate()
            conn.close()


def address_identity(conn: sa.Connection) -> str:
    """The database of ``conn`` by the address and port its server answered on (one for
    ``localhost`` and ``127.0.0.1``): ``store_identity`` where ``pg_control_system()`` is
    refused."""
    address, port, database, schema = conn.execute(
        sa.text(
            "SELECT inet_server_addr(), inet_server_port(), current_database(), current_schema()"
        )
    ).one()
    return f"PostgreSQL at {address or 'its socket'}:{port}, database {database}, schema {schema}"


GROUP_APPEARANCE_LOCKS = 0x67727061  # "grpa": the first key of the groups' appearance locks
RETRY_SELECTION_LOCKS = 0x72657472  # "retr": the first key of the retry selections' locks


_ADVICE = {
    "3F000": (  # invalid_schema_name
        "the schema that search_path names does not exist in this database: its owner "
        "creates it (CREATE SCHEMA), or correct ?options=-csearch_path"
    ),
    "25006": (  # read_only_sql_transaction
        "the server takes no writes here: a standby, or sessions made read-only "
        "(default_transaction_read_only in the URL's options, the role's or the "
        "database's settings); give the primary's URL, read-write"
    ),
    "42501": (  # insufficient_privilege
        "this database user lacks a privilege: the schema's owner migrates "
        "(CONTROLROOM_MIGRATION_DATABASE_URL), and the user of CONTROLROOM_DATABASE_URL, "
        "once migrate made it the service role, may only read the schema's tables and "
        "write through the service"
    ),
}
"""What an operator does about a server's refusal that the deployment causes, by SQLSTATE
(https://www.postgresql.org/docs/current/errcodes-appendix.html)."""


class PostgreSQLProvider(OnConflictProvider):
    name: ClassVar[str] = "postgresql"
    max_bound_parameters: ClassVar[int] = 65535  # the protocol's 16-bit parameter count
    keeps_tally_deltas: ClassVar[bool] = True
    claims_rows_concurrently: ClassVar[bool] = True

    def insert(self, table: sa.Table) -> Any:
        return insert(table)

    def bound_rows(self, table: sa.Table, names: Sequence[str]) -> sa.Subquery:
        # SELECT ... FROM unnest(:a_values, :b_values, ...): one array per column.
        return _rows_of_arrays(table, names).subquery("given")

    def bound_rows_parameters(self, names: Sequence[str], rows: Sequence[Row]) -> dict[str, Any]:
        return _column_arrays(names, rows)

    def upsert_rows(
        self,
        table: sa.Table,
        *,
        columns: Sequence[str],
        key: Sequence[sa.Column[Any]],
        set_: Assignments,
        where: Guard | None = None,
        returning: Returning = (),
    ) -> Any:
        """``INSERT ... SELECT ... FROM unnest(:col1_values, ...) WITH ORDINALITY ... ON
        CONFLICT ... DO UPDATE ... WHERE ...``: one array parameter per column, so the
        text is the same for 1 row and for 50. psycopg prepares a text it has run
        ``prepare_threshold`` (5) times on a connection: the server parses and plans it
        once per connection. The multi-row ``VALUES`` form it replaces had
        a text per number of rows and about 1,700 placeholders per 50 rows, which psycopg
        rewrote one by one and the server parsed and planned on every execution."""
        source = _rows_of_arrays(table, columns)
        statement = insert(table).from_select(list(columns), source)
        statement = on_conflict_update(statement, key=key, set_=set_, where=where)
        # ON CONFLICT ... DO UPDATE ... WHERE returns no row for a conflict WHERE refused.
        return statement.returning(*returning) if returning else statement

    def inserted_flag(self, table: sa.Table) -> sa.ColumnElement[bool]:
        """``xmax = 0`` of the row version the statement wrote (docs/decisions.md "The
        upsert says which rows it inserted"): a version an ``INSERT`` made has no
        ``xmax``; the version ``ON CONFLICT ... DO UPDATE`` made carries the transaction's
        own lock of the row it replaced, which the update keeps (so does one that waited
        for a concurrent inserter of the same key)."""
        return sa.literal_column(f"({table.name}.xmax = 0)", sa.Boolean)

    def write_rows(
        self, conn: sa.Connection, statement: Any, rows: Sequence[Row]
    ) -> list[sa.Row[*tuple[Any, ...]]]:
        returned: list[sa.Row[*tuple[Any, ...]]] = []
        for chunk in chunked(rows, self.max_rows_per_statement):
            result = conn.execute(statement, _column_arrays(list(chunk[0]), chunk))
            if result.returns_rows:
                returned.extend(result.all())
        return returned

    def materialized_cte(self, query: sa.Select[Any], name: str) -> sa.CTE:
        # Since PostgreSQL 12 a CTE read once is inlined unless marked MATERIALIZED.
        return query.cte(name).prefix_with("MATERIALIZED")

    def fenced(self, query: sa.Select[Any], name: str) -> sa.Subquery:
        # A subquery with an OFFSET (here LIMIT ALL OFFSET 0, which returns every row) is
        # never pulled up into the statement reading it: it is planned on its own and,
        # its reader sorting, for all its rows. Its scan streams into the reader's sort (a
        # top-N heapsort of the page's end under a LIMIT), where a MATERIALIZED CTE fills
        # a tuplestore with every row first (spilling out of work_mem at 72,000 rows,
        # benchmarks/README.md "stopped.py").
        return query.offset(sa.literal_column("0")).subquery(name)

    def octet_length(self, text: sa.ColumnElement[Any]) -> sa.ColumnElement[int]:
        return sa.func.octet_length(text, type_=sa.Integer)

    def order_nulls_smallest(
        self, column: sa.ColumnElement[Any], *, descending: bool
    ) -> sa.ColumnElement[Any]:
        # PostgreSQL sorts NULL as the largest value unless told otherwise.
        return column.desc().nulls_last() if descending else column.asc().nulls_first()

    def is_one_of(
        self, column: sa.ColumnElement[Any], values: Sequence[Any]
    ) -> sa.ColumnElement[bool]:
        return column == sa.any_(sa.literal(list(values), ARRAY(column.type)))

    def list_elements(self, values: sa.ColumnElement[Any]) -> Any:
        return sa.func.unnest(values).table_valued("value").render_derived()

    def list_length(self, values: sa.ColumnElement[Any]) -> sa.ColumnElement[int]:
        return sa.func.cardinality(values, type_=sa.Integer)

    def aggregate_list(self, values: sa.Select[Any]) -> sa.ColumnElement[Any]:
        # ARRAY(subquery): the subquery's rows, in its order, as an array.
        return sa.func.array(values.scalar_subquery(), type_=ARRAY(sa.BigInteger))

    def search_matches(
        self, query: SearchQuery, *, among: sa.Select[Any] | None = None
    ) -> sa.ColumnElement[bool]:
        """``search_vector @@ CAST(:query AS tsquery)``, the query one bound string
        (``_tsquery_text``): an alternative's terms joined by ``&``, the alternatives by
        ``|``, each term a quoted lexeme, a prefix's marked ``:*`` (the GIN index answers
        it from the range of lexemes it starts). Casting text to ``tsquery`` runs no
        parser, and each term is quoted as the server quotes a lexeme, so no term is ever
        read as ``tsquery`` syntax (``&``, ``|``, ``!``, ``:*``, quotes, backslashes);
        one flat string, so any number of words compiles (a nested expression of 155
        ran SQLAlchemy's compiler out of recursion depth).
        Only the terms: a phrase would make PostgreSQL recheck every candidate against
        its detoasted vector (``benchmarks/query.py``); terms alone are answered from the
        GIN index. With ``among`` (a window of rows to test), the vector is wrapped so no
        index answers the test: the planner prices a prefix as a rare word (4,449
        estimated of 59,247 matching at 1,000,000) and would collect every match from the
        GIN index to join to the window: 262 ms, where testing the 2,324 rows took 32
        (``benchmarks/README.md``, query.py)."""
        if query.empty:
            return sa.false()
        text = sa.cast(sa.literal(_tsquery_text(query), sa.Text), TSQUERY)
        vector: sa.ColumnElement[Any] = _SEARCH_VECTOR
        if among is not None:
            vector = sa.func.coalesce(vector, sa.cast(sa.literal(""), TSVECTOR), type_=TSVECTOR)
        return vector.bool_op("@@")(text)

    def estimate_rows(self, conn: sa.Connection, query: sa.Select[Any]) -> int | None:
        """The planner's row estimate of ``query``: ``EXPLAIN (FORMAT JSON)``'s top
        ``Plan Rows``, from the table statistics ``ANALYZE`` (or autovacuum) keeps; a plan
        costs well under a millisecond, where counting 150,000 rows read every one."""
        plan = conn.execute(_Explain(query)).scalar_one()
        if isinstance(plan, str):
            plan = json.loads(plan)
        return int(plan[0]["Plan"]["Plan Rows"])

    def compact_tallies(self, conn: sa.Connection) -> bool:
        """The deltas committed so far, deleted and added to their keys' tallies in one
        statement (the rows deleted are the rows added), then the keys counted down to
        0 deleted. Under a transaction-level advisory lock that a second compactor does
        not wait for: two compactors would only queue on the same tally rows, and this
        one being the tallies' only writer keeps one row per key (migration 0015: no
        unique index, which a long key could not fit). Writers never touch the tallies
        (migration 0012), so this blocks no writer."""
        if not conn.execute(sa.select(sa.func.pg_try_advisory_xact_lock(_TALLY_LOCK))).scalar():
            return False
        conn.exec_driver_sql(_FOLD_TALLY_DELTAS)
        conn.exec_driver_sql(f"DELETE FROM {failed_message_tallies.name} WHERE messages = 0")
        return True

    def prepare_search(self, conn: sa.Connection) -> None:
        """The planner does not know that ``@@`` detoasts each row's ``search_vector``:
        for a broad term it prefers scanning the whole table (5.7 s for a count over
        1,000,000 rows) to the GIN index (1 s). Without sequential scans it takes the
        index, or walks a sort key's index when a page needs only a few rows. That prices
        every plan of the transaction past ``jit_above_cost``: JIT compiling the tallies'
        sum of a thousand rows cost 60-130 ms, so JIT is off too. ``SET LOCAL`` ends with
        the transaction."""
        conn.exec_driver_sql(f"SET LOCAL work_mem = '{SEARCH_WORK_MEM}'")
        conn.exec_driver_sql("SET LOCAL enable_seqscan = off")
        conn.exec_driver_sql("SET LOCAL jit = off")

    def compact_group_counts(self, conn: sa.Connection) -> None:
        """Fold the rows the statement triggers appended (migrations 0014 and 0022), each
        table in one statement: the rows it deletes are those committed when it started,
        and their sums go back in the same transaction, so no reader sees a key counted
        twice or not at all. Two compactions at once are safe: the later one skips the rows
        the earlier deleted. Group counts: only keys with more than one row, or a sum of 0,
        are folded: a key no write touched since the last fold keeps its row, so a fold
        leaves dead rows for the keys that changed, not for every key (docs/decisions.md
        "The counter tables are vacuumed as they turn over")."""
        conn.exec_driver_sql(_FOLD_GROUP_COUNTS)
        # The failures per hour of migration 0022 likewise, without the hours past keeping.
        conn.exec_driver_sql(
            "WITH folded AS (DELETE FROM failed_message_group_hours "
            "RETURNING group_id, hour, n) "
            "INSERT INTO failed_message_group_hours (group_id, hour, n) "
            "SELECT group_id, hour, sum(n) FROM folded "
            "WHERE hour >= floor(extract(epoch FROM now()) / 3600)::bigint - "
            f"{GROUP_HOURS_KEPT} GROUP BY group_id, hour"
        )

    def compact_counts(self, conn: sa.Connection, table: sa.Table) -> None:
        """Fold ``table``'s rows to one per key (``_fold_counts``) in ``conn``'s
        transaction: the rows it deletes are those committed when it started, and their
        sums go back in the same transaction, so no reader sees a key counted twice or
        not at all. Writers only append, so it makes no writer wait; two folds at once are
        safe (the later skips the rows the earlier deleted)."""
        conn.exec_driver_sql(_fold_counts(table))

    def lock_for_claim(self, query: sa.Select[Any]) -> sa.Select[Any]:
        # FOR UPDATE SKIP LOCKED: claimers in short transactions never wait for each
        # other, and never take one row twice.
        return query.with_for_update(skip_locked=True)

    def make_lease(self, engine: sa.Engine, name: str, owner: str, seconds: float) -> Lease:
        # owner and seconds do not apply: the server knows the holder and its liveness.
        return AdvisoryLockLease(engine, name)

    def create_engine(self, url: sa.URL, *, pool_size: int) -> sa.Engine:
        # Pre-ping: a restarted server costs one retry, not a failed batch. hide_parameters:
        # errors (and the retry warnings that log them) never carry the bound values,
        # which are message bodies and headers (docs/decisions.md "Store errors never carry
        # message data").
        engine = sa.create_engine(
            url,
            pool_pre_ping=True,
            pool_size=pool_size,
            max_overflow=pool_size,
            hide_parameters=True,
        )
        sa.event.listen(engine, "connect", _send_lists_in_binary)
        return engine

    def normalize_url(self, url: sa.URL) -> sa.URL:
        if url.drivername in (self.name, "postgres"):
            return url.set(drivername=f"{self.name}+psycopg")
        return url

    def url_problem(self, url: sa.URL) -> str | None:
        if not url.database:  # libpq would take the user's name, and migrate that database
            return "it names no database: postgresql://user@host:5432/database"
        # libpq would take these over the URL's own parts, without a word.
        if "dbname" in url.query:
            return "the database goes in its path (postgresql://host/database), not ?dbname="
        if "user" in url.query:
            return "the user goes before its host (postgresql://user@host/database), not ?user="
        # libpq takes hosts and ports from the URL and from its query, each a list.
        hosts = _listed(url.host, url.query.get("host"))
        for host in hosts:
            # Empty: libpq's default socket; "/" a socket directory, "@" Linux's abstract
            # namespace.
            if host and not host.startswith(("/", "@")) and not is_host(host):
                return "its host is no host name, IP address or socket directory (/path)"
        for address in _listed(url.query.get("hostaddr")):
            if address and not is_ip_address(address):
                return "its hostaddr is no IP address"
        ports = _listed(None if url.port is None else str(url.port), url.query.get("port"))
        for port in ports:  # libpq takes 0 for its default port
            if port and not (port.isdigit() and 1 <= int(port) <= 65535):
                return PORT_PROBLEM
        # libpq: one port, or one for each host (those of ?host= when it is given).
        named = _listed(url.query.get("host")) or _listed(url.host)
        if len(ports) > 1 and len(ports) != len(named):
            return "it gives more than one port, but not one for each of its hosts"
        for key, value in url.query.items():
            if (problem := _option_value_problem(key, value)) is not None:
                return problem
        options = {key: str(value) for key, value in url.query.items()}
        try:
            psycopg.conninfo.make_conninfo("", **options)  # libpq's own parse of its options
        except psycopg.ProgrammingError as exc:  # names the option, never its value
            return f"libpq knows no {str(exc).strip().removeprefix('invalid ')} in its query"
        return None

    def error_code(self, exc: BaseException) -> str | None:
        return exc.sqlstate if isinstance(exc, psycopg.Error) else None

    def advice(self, exc: BaseException) -> str | None:
        return _ADVICE.get(self.error_code(exc) or "")

    def classify_error(self, exc: BaseException) -> ErrorKind | None:
        if not isinstance(exc, psycopg.Error):
            return None
        if isinstance(exc, psycopg.DataError) and exc.sqlstate is None:
            return ErrorKind.DATA  # refused by psycopg itself, e.g. a NUL in a text parameter
        sqlstate = exc.sqlstate
        if sqlstate is None:
            # No server answer at all: the connection failed or was lost.
            return (
                ErrorKind.TRANSIENT
                if isinstance(exc, psycopg.OperationalError)
                else ErrorKind.FATAL
            )
        if (
            sqlstate.startswith(_TRANSIENT_SQLSTATE_PREFIXES)
            or sqlstate in _TRANSIENT_SQLSTATE_CODES
        ):
            return ErrorKind.TRANSIENT
        if sqlstate.startswith(_DATA_SQLSTATE_PREFIXES):
            return ErrorKind.DATA
        return ErrorKind.FATAL

    @contextmanager
    def limit_statement_time(self, conn: sa.Connection, seconds: float) -> Iterator[None]:
        # 0 would mean "no limit"; past 2^31 - 1 ms the server refuses the setting.
        milliseconds = min(max(1, int(seconds * 1000)), 2**31 - 1)
        conn.exec_driver_sql(f"SET LOCAL statement_timeout = {milliseconds}")
        yield  # SET LOCAL ends with the transaction

    def claim_audit_events(self, conn: sa.Connection, rows: Sequence[Row]) -> list[Row]:
        """Claim each ``event_id`` in ``audit_event_ids`` (insert-if-absent); the rows
        claimed here, first of each id, in order. A concurrent writer of the same event
        waits on the claim and, once this transaction commits, claims nothing."""
        if not rows:
            return []
        claims = [
            {"event_id": r["event_id"], "occurred_at_utc": r["occurred_at_utc"]} for r in rows
        ]
        claimed = set(
            conn.execute(
                self.insert_if_absent(
                    _AUDIT_EVENT_IDS,
                    key=[_AUDIT_EVENT_IDS.c.event_id],
                    returning=[_AUDIT_EVENT_IDS.c.event_id],
                ),
                claims,
                execution_options=self.executemany_options(),
            ).scalars()
        )
        fresh = []
        for row in rows:
            if row["event_id"] in claimed:
                claimed.discard(row["event_id"])
                fresh.append(row)
        return fresh

    def lock_audit_chains(self, conn: sa.Connection, months: Sequence[int]) -> None:
        """A transaction-level advisory lock per month, taken in order (no two writers
        wait on each other crosswise). Taken after the claims: a writer holding a chain
        never waits for another's claim. Read committed: the head read after the lock
        sees the previous holder's committed events."""
        for month in months:
            key = lease_key(f"audit chain {month}")
            conn.execute(sa.select(sa.func.pg_advisory_xact_lock(key)))

    def prepare_audit_log(self, engine: sa.Engine) -> None:
        """The month partitions of the server's month and the two after it, by the owner's
        ``audit_log_prepare_partitions()`` (a month whose events already sit in the
        default partition keeps them there: the function warns and goes on)."""
        with begin_write(engine) as conn:
            conn.execute(sa.select(sa.func.audit_log_prepare_partitions()))

    def purge_audit_log(
        self, engine: sa.Engine, retention_days: int, *, chunk: int = AUDIT_PURGE_CHUNK
    ) -> tuple[int, datetime]:
        """The owner's ``audit_log_purge``: each month partition wholly before the first
        month kept is dropped with its claims, and the default partition's events of
        those months deleted, ``chunk`` per call. The function computes the months from
        the server's clock and the policy's floor; the caller can ask for no less."""
        deleted = 0
        while True:
            with begin_write(engine) as conn:
                purged, from_default, kept_from = conn.execute(
                    sa.text("SELECT * FROM audit_log_purge(:days, :rows)"),
                    {"days": retention_days, "rows": chunk},
                ).one()
            deleted += purged
            if from_default < chunk:
                return deleted, kept_from.replace(tzinfo=UTC)

    def grant_service_role(self, conn: sa.Connection, service: sa.URL) -> str | None:
        return grant_service_role(conn, service)

    def audit_log_exposure(self, conn: sa.Connection) -> str | None:
        return audit_log_exposure(conn)

    def vacuum_warnings(self, conn: sa.Connection) -> list[str]:
        return vacuum_warnings(conn)

    def server_settings_warnings(self, conn: sa.Connection) -> list[str]:
        return server_settings_warnings(conn)

    def lock_retry_selection(self, conn: sa.Connection, key: str) -> None:
        conn.execute(
            sa.select(sa.func.pg_advisory_xact_lock(RETRY_SELECTION_LOCKS, sa.func.hashtext(key)))
        )

    def lock_group_appearances(self, conn: sa.Connection, group_ids: Sequence[str]) -> None:
        # The two-key form: a key space of its own, apart from the leases' one-key locks.
        for group_id in sorted(group_ids):
            conn.execute(
                sa.select(
                    sa.func.pg_advisory_xact_lock(
                        GROUP_APPEARANCE_LOCKS, sa.func.hashtext(group_id)
                    )
                )
            )

    def store_identity(self, conn: sa.Connection) -> str:
        # The cluster's identifier (initdb's, kept by its replicas and backups), the
        # database's name in it and the schema the tables are in (a search_path of its
        # own is another store). A managed server may refuse pg_control_system() to its
        # users: then the address and port the server answered on.
        try:
            cluster, database, schema = conn.execute(
                sa.text(
                    "SELECT system_identifier, current_database(), current_schema() "
                    "FROM pg_control_system()"
                )
            ).one()
        except sa.exc.DBAPIError:
            conn.rollback()
            return address_identity(conn)
        return f"PostgreSQL cluster {cluster}, database {database}, schema {schema}"

    def cancel_statement(self, dbapi_connection: Any) -> None:
        # psycopg's cancel_safe: thread-safe, and waits at most its timeout for the server.
        dbapi_connection.cancel_safe(timeout=_CANCEL_SECONDS)

    def local_backend_pid(self, dbapi_connection: Any) -> int | None:
        # A Unix socket or a loopback address, and a process named postgres under that
        # id here: in another host's or container's process space the id means nothing.
        info = dbapi_connection.info
        if not (str(info.host).startswith("/") or info.host in _LOOPBACK):
            return None
        pid = int(info.backend_pid)
        try:
            with open(f"/proc/{pid}/comm", encoding="utf-8") as comm:
                return pid if comm.read().strip() == "postgres" else None
        except OSError:
            return None

    def migration_lock(self, conn: sa.Connection) -> None:
        # Processes starting together against a fresh database migrate one after the
        # other; the lock ends with the transaction.
        conn.execute(sa.select(sa.func.pg_advisory_xact_lock(lease_key("controlroom-migrations"))))


_LOOPBACK = frozenset({"localhost", "127.0.0.1", "::1"})

PROVIDER = PostgreSQLProvider()
