"""A search's transaction on PostgreSQL (``PostgreSQLProvider.prepare_search``) turns
sequential scans off, which prices every plan in it at 10^10 and over: past
``jit_above_cost``, PostgreSQL JIT-compiled even the tallies' sum of a thousand rows (60-130
ms of a 150 ms broad search at 1,000,000 messages, ``benchmarks/README.md``). The search's
transaction turns JIT off too."""

from __future__ import annotations

import json

import pytest
import sqlalchemy as sa

from controlroom.db.providers import provider_for
from controlroom.errors import tallies


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_a_search_transaction_compiles_nothing(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        provider_for(conn).prepare_search(conn)
        rows = tallies.tally_rows().subquery("tallied")
        query = sa.select(sa.func.coalesce(sa.func.sum(rows.c.messages), 0))
        compiled = query.compile(dialect=conn.dialect, compile_kwargs={"literal_binds": True})
        plan = conn.exec_driver_sql(f"EXPLAIN (ANALYZE, FORMAT JSON) {compiled}").scalar_one()
    plan = json.loads(plan) if isinstance(plan, str) else plan
    assert plan[0]["Plan"]["Total Cost"] > 10_000_000_000  # the case this test is about
    assert "JIT" not in plan[0]
