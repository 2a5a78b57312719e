"""``db.engine.RunningStatements``: what an intake's stop cancels when its grace ends
(docs/decisions.md "A stop finishes the batches in hand") is the statements of the
connections the intake holds, and only those: another caller's statement on the same
engine (serve's reads, with intake in serve itself) runs on. Every provider, through the
provider seam (``Provider.cancel_statement``)."""

from __future__ import annotations

import asyncio
import threading

import sqlalchemy as sa

from controlroom.db.engine import RunningStatements
from controlroom.db.errors import classify_store_error
from controlroom.exceptions import ErrorKind

TIMEOUT = 60  # seconds


def _endless(engine: sa.Engine) -> str:
    """A statement that runs until cancelled (or ``TIMEOUT`` on PostgreSQL)."""
    if engine.dialect.name == "sqlite":
        return (
            "WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n) "
            "SELECT count(*) FROM n"
        )
    return f"SELECT pg_sleep({TIMEOUT})"


def _long(engine: sa.Engine) -> str:
    """A statement that runs a few seconds, then answers 1."""
    if engine.dialect.name == "sqlite":
        return (
            "WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n WHERE x < 5000000) "
            "SELECT count(*) > 0 FROM n"
        )
    return "SELECT 1 FROM pg_sleep(3)"


def _cancel_until_done(running: RunningStatements, thread: threading.Thread) -> int:
    """Cancel ``running``'s statements until ``thread`` ends (a cancel sent before its
    statement began ends nothing); returns how many were cancelled in all."""
    cancelled = 0
    for _ in range(int(TIMEOUT / 0.05)):
        if not thread.is_alive():
            return cancelled
        cancelled += running.cancel_at_grace_end()
        thread.join(0.05)
    raise AssertionError("the statement was not cancelled")


def test_the_statements_of_a_tracked_context_are_cancelled_and_no_others(
    engine: sa.Engine,
) -> None:
    running = RunningStatements("the test")
    outcome: dict[str, object] = {}

    def tracked_statement() -> None:
        with running.tracked(), engine.connect() as conn:
            try:
                conn.exec_driver_sql(_endless(engine)).all()
            except sa.exc.DBAPIError as exc:
                outcome["tracked"] = exc

    def other_statement() -> None:  # outside: never tracked
        with engine.connect() as conn:
            other_connected.set()
            outcome["other"] = conn.exec_driver_sql(_long(engine)).scalar_one()

    other_connected = threading.Event()
    other = threading.Thread(target=other_statement)
    other.start()
    assert other_connected.wait(TIMEOUT)
    tracked = threading.Thread(target=tracked_statement)
    tracked.start()
    assert _cancel_until_done(running, tracked) >= 1
    other.join(TIMEOUT)
    assert isinstance(outcome["tracked"], sa.exc.DBAPIError)
    assert outcome["other"] == 1  # ran on while the tracked one was cancelled
    # Nothing held once its connection went back to the pool.
    assert running.cancel_at_grace_end() == 0


def test_a_tracked_context_reaches_the_threads_an_intake_starts(engine: sa.Engine) -> None:
    """An intake's run sets the context; its writes run in ``asyncio.to_thread``."""
    running = RunningStatements("the test")
    failed: list[BaseException] = []

    def statement() -> None:
        with engine.connect() as conn:
            try:
                conn.exec_driver_sql(_endless(engine)).all()
            except sa.exc.DBAPIError as exc:
                failed.append(exc)

    async def intake() -> None:
        with running.tracked():
            await asyncio.to_thread(statement)

    thread = threading.Thread(target=asyncio.run, args=(intake(),))
    thread.start()
    assert _cancel_until_done(running, thread) >= 1
    (exc,) = failed
    # The batch goes back whole: the error is never the input's (ErrorKind.DATA would
    # keep its messages as failed imports).
    assert classify_store_error(exc) is not ErrorKind.DATA
