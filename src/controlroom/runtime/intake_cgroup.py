"""Intake's own cgroup, made by serve where the kernel lets it (docs/decisions.md
"Intake's own cgroup escapes autogroup"): ``made_intake_cgroup``.

With ``ingestion.own_cgroup`` (on by default) and without ``ingestion.cpu_cgroup`` serve
makes a cgroup of the CPU controller beside its own, ``controlroom-intake-<serve's pid>``,
and the workers move themselves and their local PostgreSQL backends into it (``workers``),
out of the kernel's autogroup. Its weight follows serve's reads (``IntakeCgroup``,
docs/decisions.md "Intake's weight follows the reads"): the least the kernel takes while
serve answers one (for at most ``ingestion.yield_to_reads`` of the time,
``reads_first.WeighIntake``), a session's of its own otherwise, so that the reads win the CPU and a
machine busy with other work does not starve the drain between them. Where serve may not
(no root, no delegated cgroup, cgroup v2 without ``cpu`` enabled below serve's cgroup), it
says why once and intake keeps the nice alone. Linux only.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

PREFIX = "controlroom-intake-"
"""The name of a cgroup serve made, before the serve's process id."""

_WEIGHTS = {"cpu.shares": (2, 1024), "cpu.weight": (1, 100)}
"""Intake's weight per weight file (v1, v2): while serve answers a read, the least the
kernel takes; otherwise a nice-0 process's, the weight the kernel gives a session of its
own (kernel/sched/core.c, sched_prio_to_weight; v2's cpu.weight is it over 1024 x 100)."""

_REMOVE_TRIES = 50  # a backend ends a moment after its connection closes
_NAME_TRIES = 100  # names of intake's cgroup tried before giving up


@dataclass(frozen=True, slots=True)
class _Place:
    """Where serve can make intake's cgroup: the directory of serve's own cgroup in the
    CPU controller's hierarchy, and the file that sets a cgroup's weight there."""

    directory: Path
    weight_file: str  # "cpu.shares" (v1) or "cpu.weight" (v2)


class IntakeCgroup:
    """Intake's cgroup at ``path``, whose weight (``weight_file``: ``"cpu.shares"`` or
    ``"cpu.weight"``) follows serve's reads (``reading``); made weighing as when no read
    is in flight."""

    def __init__(self, path: Path, weight_file: str) -> None:
        self.path = path
        self._weight_file = path / weight_file
        self._while_reading, self._otherwise = _WEIGHTS[weight_file]
        self._broken = False
        self._write(self._otherwise)

    def weighing(self, share: float) -> str:
        """What it weighs, for the log, with ``share`` the most of the time it is lowered
        for reads (``ingestion.yield_to_reads``): ``"cpu.shares 2 while serve answers a
        read (for at most 0.2 of the time: ingestion.yield_to_reads), 1024 otherwise"``."""
        name = self._weight_file.name
        if share <= 0:
            return f"{name} {self._otherwise} (ingestion.yield_to_reads 0: not lowered for reads)"
        return (
            f"{name} {self._while_reading} while serve answers a read (for at most {share:g} "
            f"of the time: ingestion.yield_to_reads), {self._otherwise} otherwise"
        )

    def reading(self, reads: bool) -> None:
        """Weigh as while serve answers a read (``reads``) or as when it answers none.
        Called on serve's event loop at each change: one write of a few bytes. A write the
        kernel refuses (the cgroup was removed under serve) is logged once, and no more
        writes are tried."""
        if self._broken:
            return
        try:
            self._write(self._while_reading if reads else self._otherwise)
        except OSError as exc:
            self._broken = True
            log.warning(
                "intake's weight in %s can no longer be set: %s; it no longer follows the reads",
                self._weight_file,
                exc.strerror,
            )

    def _write(self, weight: int) -> None:
        # No O_CREAT: a weight file that is gone is an error, not a new file.
        fd = os.open(self._weight_file, os.O_WRONLY | os.O_TRUNC)
        try:
            os.write(fd, f"{weight}\n".encode())
        finally:
            os.close(fd)


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
def made_intake_cgroup(share: float) -> Iterator[IntakeCgroup | None]:
    """Intake's cgroup, made beside serve's own, and removed on exit (what is still in it
    moved back to serve's cgroup); ``None`` where it cannot be made, said in the log with
    the reason. Empty cgroups an ended serve left (``PREFIX`` and a process id no longer
    running here) are removed first, and said in the log. ``share``
    (``ingestion.yield_to_reads``) is said with the weights (``IntakeCgroup.weighing``)."""
    place = find_place()
    if isinstance(place, str):
        log.info("intake keeps serve's cgroup (the nice alone): %s", place)
        yield None
        return
    for left in place.directory.glob(f"{PREFIX}*"):
        pid = left.name.removeprefix(PREFIX).partition("-")[0]
        # One named for this process is not its own yet: an earlier one's of the same pid.
        if pid == str(os.getpid()) or not _running(pid):
            _remove_left(left)
    try:
        path = _new_cgroup(place.directory)
    except OSError as exc:
        log.info(
            "intake keeps serve's cgroup (the nice alone): cannot make a cgroup in %s: %s",
            place.directory,
            exc,
        )
        yield None
        return
    try:
        cgroup = IntakeCgroup(path, place.weight_file)
    except OSError as exc:
        log.info("intake keeps serve's cgroup (the nice alone): cannot weigh %s: %s", path, exc)
        with contextlib.suppress(OSError):
            path.rmdir()
        yield None
        return
    log.info("intake's cgroup %s made, %s", path, cgroup.weighing(share))
    try:
        yield cgroup
    finally:
        if not path.is_dir():
            log.info("intake's cgroup %s was removed under serve", path)
        elif _remove(path, place.directory):
            log.info("intake's cgroup %s removed", path)


