"""A periodic task shut down mid-run keeps its database lease until its work has ended.

docs/design.md "Background singletons": a lease makes exactly one process run each. The work of a
periodic task runs in a worker thread, which cancellation cannot stop: a loop that released the
lease as soon as it was cancelled (the site-call sampler and purge did) let a second process take
the lease and start the same work while the first one's thread still ran it. Here a task group
running ``runtime.periodic`` against the provider's real lease (a lease row on SQLite, an advisory
lock on PostgreSQL) is shut down while the work runs: a contender cannot take the lease until the
work ends, and takes it at once after.
"""

from __future__ import annotations

import asyncio
import threading

import sqlalchemy as sa

from controlroom.db.providers import provider_for
from controlroom.runtime.periodic import PeriodicTask

TIMEOUT = 30.0
LEASE = "periodic-lease-test"


class _ShutDown(Exception):
    """Raised inside the task group to shut it down, as a failing part of serve would."""


def test_a_shut_down_task_keeps_its_lease_until_its_work_ends(engine: sa.Engine) -> None:
    provider = provider_for(engine)
    mine = provider.make_lease(engine, LEASE, "first process", 60)
    contender = provider.make_lease(engine, LEASE, "second process", 60)
    started, finish = threading.Event(), threading.Event()
    taken: dict[str, bool] = {}

    def work() -> None:
        started.set()
        finish.wait(TIMEOUT)

    async def shut_down_mid_run() -> None:
        await asyncio.to_thread(started.wait, TIMEOUT)
        raise _ShutDown  # the group cancels the periodic task while its work runs

    async def main() -> None:
        periodic = PeriodicTask("leased work", work, interval=60, lease=mine)
        second_process = asyncio.create_task(contend_then_finish())  # outside the group
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(periodic.run())
                group.create_task(shut_down_mid_run())
        except* _ShutDown:
            pass
        await second_process
        taken["after the work ended"] = await asyncio.to_thread(contender.hold)

    async def contend_then_finish() -> None:
        await asyncio.to_thread(started.wait, TIMEOUT)
        await asyncio.sleep(0.3)  # the unshielded loops had released the lease by now
        taken["while the work ran"] = await asyncio.to_thread(contender.hold)
        finish.set()

    try:
        asyncio.run(main())
    finally:
        finish.set()
        contender.release()
        mine.release()
    assert taken == {"while the work ran": False, "after the work ended": True}
