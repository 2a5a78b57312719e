"""Intake's own cgroup, made by serve where the kernel lets it (docs/decisions.md
"Intake's own cgroup escapes autogroup"): ``made_intake_cgroup``.

With ``ingestion.own_cgroup`` (off by default) and without ``ingestion.cpu_cgroup`` serve
makes a cgroup of the CPU controller beside its own, ``controlroom-intake-<serve's pid>``,
weighing as one process at ``ingestion.nice`` (the kernel's weight of that nice), and the
workers move themselves and their local PostgreSQL backends into it (``workers``), out of
the kernel's autogroup. Where serve may not (no root, no delegated cgroup, cgroup v2
without ``cpu`` enabled below serve's cgroup), it says why once and intake keeps the nice
alone. Linux only.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

PREFIX = "controlroom-intake-"
"""The name of a cgroup serve made, before the serve's process id."""

# The kernel's CFS weight of each nice value 0..19 (kernel/sched/core.c,
# sched_prio_to_weight): v1's cpu.shares; v2's cpu.weight is it over 1024 times 100.
_NICE_WEIGHTS = (
    1024,
    820,
    655,
    526,
    423,
    335,
    272,
    215,
    172,
    137,
    110,
    87,
    70,
    56,
    45,
    36,
    29,
    23,
    18,
    15,
)

_REMOVE_TRIES = 50  # a backend ends a moment after its connection closes


@dataclass(frozen=True, slots=True)
class _Place:
    """Where serve can make intake's cgroup: the directory of serve's own cgroup in the
    CPU controller's hierarchy, and the file that sets a cgroup's weight there."""

    directory: Path
    weight_file: str  # "cpu.shares" (v1) or "cpu.weight" (v2)


def weight_for(nice: int, weight_file: str) -> int:
    """The weight of one process at ``nice`` (0..19) in ``weight_file``'s units."""
    shares = _NICE_WEIGHTS[nice]
    return shares if weight_file == "cpu.shares" else max(1, round(shares * 100 / 1024))


def find_place(proc: Path = Path("/proc/self")) -> _Place | str:
    """Serve's own cgroup of the CPU controller and its weight file, from ``proc``'s
    ``cgroup`` and ``mountinfo``; or why intake's cgroup cannot be made beside it."""
    try:
        memberships = (proc / "cgroup").read_text().splitlines()
        mounts = (proc / "mountinfo").read_text().splitlines()
    except OSError as exc:
        return f"no cgroups to read ({exc.strerror})"
    for line in memberships:
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if "cpu" in controllers.split(","):
            place = _place(mounts, "cgroup", path, "cpu.shares")
            break
        if hierarchy == "0" and controllers == "":
            place = _place(mounts, "cgroup2", path, "cpu.weight")
            if isinstance(place, _Place):
                enabled = (place.directory / "cgroup.subtree_control").read_text().split()
                if "cpu" not in enabled:
                    return (
                        f"cpu is not enabled below serve's cgroup {place.directory} "
                        "(its cgroup.subtree_control)"
                    )
            break
    else:
        return "serve is in no cgroup of the CPU controller"
    if isinstance(place, str):
        return place
    if not os.access(place.directory, os.W_OK):
        return f"this user may not make a cgroup in {place.directory}"
    return place


def _place(mounts: list[str], kind: str, path: str, weight_file: str) -> _Place | str:
    """``path`` (a cgroup as ``/proc/<pid>/cgroup`` names it) under the mount of the
    ``kind`` hierarchy (v1: the one holding the cpu controller) in ``mounts``
    (``mountinfo`` lines: ``id parent dev root mountpoint ... - fstype source options``)."""
    for line in mounts:
        fields, _, tail = line.partition(" - ")
        fstype, _, rest = tail.partition(" ")
        options = rest.partition(" ")[2]
        if fstype != kind or (kind == "cgroup" and "cpu" not in options.split(",")):
            continue
        root, mountpoint = fields.split(" ")[3:5]
        relative = os.path.relpath(path, root)
        if relative.startswith(".."):
            return f"serve's cgroup {path} is outside the mounted hierarchy"
        return _Place(Path(mountpoint, relative), weight_file)
    return f"no {kind} hierarchy of the CPU controller is mounted"


@contextlib.contextmanager
def made_intake_cgroup(nice: int) -> Iterator[Path | None]:
    """Intake's cgroup, made beside serve's own with the weight of one process at
    ``nice``, and removed on exit (what is still in it moved back to serve's cgroup);
    ``None`` where it cannot be made, said in the log with the reason. Empty cgroups an
    ended serve left (``PREFIX`` and a process id no longer running) are removed first."""
    place = find_place()
    if isinstance(place, str):
        log.info("intake keeps serve's cgroup (the nice alone): %s", place)
        yield None
        return
    for left in place.directory.glob(f"{PREFIX}*"):
        if not _running(left.name.removeprefix(PREFIX)):
            _remove(left, place.directory)
    cgroup = place.directory / f"{PREFIX}{os.getpid()}"
    weight = weight_for(nice, place.weight_file)
    try:
        cgroup.mkdir(exist_ok=True)
        (cgroup / place.weight_file).write_text(f"{weight}\n")
    except OSError as exc:
        log.info("intake keeps serve's cgroup (the nice alone): cannot make %s: %s", cgroup, exc)
        with contextlib.suppress(OSError):
            cgroup.rmdir()
        yield None
        return
    log.info(
        "intake's cgroup %s made, %s %d (one process at nice %d)",
        cgroup,
        place.weight_file,
        weight,
        nice,
    )
    try:
        yield cgroup
    finally:
        _remove(cgroup, place.directory)


def _running(pid: str) -> bool:
    """Whether process ``pid`` (text) runs; a name that is no process id counts as
    running, so a cgroup serve did not name is never touched."""
    if not pid.isdigit():
        return True
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def _remove(cgroup: Path, parent: Path) -> None:
    """Move what is in ``cgroup`` to ``parent``, then remove it; a warning when the
    kernel keeps it (a process kept moving in)."""
    for _ in range(_REMOVE_TRIES):
        with contextlib.suppress(OSError):  # gone, or a process that ended meanwhile
            for pid in (cgroup / "cgroup.procs").read_text().split():
                with contextlib.suppress(OSError):
                    (parent / "cgroup.procs").write_text(f"{pid}\n")
        try:
            cgroup.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.1)
    log.warning("intake's cgroup %s could not be removed; the next serve removes it", cgroup)
