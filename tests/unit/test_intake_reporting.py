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


def test_the_round_reports_at_once_and_once_more_when_the_block_ends() -> None:
    """Fresh user's pass (session 31): the backlog's depth came only 10 s after the start,
    and what was stored since the last round before a stop was never said."""
    moments: list[str] = []

    async def scenario() -> None:
        state = "start"

        async def report() -> None:
            moments.append(state)

        async with reporting_intake(3600, report, intake="unit intake"):
            for _ in range(5):
                await asyncio.sleep(0)
            state = "end"
        assert moments == ["start", "end"]

    asyncio.run(scenario())


def test_the_last_report_of_a_cancelled_block_is_still_made() -> None:
    """An intake's stop cancels its run: the report at the end comes all the same."""
    made: list[str] = []

    async def report() -> None:
        made.append("report")

    async def run() -> None:
        async with reporting_intake(3600, report, intake="unit intake"):
            await asyncio.Event().wait()

    async def scenario() -> None:
        task = asyncio.create_task(run())
        for _ in range(5):
            await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(scenario())
    assert made == ["report", "report"]
