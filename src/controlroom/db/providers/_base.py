"""What every provider offers: the hooks feature code calls, and the shared ``ON CONFLICT``
constructs of providers whose ``insert()`` has them.

A provider is a frozen object with capability flags and limits as attributes and the
statements that genuinely differ between databases as methods. Feature code builds its
own guards and assignments (the rules are ours, not the database's) and asks the provider
only for the construct that carries them. Source: docs/design.md "The provider seam".
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, ClassVar, TypeVar

import sqlalchemy as sa

from controlroom.db.audit_chain import Head, chain_month, link_events
from controlroom.exceptions import ErrorKind
from controlroom.runtime.lease import Lease

# Central's schema (db/tables.py) is imported by the hooks that use it, not here: the site
# agent's own store runs on the SQLite provider and loads none of it.

Row = Mapping[str, Any]

T = TypeVar("T")

MAX_ROWS_PER_STATEMENT = 50
"""Rows per set-based write statement (docs/design.md: one statement per chunk of at most 50)."""
AUDIT_PURGE_CHUNK = 500
"""Audit rows deleted per transaction by the row-by-row purge (short write locks)."""

Assignments = Callable[[Any], Mapping[str, sa.ColumnElement[Any]]]
"""``SET`` clause builder: given the incoming row (``excluded``), the column assignments.
Inside them the table's own columns read the stored, pre-update row."""

Guard = Callable[[Any], sa.ColumnElement[bool]]
"""Given the incoming row, the condition under which a conflicting row is updated."""

Returning = Sequence[sa.ColumnElement[Any]]
"""Columns of the written rows a statement returns (none: it returns no rows)."""


