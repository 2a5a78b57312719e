"""The provider hooks that carry what feature code may not say itself (a fence, the
place of NULL in a sort, RETURNING from an UPDATE, RETURNING of an upsert's written rows
only), live on every provider; ``update_returning`` also by its fallback path, the one a
provider without ``UPDATE ... RETURNING`` (MariaDB 10.11) takes. ARCHITECTURE.md "The
provider seam"."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from controlroom.db.engine import begin_write, create_store_engine
from controlroom.db.providers import Provider, provider_for

metadata = sa.MetaData()
items = sa.Table(
    "hook_items",
    metadata,
    sa.Column("id", sa.String(20), primary_key=True),
    sa.Column("rank", sa.Integer, nullable=True),
    sa.Column("state", sa.String(20), nullable=False),
    sa.Column("version", sa.Integer, nullable=False),
)
c = items.c

STORED: list[dict[str, Any]] = [
    {"id": "a", "rank": 2, "state": "open", "version": 1},
    {"id": "b", "rank": None, "state": "open", "version": 1},
    {"id": "c", "rank": 1, "state": "open", "version": 5},
    {"id": "d", "rank": None, "state": "done", "version": 1},
    {"id": "e", "rank": 3, "state": "done", "version": 1},
]


@pytest.fixture
def store(database_url: str) -> Iterator[sa.Engine]:
    """An engine on each provider with ``hook_items`` holding ``STORED``."""
    engine = create_store_engine(database_url)
    metadata.create_all(engine)
    with begin_write(engine) as conn:
        conn.execute(sa.insert(items), STORED)
    try:
        yield engine
    finally:
        engine.dispose()


def rows(engine: sa.Engine) -> list[tuple[Any, ...]]:
    with engine.connect() as conn:
        return [tuple(row) for row in conn.execute(sa.select(items).order_by(c.id))]


@pytest.mark.parametrize("descending", [False, True])
def test_nulls_sort_as_the_smallest_value(store: sa.Engine, descending: bool) -> None:
    provider = provider_for(store)
    order = [provider.order_nulls_smallest(c.rank, descending=descending), c.id]
    with store.connect() as conn:
        found = list(conn.scalars(sa.select(c.id).order_by(*order)))

    ascending = ["b", "d", "c", "a", "e"]
    assert found == (["e", "a", "c", "b", "d"] if descending else ascending)


def test_a_materialized_cte_holds_the_rows_of_its_query(store: sa.Engine) -> None:
    provider = provider_for(store)
    fenced = provider.materialized_cte(sa.select(c.id, c.rank).where(c.state == "open"), "open")
    with store.connect() as conn:
        found = set(conn.scalars(sa.select(fenced.c.id).where(fenced.c.rank.is_not(None))))

    assert found == {"a", "c"}


def test_a_fenced_subquery_holds_the_rows_of_its_query_and_takes_a_page_of_them(
    store: sa.Engine,
) -> None:
    provider = provider_for(store)
    fenced = provider.fenced(sa.select(c.id, c.rank).where(c.state == "open"), "open")
    order = [provider.order_nulls_smallest(fenced.c.rank, descending=True), fenced.c.id]
    with store.connect() as conn:
        found = set(conn.scalars(sa.select(fenced.c.id)))
        page = list(conn.scalars(sa.select(fenced.c.id).order_by(*order).limit(2).offset(1)))

    assert found == {"a", "b", "c"}
    assert page == ["c", "b"]


def upsert_versions(provider: Provider) -> Any:
    """Insert, or on a conflict take the incoming row only when its version is newer."""
    return provider.upsert(
        items,
        key=[c.id],
        set_=lambda incoming: {"state": incoming.state, "version": incoming.version},
        where=lambda incoming: incoming.version > c.version,
        returning=[c.id, c.version],
    )


def test_an_upsert_returns_the_rows_it_wrote_and_none_its_guard_refused(
    store: sa.Engine,
) -> None:
    provider = provider_for(store)
    incoming = [
        {"id": "a", "rank": 0, "state": "moved", "version": 2},  # newer: updated
        {"id": "c", "rank": 0, "state": "moved", "version": 4},  # older: refused
        {"id": "f", "rank": 0, "state": "new", "version": 1},  # absent: inserted
    ]
    with begin_write(store) as conn:
        written = conn.execute(upsert_versions(provider).values(incoming)).all()

    assert sorted(tuple(row) for row in written) == [("a", 2), ("f", 1)]
    assert [row[:4] for row in rows(store) if row[0] in {"a", "c", "f"}] == [
        ("a", 2, "moved", 2),
        ("c", 1, "open", 5),
        ("f", 0, "new", 1),
    ]


def test_an_insert_if_absent_returns_only_the_rows_it_inserted(store: sa.Engine) -> None:
    provider = provider_for(store)
    statement = provider.insert_if_absent(items, key=[c.id], returning=[c.id])
    incoming = [
        {"id": "a", "rank": 0, "state": "new", "version": 9},
        {"id": "g", "rank": 0, "state": "new", "version": 9},
    ]
    with begin_write(store) as conn:
        inserted = list(conn.execute(statement.values(incoming)).scalars())

    assert inserted == ["g"]
    assert rows(store)[0] == ("a", 2, "open", 1)


@pytest.mark.parametrize("native", [True, False], ids=["update-returning", "fallback"])
def test_update_returning_returns_every_matched_row_as_it_stands_after(
    store: sa.Engine, monkeypatch: pytest.MonkeyPatch, native: bool
) -> None:
    provider = provider_for(store)
    monkeypatch.setattr(type(provider), "updates_returning", native)
    statement = (
        sa.update(items).where(c.state == "open", c.rank.is_not(None)).values(version=c.version + 1)
    )
    with begin_write(store) as conn:
        returned = provider.update_returning(conn, statement, [c.id, c.version])
        nothing = provider.update_returning(
            conn, sa.update(items).where(c.id == "zzz").values(version=0), [c.id]
        )

    assert sorted(tuple(row) for row in returned) == [("a", 2), ("c", 6)]
    assert nothing == []
    assert [row[3] for row in rows(store)] == [2, 1, 6, 1, 1]


def test_a_statement_time_limit_past_the_servers_largest_is_no_limit_refused(
    database_url: str,
) -> None:
    """Breaker pass (third): a telemetry budget of 3,000,000 s (the settings take up to a
    century) asked PostgreSQL for a ``statement_timeout`` past its largest (2^31 - 1 ms),
    so every packet became rejected telemetry."""
    engine = create_store_engine(database_url)
    try:
        with begin_write(engine) as conn:
            provider = provider_for(conn)
            with provider.limit_statement_time(conn, 3_153_600_000):
                assert conn.exec_driver_sql("SELECT 1").scalar_one() == 1
    finally:
        engine.dispose()
