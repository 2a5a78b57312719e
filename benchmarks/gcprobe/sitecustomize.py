"""How much CPU Python's garbage collector takes in each process of a run.

Put this directory first on ``PYTHONPATH`` and set ``GCPROBE_DIR``: every Python process
started so (serve, its spawned intake workers, the benchmark itself) times each
collection by its thread's CPU clock (``gc.callbacks``) and, when it exits having used
more than 2 s of CPU, writes ``GCPROBE_DIR/<pid>`` with its command, its CPU and the
collections' (all and full ones). The callbacks cost every process a little, alike in
the runs compared. benchmarks/README.md "The garbage collector in the intake worker".
"""

from __future__ import annotations

import atexit
import gc
import os
import sys
import time
from pathlib import Path
from typing import Any

_DIR = os.environ.get("GCPROBE_DIR")
_began = [0.0]
_spent = {"all": 0.0, "full": 0.0, "collections": 0, "full collections": 0}


def _timed(phase: str, info: dict[str, Any]) -> None:
    if phase == "start":
        _began[0] = time.thread_time()
        return
    seconds = time.thread_time() - _began[0]
    _spent["all"] += seconds
    _spent["collections"] += 1
    if info.get("generation") == 2:
        _spent["full"] += seconds
        _spent["full collections"] += 1


def _write() -> None:
    cpu = time.process_time()
    if _DIR and cpu > 2:
        Path(_DIR, str(os.getpid())).write_text(
            f"{' '.join(sys.argv[:3])}\n"
            f"cpu {cpu:.2f} s, collector {_spent['all']:.2f} s in {_spent['collections']} "
            f"collections ({_spent['all'] / cpu:.1%}), full {_spent['full']:.2f} s in "
            f"{_spent['full collections']}\n"
        )


if _DIR:
    gc.callbacks.append(_timed)
    atexit.register(_write)
