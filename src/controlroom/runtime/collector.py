"""Python's cyclic garbage collector in an intake worker.

Source: docs/decisions.md "An intake worker collects garbage less often". A drain
allocates thousands of objects per batch (headers, attempts, search terms, statement
parameters) that live until the batch commits: at Python's default first threshold (700
allocations) they are traversed by several young collections each, and survive into the
older generations with the modules, the engine and the transport, which a full collection
traverses again. Measured on a drain of 30,000 messages: 7.8 % of the worker's CPU in the
collector with the defaults, 1.2 % with these settings (benchmarks/README.md).
"""

from __future__ import annotations

import gc

INTAKE_THRESHOLDS = (10_000, 10, 10)
"""``gc.set_threshold`` of an intake worker: a young collection every 10,000 allocations
(net of deallocations) instead of 700; the older generations' multipliers as Python's."""


def collect_as_intake() -> None:
    """Freeze what is alive now (call once the worker has started: its modules, store
    engine and transport are never garbage) and raise the first threshold to
    ``INTAKE_THRESHOLDS``'. Reference counting frees what a batch leaves as before; only
    cycles wait longer, and a batch's deliveries break theirs when settled."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*INTAKE_THRESHOLDS)
