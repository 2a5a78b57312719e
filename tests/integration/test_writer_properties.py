"""Property: any split of a set of attempts into batches, applied in any order, with any
batch replayed at any later point (at-least-once redelivery), gives exactly the rows of
one fold of them all: the true number of distinct attempts, the newest payload, its
groups (docs/design.md "The conditional upsert"; a message here has at most 25 attempts, within
the bound of counted times the row keeps).
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controlroom.db.engine import begin_write
from controlroom.db.tables import failed_message_groups, failed_messages
from controlroom.errors.ingest.writer import FailedMessageBatchWriter, IngestionBatch
from tests.factories import at, attempt

attempt_keys = st.sets(st.tuples(st.integers(0, 4), st.integers(0, 40)), min_size=1, max_size=25)


@st.composite
def split_plans(
    draw: st.DrawFn,
) -> tuple[list[tuple[int, int]], list[list[tuple[int, int]]]]:
    """The attempts, and the batches written in turn: a split of them in some order, with
    replays of earlier batches put in anywhere after the batch they repeat."""
    keys = draw(attempt_keys)
    ordered = draw(st.permutations(sorted(keys)))
    cuts = sorted(draw(st.sets(st.integers(1, max(1, len(ordered) - 1)), max_size=6)))
    batches = [ordered[a:b] for a, b in zip([0, *cuts], [*cuts, len(ordered)], strict=True)]
    batches = [batch for batch in batches if batch]
    written: list[list[tuple[int, int]]] = []
    for index, batch in enumerate(batches):
        written.append(batch)
        for _ in range(draw(st.integers(0, 2))):
            written.append(batches[draw(st.integers(0, index))])
    return sorted(keys), written


def snapshot(engine: sa.Engine) -> tuple[list[dict[str, Any]], list[tuple[str, str]]]:
    with engine.connect() as conn:
        rows = [
            dict(r._mapping)
            for r in conn.execute(sa.select(failed_messages).order_by(failed_messages.c.id))
        ]
        groups = [
            tuple(r)
            for r in conn.execute(
                sa.select(
                    failed_message_groups.c.failed_message_id, failed_message_groups.c.title
                ).order_by(failed_message_groups.c.failed_message_id)
            )
        ]
    return rows, groups


def clear(engine: sa.Engine) -> None:
    with begin_write(engine) as conn:
        conn.execute(sa.delete(failed_message_groups))
        conn.execute(sa.delete(failed_messages))


def batch_of(keys: list[tuple[int, int]]) -> IngestionBatch:
    return IngestionBatch(attempts=[attempt(n, at(s)) for n, s in keys])


@settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(plan=split_plans())
def test_any_split_in_any_order_with_any_replay_equals_one_fold(
    engine: sa.Engine, plan: Any
) -> None:
    keys, batches = plan
    writer = FailedMessageBatchWriter(engine, clock=lambda: at(10_000))

    clear(engine)
    writer.write(batch_of(keys))
    expected = snapshot(engine)

    clear(engine)
    for batch in batches:
        writer.write(batch_of(batch))

    assert snapshot(engine) == expected
    counts = {n: len({s for m, s in keys if m == n}) for n, _ in keys}
    assert sorted(r["number_of_processing_attempts"] for r in expected[0]) == sorted(
        counts.values()
    )
