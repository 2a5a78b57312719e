"""Property: any permutation of a real lifecycle's packets, with duplicates, across
epochs and split into any batches, gives the row that applying them in order gives
(docs/decisions.md "The site-call upsert inserts first"), on every provider; packets may
be 100 ns apart."""

from __future__ import annotations

import uuid
from typing import Any

import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controlroom.sitecalls.writer import SiteCallWriter
from controlroom.telemetry.stamps import Stamp
from tests.sitecalls.packets import T0, packet, stored, write

COMPARED = (
    "status",
    "epoch",
    "retry_count",
    "last_error",
    "http_status",
    "updated_at_utc",
    "updated_at_tick",
    "terminal_at_utc",
    "terminal_at_tick",
)


@st.composite
def lifecycles(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Packets of one call in the order the site produced them: per epoch Submitted,
    Forwarded, some Attempted/Skipped retries, then Parked (an operator retry starts the
    next epoch) or, in the last epoch, an end state."""
    epochs = draw(st.integers(1, 3))
    at = Stamp.of(T0)
    packets = []
    for epoch in range(epochs):
        steps = ["Submitted", "Forwarded"]
        steps += draw(st.lists(st.sampled_from(["Attempted", "Skipped"]), max_size=3))
        if epoch < epochs - 1:
            steps.append("Parked")
        else:
            steps += draw(
                st.sampled_from(
                    [[], ["Delivered"], ["Failed"], ["Parked"], ["Parked", "Discarded"]]
                )
            )
        for retry, status in enumerate(steps):
            # Seconds apart, or 100 ns (a .NET site within one microsecond).
            step = draw(st.one_of(st.integers(1, 9), st.integers(1, 90).map(lambda n: n * 10**7)))
            at = Stamp.from_ticks(at.ticks + step)
            packets.append(
                packet(
                    status,
                    at=at,
                    epoch=epoch,
                    retry_count=retry,
                    last_error=f"error {epoch}.{retry}",
                    http_status=draw(st.sampled_from([None, 429, 503])),
                )
            )
    return packets


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data(), lifecycle=lifecycles())
def test_any_arrival_order_gives_the_in_order_row(
    engine: sa.Engine, data: st.DataObject, lifecycle: list[dict[str, Any]]
) -> None:
    writer = SiteCallWriter(engine)
    in_order_id, shuffled_id = str(uuid.uuid4()), str(uuid.uuid4())
    for item in lifecycle:
        write(writer, {**item, "tracked_operation_id": in_order_id})

    duplicates = data.draw(st.lists(st.sampled_from(lifecycle), max_size=len(lifecycle)))
    arrival = data.draw(st.permutations(lifecycle + duplicates))
    cuts = sorted(data.draw(st.sets(st.integers(1, max(1, len(arrival) - 1)), max_size=4)))
    start = 0
    for cut in [*cuts, len(arrival)]:
        batch = [{**item, "tracked_operation_id": shuffled_id} for item in arrival[start:cut]]
        if batch:
            assert write(writer, *batch) == [None] * len(batch)
        start = cut

    expected, actual = stored(engine, in_order_id), stored(engine, shuffled_id)
    assert {c: getattr(actual, c) for c in COMPARED} == {c: getattr(expected, c) for c in COMPARED}