def _chain_head(conn: sa.Connection, month: int) -> Head | None:
    """The newest event of ``month``'s chain (``chain_seq``, ``chain_hash``), or ``None``
    while it has none. Bounded by the month's instants too, so that PostgreSQL reads
    the month's partition alone."""
    from controlroom.db.tables import audit_log  # central's schema: see the imports

    first = datetime(month // 100, month % 100, 1, tzinfo=UTC)
    within = [audit_log.c.chain_month == month, audit_log.c.occurred_at_utc >= first]
    if (first.year, first.month) != (9999, 12):  # the last month has no next one
        after = datetime(first.year + first.month // 12, first.month % 12 + 1, 1, tzinfo=UTC)
        within.append(audit_log.c.occurred_at_utc < after)
    head = conn.execute(
        sa.select(audit_log.c.chain_seq, audit_log.c.chain_hash)
        .where(*within)
        .order_by(audit_log.c.chain_seq.desc())
        .limit(1)
    ).one_or_none()
    return None if head is None else (head.chain_seq, head.chain_hash)


def chunked(rows: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    """Consecutive slices of ``rows`` of at most ``size`` items, order kept."""
    for start in range(0, len(rows), size):
        yield rows[start : start + size]


@dataclass(frozen=True, slots=True)
class SearchTerms:
    """Terms a message must all hold: ``words``, each a stored term equal to it, and
    ``prefixes``, each the start of a stored term (docs/design.md "Search"). Each is a
    term as the tokenizer cuts it (``errors.ingest.search_terms``), only ever a bound
    value."""

    words: tuple[str, ...] = ()
    prefixes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class SearchQuery:
    """What a search asks the full-text index (``failed_messages.search_vector``) for:
    messages holding every term of any one of ``alternatives`` (a search for all its
    words has one; ServiceControl's keyword search one per word). An alternative
    without terms is never one; no alternative matches nothing."""

    alternatives: tuple[SearchTerms, ...] = ()

    @property
    def empty(self) -> bool:
        """True when no alternative has a term (the query matches nothing)."""
        return not any(terms.words or terms.prefixes for terms in self.alternatives)


class Provider(ABC):
    """One database's differences. Subclasses are singletons (``PROVIDER``)."""

    name: ClassVar[str]
    """SQLAlchemy's backend name, the registry key."""

    max_rows_per_statement: ClassVar[int] = MAX_ROWS_PER_STATEMENT
    max_bound_parameters: ClassVar[int]
    """Bound parameters one statement may carry."""

    max_ids_per_in_list: ClassVar[int] = 500
    """Keys in one ``IN (...)`` list (a short statement each, far under every limit)."""

    alters_tables_in_batch: ClassVar[bool] = False
    """Alembic must rebuild a table to alter it (``render_as_batch``)."""

    keeps_tally_deltas: ClassVar[bool] = False
    """Its triggers append tally deltas for ``compact_tallies`` to fold (migration 0012),
    rather than counting in the tallies themselves."""

    updates_returning: ClassVar[bool] = True
    """Its ``UPDATE`` takes ``RETURNING`` (SQLite since 3.35, PostgreSQL; not MariaDB
    10.11): ``update_returning`` then runs one statement, else selects, updates and reads
    back."""

    bounds_merged_walks: ClassVar[bool] = True
    """A merge of ordered walks (``errors.read.lists.merged_walks``: a page of several
    statuses) bounds each walk by the page's end in a subquery of its own, which
    PostgreSQL still merges (Merge Append) and never reads past. Else the compound
    ``SELECT`` is ordered as a whole, which SQLite merges lazily (``MERGE (UNION ALL)``)
    and would sort whole once each walk were a subquery."""

    claims_rows_concurrently: ClassVar[bool] = False
    """Several processes may claim rows of one work table at once: ``lock_for_claim``
    skips rows another transaction holds. Else one process claims, under a lease
    (docs/design.md "Notification outbox")."""

    def lock_for_claim(self, query: sa.Select[Any]) -> sa.Select[Any]:
        """``query`` (a ``SELECT`` of one table with a ``LIMIT``) locking the rows it returns
        until the transaction ends and passing over rows another transaction has locked,
        where ``claims_rows_concurrently``; as it is elsewhere, where one claimer runs."""
        return query

    @abstractmethod
    def insert(self, table: sa.Table) -> Any:
        """The provider's own ``INSERT`` construct for ``table``."""

    @abstractmethod
    def upsert(
        self,
        table: sa.Table,
        *,
        key: Sequence[sa.Column[Any]],
        set_: Assignments,
        where: Guard | None = None,
        returning: Returning = (),
    ) -> Any:
        """``INSERT`` into ``table`` that, on a conflict on ``key``, applies ``set_`` —
        only where ``where`` holds, when given — in the same statement. Concurrent
        inserters of one key never fault: the loser's row becomes the update.

        With ``returning``, the statement returns those columns of every row it inserted
        or updated, as they stand after it, and of no other: a conflicting row ``where``
        refused is not returned (callers learn from it which rows they wrote)."""

    @abstractmethod
    def insert_if_absent(
        self, table: sa.Table, *, key: Sequence[sa.Column[Any]], returning: Returning = ()
    ) -> Any:
        """``INSERT`` into ``table`` that leaves rows whose ``key`` exists untouched; with
        ``returning``, it returns those columns of the rows it inserted, never of a row
        it left."""

    def inserted_flag(self, table: sa.Table) -> sa.ColumnElement[bool]:
        """A column for the ``returning`` of an ``upsert`` (or ``upsert_rows``) into
        ``table``: true for a row the statement inserted, false for one it updated. Here
        false for every row: a provider that cannot tell them apart says so, and the caller
        then treats every row as one that may have existed before (correct, only slower)."""
        return sa.false()

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
        """``upsert`` of rows given only at execution (``write_rows``), each a dict of
        exactly ``columns``; ``returning`` as ``upsert`` takes it. Here the ``upsert``
        construct itself, which ``write_rows`` sends as multi-row ``VALUES`` statements
        (one text per number of rows); a provider that can bind each column's values as
        one parameter overrides both, for one statement text whatever the number of rows."""
        return self.upsert(table, key=key, set_=set_, where=where, returning=returning)

    def write_rows(
        self, conn: sa.Connection, statement: Any, rows: Sequence[Row]
    ) -> list[sa.Row[*tuple[Any, ...]]]:
        """Execute ``statement`` (from ``upsert_rows``) for ``rows``, in order, as
        statements of at most ``max_rows_per_statement`` rows each (docs/design.md "The
        conditional upsert": one set-based statement per chunk of at most 50 rows).
        Returns the rows its ``RETURNING`` gave, if any, in statement order."""
        if not rows:
            return []
        result = conn.execute(statement, list(rows), execution_options=self.executemany_options())
        return list(result.all()) if result.returns_rows else []

    @abstractmethod
    def bound_rows(self, table: sa.Table, names: Sequence[str]) -> sa.Subquery:
        """Rows given only at execution (``bound_rows_parameters``) as a ``FROM`` whose
        columns are ``names``, typed as ``table``'s columns of those names. The statement
        that reads it has the same text whatever the number of rows, so the driver and
        the server can prepare it once: the rows travel as a few bound values (one per
        column, or one in all), not as one parameter per value. Values must be text,
        integers or ``None``."""

    @abstractmethod
    def bound_rows_parameters(self, names: Sequence[str], rows: Sequence[Row]) -> dict[str, Any]:
        """The parameters of ``bound_rows(table, names)`` for ``rows`` (dicts holding at
        least ``names``; at least one row)."""

    @abstractmethod
    def is_one_of(
        self, column: sa.ColumnElement[Any], values: Sequence[Any]
    ) -> sa.ColumnElement[bool]:
        """``column`` equals one of ``values``, with ``values`` bound as one parameter
        (a statement of one text for any number of values, with no limit on them)."""

    @abstractmethod
    def list_elements(self, values: sa.ColumnElement[Any]) -> Any:
        """The elements of the stored list ``values`` (a list column, or the incoming
        row's) as a table-valued ``FROM`` with one column, ``value``; each call is a new
        alias, so one statement may read several lists."""

    @abstractmethod
    def list_length(self, values: sa.ColumnElement[Any]) -> sa.ColumnElement[int]:
        """The number of elements of the list ``values``."""

    @abstractmethod
    def aggregate_list(self, values: sa.Select[Any]) -> sa.ColumnElement[Any]:
        """The rows of the one-column ``values`` as a list the provider's list columns
        store, in the select's order."""

    @abstractmethod
    def search_matches(
        self, query: SearchQuery, *, among: sa.Select[Any] | None = None
    ) -> sa.ColumnElement[bool]:
        """True for failed messages whose search terms (``failed_messages.search_vector``)
        match ``query`` (``SearchQuery``), answered from the provider's full-text index;
        each term is only ever a bound parameter, read as a whole (a prefix as the start
        of a term). An empty query matches nothing. ``among``, when given, is a statement on
        ``failed_messages`` (its own ORDER BY and LIMIT: a window of a sort order) that
        yields every row the condition will be tested on: a provider may read only the
        index's hits that can be among them (SQLite); the rows matched are the same."""

    @abstractmethod
    def materialized_cte(self, query: sa.Select[Any], name: str) -> sa.CTE:
        """``query`` as the CTE ``name`` that the planner runs once, on its own, and does
        not merge into the statement reading it (a fence: the statement then cannot walk
        a sort key's index testing each row against ``query``'s condition). The rows are
        the same either way; only the plan differs."""

    @abstractmethod
    def fenced(self, query: sa.Select[Any], name: str) -> sa.Subquery:
        """``query`` (with no ``ORDER BY``) as the subquery ``name`` that the planner plans
        on its own, for every row it returns in no order, and does not merge into the
        statement reading it (a fence, as ``materialized_cte``: the statement cannot walk a
        sort key's index testing each row against ``query``'s condition), but whose rows
        stream into their reader, never held whole in a table of their own: a reader's
        ``ORDER BY ... LIMIT`` keeps the page's end alone. The rows are the same either
        way; only the plan differs."""

    @abstractmethod
    def octet_length(self, text: sa.ColumnElement[Any]) -> sa.ColumnElement[int]:
        """The length of ``text`` in bytes of UTF-8 (``NULL`` for ``NULL``), written as the
        partial indexes of migration 0032 write it in their ``WHERE``: a planner matches
        an index's predicate to a query's condition by the expression."""

    @abstractmethod
    def order_nulls_smallest(
        self, column: sa.ColumnElement[Any], *, descending: bool
    ) -> sa.ColumnElement[Any]:
        """``ORDER BY`` element of the nullable ``column``, descending or ascending, where
        ``NULL`` sorts as the smallest value: first ascending, last descending, as the
        sort keys' indexes are built (migration 0004)."""

    def update_returning(
        self, conn: sa.Connection, statement: sa.Update, returning: Returning
    ) -> list[sa.Row[*tuple[Any, ...]]]:
        """Run ``statement`` (an ``UPDATE`` of one table with a one-column primary key)
        and return ``returning`` (columns of that table) of every row it matched, as they
        stand after it; order unspecified.

        One ``UPDATE ... RETURNING`` where ``updates_returning``; else the matching rows'
        keys are selected and locked (``FOR UPDATE``, where the provider has row locks),
        those rows updated and read back, in ``conn``'s transaction: the same rows and
        values, as no other transaction can change the locked rows in between."""
        if self.updates_returning:
            return list(conn.execute(statement.returning(*returning)).all())
        table = statement.table
        assert isinstance(table, sa.Table)
        (key,) = table.primary_key.columns
        matching = sa.select(key).with_for_update()
        if statement.whereclause is not None:
            matching = matching.where(statement.whereclause)
        keys = list(conn.execute(matching).scalars())
        if not keys:
            return []
        conn.execute(statement.where(self.is_one_of(key, keys)))
        return list(conn.execute(sa.select(*returning).where(self.is_one_of(key, keys))).all())

    def estimate_rows(self, conn: sa.Connection, query: sa.Select[Any]) -> int | None:
        """The database's own estimate of how many rows ``query`` returns, without running
        it; ``None`` when the provider has none (then callers count exactly)."""
        return None

    def count_search_hits(self, conn: sa.Connection, query: SearchQuery, limit: int) -> int | None:
        """How many failed messages ``search_matches(query)`` holds, counted in the
        full-text index alone (no table row read), stopping past ``limit``: at most
        ``limit + 1``. ``None`` where the index cannot count without the rows (here; on
        PostgreSQL the GIN index needs the heap for visibility), then callers count
        through the table."""
        return None

    def estimate_search_hits(
        self,
        conn: sa.Connection,
        query: SearchQuery,
        where: Sequence[sa.ColumnElement[bool]] = (),
    ) -> int | None:
        """An estimate of how many failed messages ``search_matches(query)`` holds, from
        the full-text index alone and without reading every hit; with ``where``
        (conditions on ``failed_messages``), of those also meeting them, from the rows of
        a sample of the hits. ``None`` where the provider has none of its own (here;
        PostgreSQL estimates the whole search statement through ``estimate_rows``)."""
        return None

    def without_index(self, column: sa.ColumnElement[Any]) -> sa.ColumnElement[Any]:
        """``column`` as an operand whose conditions no index answers, so that a query
        ordered by an indexed key walks that key's index and filters the rows it yields,
        instead of reading every match from the condition's index and sorting them.
        Here ``column`` itself: a planner with statistics (PostgreSQL) makes that choice
        from the condition's selectivity."""
        return column

    def never_indexed(self, condition: sa.ColumnElement[bool]) -> sa.ColumnElement[bool]:
        """``condition`` (a comparison of one column) as a condition no index answers on
        any planner, statistics or none, its selectivity still estimated from the
        column's statistics: a page of an endpoint or a queue address filtered by status
        walks the subset's index and tests the status of what it yields, never the
        status's index testing every newer message of that status for the subset (a
        planner taking the two for independent prefers the status's index once the
        subset is a large part of the table). Here a truth test, ``condition IS TRUE``:
        PostgreSQL and SQLite match no index to one (but a boolean column's), and
        PostgreSQL estimates it as the condition itself. Not a unary ``+`` on
        PostgreSQL: it prices the expression at a default selectivity (one row in 200),
        then reads a whole subset holding a few thousand messages, and sorts it, where a
        walk reads a page."""
        return condition.is_(sa.true())

    def compact_tallies(self, conn: sa.Connection) -> bool:
        """Fold ``failed_message_tally_deltas`` into ``failed_message_tallies`` in
        ``conn``'s transaction; ``False`` when another transaction is folding them (this
        one then leaves them). Without ``keeps_tally_deltas`` there is nothing to do."""
        return True

    def prepare_search(self, conn: sa.Connection) -> None:  # noqa: B027 - optional hook
        """Settings for the search statements of ``conn``'s current transaction."""

    @abstractmethod
    def make_lease(self, engine: sa.Engine, name: str, owner: str, seconds: float) -> Lease:
        """The lease ``name`` for ``owner``; ``seconds`` is how long a lease outlives an
        owner that stopped renewing it, where the provider needs to know."""

    @abstractmethod
    def create_engine(self, url: sa.URL, *, pool_size: int) -> sa.Engine:
        """An engine for ``url`` with the provider's connection rules applied."""

    def normalize_url(self, url: sa.URL) -> sa.URL:
        """``url`` with the provider's default driver chosen when none is named."""
        return url

    def url_problem(self, url: sa.URL) -> str | None:
        """What makes ``url`` (normalized) unusable as the store's URL before any
        connection is tried, in words for the operator that never quote it (it may hold a
        password); ``None`` when nothing is found."""
        return None

    @abstractmethod
    def classify_error(self, exc: BaseException) -> ErrorKind | None:
        """The kind of a driver exception of this provider; ``None`` for any other."""

    def error_code(self, exc: BaseException) -> str | None:
        """The code a driver exception of this provider carries (SQLite's error name,
        PostgreSQL's SQLSTATE), which names the failure without quoting data or hosts;
        ``None`` for any other exception or when it has none."""
        return None

    def advice(self, exc: BaseException) -> str | None:
        """What an operator can do about a driver exception of this provider when the
        deployment is at fault (a missing schema, a privilege the user lacks), in words
        that quote no data, host or password; ``None`` for any other exception."""
        return None

    def migration_lock(self, conn: sa.Connection) -> None:  # noqa: B027 - optional hook
        """Serialize migrations of processes starting together, for ``conn``'s
        transaction (nothing to do where the write transaction already serializes)."""

    @abstractmethod
    def limit_statement_time(
        self, conn: sa.Connection, seconds: float
    ) -> AbstractContextManager[None]:
        """Inside the block, a statement of ``conn`` that runs past ``seconds`` from the
        block's start (SQLite) or from its own start (PostgreSQL, ``statement_timeout``)
        is cancelled with the driver's error; the caller decides what the overrun means.
        Use inside a transaction."""

    def insert_audit_events(self, conn: sa.Connection, rows: Sequence[Row]) -> None:
        """Insert ``audit_log`` rows whose ``event_id`` is absent, each linked into its
        month's hash chain (``db.audit_chain``); an existing event is left as it is
        (the first write wins). Rows sorted by ``event_id``; they get their chain places
        in that order, under the chains' lock (``lock_audit_chains``) until the commit."""
        from controlroom.db.tables import audit_log  # central's schema: see the imports

        fresh = self.claim_audit_events(conn, rows)
        if not fresh:
            return
        months = sorted({chain_month(row["occurred_at_utc"]) for row in fresh})
        self.lock_audit_chains(conn, months)
        heads = {month: head for month in months if (head := _chain_head(conn, month))}
        conn.execute(
            sa.insert(audit_log),
            link_events(fresh, heads),
            execution_options=self.executemany_options(),
        )

    def claim_audit_events(self, conn: sa.Connection, rows: Sequence[Row]) -> list[Row]:
        """Of ``rows``, the first of each ``event_id`` that no stored event has, in order:
        the events this transaction is to insert. Here read under the write transaction,
        which no other writer shares (SQLite's ``BEGIN IMMEDIATE``); a provider with
        concurrent writers claims each id so that a second writer of it waits and then
        claims nothing."""
        from controlroom.db.tables import audit_log  # central's schema: see the imports

        ids = sorted({row["event_id"] for row in rows})
        stored: set[str] = set()
        for part in chunked(ids, self.max_ids_per_in_list):
            stored.update(
                conn.execute(
                    sa.select(audit_log.c.event_id).where(audit_log.c.event_id.in_(part))
                ).scalars()
            )
        fresh = []
        for row in rows:
            if row["event_id"] not in stored:
                stored.add(row["event_id"])
                fresh.append(row)
        return fresh

    def lock_audit_chains(  # noqa: B027 - optional hook
        self, conn: sa.Connection, months: Sequence[int]
    ) -> None:
        """Hold the hash chains of ``months`` (sorted) for ``conn``'s transaction, so that
        no other writer appends to them between reading their heads and the commit.
        Nothing to do where write transactions are serialized (SQLite)."""

    def prepare_audit_log(self, engine: sa.Engine) -> None:  # noqa: B027 - optional hook
        """Storage the audit log needs ahead of the database's clock (optional;
        PostgreSQL: monthly partitions). Failures are the caller's to log; ingest works
        without it."""

    @abstractmethod
    def purge_audit_log(
        self, engine: sa.Engine, retention_days: int, *, chunk: int = AUDIT_PURGE_CHUNK
    ) -> tuple[int, datetime]:
        """Delete the audit events of every month that ended before ``now - max(
        retention_days, floor)`` — now by the database's clock, the floor from
        ``audit_log_policy`` — whole months only, so that every chain is whole or gone;
        at most ``chunk`` rows per transaction where rows are deleted one by one.
        Returns how many events, and the first instant kept (aware UTC)."""

    def grant_service_role(self, conn: sa.Connection, service: sa.URL) -> str | None:
        """As the schema's owner, make ``service``'s user a role that may only insert and
        read the audit log (and run the audit functions), with the grants the rest of
        the service needs; idempotent. Returns the group role granted, ``None`` where
        the provider has no roles (SQLite)."""
        return None

    def audit_log_exposure(self, conn: sa.Connection) -> str | None:
        """Why ``conn``'s user could rewrite the audit log despite its triggers (it owns
        the table, is a superuser, or was granted DELETE, UPDATE or TRUNCATE), ``None``
        when it cannot or the provider has no users (SQLite: the hash chain is the
        guarantee)."""
        return None

    def vacuum_warnings(self, conn: sa.Connection) -> list[str]:
        """Sentences saying what the store's vacuum settings cost (the counter tables
        fill with dead rows, the pages that read them slow down), one per setting that
        costs it; empty when they cost nothing or the provider has no vacuum to configure
        (SQLite reuses freed pages itself). ``serve`` logs them at start and
        ``/api/health`` lists them in ``warnings`` (docs/decisions.md "The counter
        tables are vacuumed as they turn over")."""
        return []

    def server_settings_warnings(self, conn: sa.Connection) -> list[str]:
        """Sentences saying what the store server's memory and WAL settings cost the
        write path as the store grows (index pages read and written outside the buffer
        cache, pages logged whole after every checkpoint), one per problem; empty when
        they cost nothing or the provider has no such settings (SQLite). ``serve`` logs
        them at start (docs/decisions.md "The write path's cost does not grow with the
        store")."""
        return []

    def lock_retry_selection(  # noqa: B027 - optional hook
        self, conn: sa.Connection, key: str
    ) -> None:
        """Hold, until ``conn``'s transaction ends, a lock named ``key`` (a retry's
        selection) that a concurrent request of the same selection waits for, so that it
        then sees this transaction's operation. Nothing where writers are serialized
        (SQLite)."""

    def lock_group_appearances(  # noqa: B027 - optional hook
        self, conn: sa.Connection, group_ids: Sequence[str]
    ) -> None:
        """Hold, until ``conn``'s transaction ends, a lock per group id (taken in sorted
        order) that a concurrent writer announcing the same group waits for, so that it
        then sees this transaction's group rows (``FailureGroupAppeared`` once,
        docs/design.md "Notification rules"). Nothing where writers are serialized
        (SQLite)."""

    @abstractmethod
    def store_identity(self, conn: sa.Connection) -> str:
        """One text for the store ``conn`` is on, however its URL spells it (host
        names, the default port, options, paths to one file), and another for another
        store (a schema of its own), without credentials: serves that share it
        must consume one broker (``runtime.serve_lock``, docs/design.md "Process
        shape")."""

    @abstractmethod
    def cancel_statement(self, dbapi_connection: Any) -> None:
        """End the statement ``dbapi_connection`` (a driver connection) runs now, from
        another thread; nothing when it runs none. The statement raises in its own thread
        (a transient error on PostgreSQL, query_canceled). Called when an intake's stop
        grace ends (``db.engine.RunningStatements``). Raises the driver's error when the
        cancel request cannot be sent."""

    def local_backend_pid(self, dbapi_connection: Any) -> int | None:
        """The id of the server process on this machine that serves ``dbapi_connection``
        (a driver connection), or ``None`` when the work runs in the caller's own process
        (SQLite) or the server is elsewhere. Intake workers lower its CPU priority with
        their own (docs/design.md "Process shape")."""
        return None

    def compact_counts(self, conn: sa.Connection, table: sa.Table) -> None:  # noqa: B027
        """Fold the signed counts of ``table`` (key columns and ``n``, kept by the
        database's triggers: migration 0028) to one row per key in ``conn``'s transaction;
        no key's sum changes. Nothing to do where the triggers keep one row per key
        (without ``keeps_tally_deltas``)."""

    def compact_group_counts(self, conn: sa.Connection) -> None:  # noqa: B027 - optional
        """Fold ``failed_message_group_counts`` to one row per key, dropping keys whose
        sum is 0; no sum changes (migration 0014). Nothing to do where the triggers keep
        one row per key (SQLite)."""

    def insert_rows_if_absent(
        self, conn: sa.Connection, table: sa.Table, rows: Sequence[Row]
    ) -> None:
        """Insert ``rows`` into ``table``, leaving rows whose primary key exists untouched;
        multi-row statements of at most ``max_rows_per_statement`` rows."""
        if not rows:
            return
        key = list(table.primary_key.columns)
        conn.execute(
            self.insert_if_absent(table, key=key),
            list(rows),
            execution_options=self.executemany_options(),
        )

    def executemany_options(self) -> dict[str, Any]:
        """Execution options that send a row list as multi-row statements of at most
        ``max_rows_per_statement`` rows ("insertmanyvalues")."""
        return {"insertmanyvalues_page_size": self.max_rows_per_statement}


class OnConflictProvider(Provider):
    """A provider whose ``insert()`` has ``on_conflict_do_update``/``do_nothing``
    (``INSERT ... ON CONFLICT``: SQLite and PostgreSQL)."""

    def upsert(
        self,
        table: sa.Table,
        *,
        key: Sequence[sa.Column[Any]],
        set_: Assignments,
        where: Guard | None = None,
        returning: Returning = (),
    ) -> Any:
        statement = on_conflict_update(self.insert(table), key=key, set_=set_, where=where)
        # ON CONFLICT ... DO UPDATE ... WHERE returns no row for a conflict WHERE refused.
        return statement.returning(*returning) if returning else statement

    def insert_if_absent(
        self, table: sa.Table, *, key: Sequence[sa.Column[Any]], returning: Returning = ()
    ) -> Any:
        # ON CONFLICT DO NOTHING returns no row for a row it left.
        statement = self.insert(table).on_conflict_do_nothing(index_elements=list(key))
        return statement.returning(*returning) if returning else statement


def on_conflict_update(
    statement: Any,
    *,
    key: Sequence[sa.Column[Any]],
    set_: Assignments,
    where: Guard | None = None,
) -> Any:
    """``statement`` (an ``INSERT`` of a provider whose ``insert()`` has
    ``on_conflict_do_update``) with ``ON CONFLICT (key) DO UPDATE SET set_ WHERE where``;
    ``set_`` and ``where`` get the incoming row (``excluded``)."""
    incoming = statement.excluded
    return statement.on_conflict_do_update(
        index_elements=list(key),
        set_=dict(set_(incoming)),
        where=where(incoming) if where is not None else None,
    )
