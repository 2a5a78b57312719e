"""docs/decisions.md "An intake worker collects garbage less often": in a process of its
own (a worker's, spawned as serve spawns them), the collector's first threshold is
``INTAKE_THRESHOLDS``' and what was alive at the worker's start is frozen out of every
collection."""

from __future__ import annotations

import gc
import multiprocessing

from controlroom.runtime.collector import INTAKE_THRESHOLDS, collect_as_intake


def _tuned() -> tuple[tuple[int, int, int], int]:
    collect_as_intake()
    return gc.get_threshold(), gc.get_freeze_count()


def test_an_intake_worker_collects_garbage_at_its_own_threshold() -> None:
    context = multiprocessing.get_context("spawn")
    with context.Pool(1) as pool:
        thresholds, frozen = pool.apply(_tuned)
    assert thresholds == INTAKE_THRESHOLDS
    assert thresholds[0] > gc.get_threshold()[0]  # less often than Python's default
    assert frozen > 10_000  # the modules, the engine, the transport: never traversed again
