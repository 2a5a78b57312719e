"""Where the PostgreSQL server's CPU goes during a drain, by function: Linux ``perf``
sampling every process on the machine by its CPU clock, one sample per millisecond of
CPU, read back for the processes named ``postgres`` (backends, checkpointer, WAL writer,
autovacuum). ``serve.py --server-profile DIR`` takes one per drain and compares the
drains into a stored and an empty store per message (benchmarks/README.md "Where
PostgreSQL's CPU goes").

Debian's ``postgres`` is stripped: functions it exports are named, its static functions
are not (they are counted together as "postgres (unnamed)"). Needs ``perf`` (Debian's
``linux-perf``) and the right to sample every process (root, or
``kernel.perf_event_paranoid`` <= 0).
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

SAMPLE_NS = 1_000_000
"""CPU-clock nanoseconds per sample: a sample is one millisecond of CPU."""

UNNAMED = "postgres (unnamed)"


def perf_command() -> str:
    """The path of ``perf``; ``SystemExit`` naming the package when it is missing."""
    found = shutil.which("perf")
    if found is None:
        raise SystemExit("--server-profile needs perf: apt-get install linux-perf")
    return found


@contextlib.contextmanager
def recording(path: Path) -> Iterator[None]:
    """Every process's CPU sampled into ``path`` (``perf record -a``) while the block
    runs; stopped with SIGINT, which makes perf write its file, on the way out."""
    path.parent.mkdir(parents=True, exist_ok=True)
    process = subprocess.Popen(
        [
            *(perf_command(), "record", "-a", "-e", "cpu-clock", "-c", str(SAMPLE_NS)),
            *("-o", str(path), "--", "sleep", "86400"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(timeout=120)


def milliseconds_by_function(path: Path, command: str = "postgres") -> Counter[str]:
    """CPU milliseconds of the processes named ``command`` in recording ``path``, by
    ``"dso function"``; the binary's unnamed (static) functions summed as one."""
    report = subprocess.run(
        [
            *(perf_command(), "report", "-i", str(path), "--comm", command, "--stdio", "-q"),
            *("--sort", "dso,sym", "-F", "sample,dso,sym"),
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    found: Counter[str] = Counter()
    for line in report.splitlines():
        parts = line.split(None, 3)  # samples, dso, [k] or [.], function
        if len(parts) < 4 or not parts[0].isdigit():
            continue
        samples, dso, _, function = parts
        dso = "kernel" if dso == "[kernel.kallsyms]" else dso  # no brackets: rich markup
        key = UNNAMED if function.startswith("0x") else f"{dso} {function.strip()}"
        found[key] += int(samples) * SAMPLE_NS // 1_000_000
    return found
