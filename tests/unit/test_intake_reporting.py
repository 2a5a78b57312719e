"""``events.reporting_intake``: the report round both intakes run (docs/design.md "Event
log"): reports until the block ends, a report that raises is logged and the next round
still comes."""

from __future__ import annotations

import asyncio
import logging

import pytest

from controlroom.events import reporting_intake


def test_a_failing_report_is_logged_and_the_rounds_go_on_until_the_block_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    rounds: list[int] = []

    async def scenario() -> None:
        third = asyncio.Event()

        async def report() -> None:
            rounds.append(len(rounds) + 1)
            if len(rounds) == 1:
                raise OSError("disk full")
            if len(rounds) == 3:
                third.set()

        async with reporting_intake(0, report, intake="unit intake"):
            async with asyncio.timeout(30):  # a hang guard, not a measurement
                await third.wait()
        done = len(rounds)
        for _ in range(5):
            await asyncio.sleep(0)
        assert len(rounds) == done, "a report ran after the block ended"

    with caplog.at_level(logging.WARNING, logger="controlroom.events"):
        asyncio.run(scenario())
    assert rounds[:3] == [1, 2, 3]
    (record,) = [r for r in caplog.records if "could not report" in r.getMessage()]
    assert record.getMessage() == "could not report on the unit intake"