def _new_cgroup(directory: Path) -> Path:
    """Make intake's cgroup in ``directory``: ``PREFIX`` and this process's id, or with
    ``-2``, ``-3``... where another serve holds that name (one in a PID namespace of its
    own, where its id may be this one's). Raises ``OSError`` when the kernel refuses."""
    name = f"{PREFIX}{os.getpid()}"
    for attempt in range(1, _NAME_TRIES + 1):
        path = directory / (name if attempt == 1 else f"{name}-{attempt}")
        try:
            path.mkdir()
        except FileExistsError:
            continue
        return path
    raise FileExistsError(errno.EEXIST, "every name is taken", str(directory / name))


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


def _remove_left(cgroup: Path) -> None:
    """Remove ``cgroup``, named for a process that no longer runs here, when it is empty.
    One that holds processes is left: its serve may run in another PID namespace (a
    container sharing the hierarchy), where its name's process id is not this one's."""
    try:
        if (cgroup / "cgroup.procs").read_text().split():
            log.info("intake's cgroup %s is not serve's and holds processes: left as it is", cgroup)
            return
        cgroup.rmdir()
    except FileNotFoundError:
        return  # another serve removed it meanwhile
    except OSError as exc:
        log.warning("intake's cgroup %s, which an ended serve left, stays: %s", cgroup, exc)
        return
    log.info("removed intake's cgroup %s, which an ended serve left", cgroup)


def _remove(cgroup: Path, parent: Path) -> bool:
    """Move what is in ``cgroup`` to ``parent``, then remove it; ``False`` and a warning
    when the kernel keeps it (a process kept moving in)."""
    for _ in range(_REMOVE_TRIES):
        with contextlib.suppress(OSError):  # gone, or a process that ended meanwhile
            for pid in (cgroup / "cgroup.procs").read_text().split():
                with contextlib.suppress(OSError):
                    (parent / "cgroup.procs").write_text(f"{pid}\n")
        try:
            cgroup.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError:
            time.sleep(0.1)
    log.warning("intake's cgroup %s could not be removed; the next serve removes it", cgroup)
    return False
