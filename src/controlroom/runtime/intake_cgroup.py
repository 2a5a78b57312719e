"""Intake's own cgroup, made by serve where the kernel lets it (docs/decisions.md
"Intake's own cgroup escapes autogroup"): ``made_intake_cgroup``.

With ``ingestion.own_cgroup`` (on by default) and without ``ingestion.cpu_cgroup`` serve
makes a cgroup of the CPU controller beside its own, ``controlroom-intake-<serve's
pid>-<random>``, recorded in its data directory, and the workers move themselves and
their local PostgreSQL backends into it (``workers``), out of the kernel's autogroup. Its
weight follows serve's reads (``IntakeCgroup``, docs/decisions.md "Intake's weight follows
the reads"): the least the kernel takes while serve answers one (for at most
``ingestion.yield_to_reads`` of the time, ``reads_first.WeighIntake``), a session's of its
own otherwise, so that the reads win the CPU and a machine busy with other work does not
starve the drain between them. Where serve may not (no root, no delegated cgroup, cgroup
v2 without ``cpu`` enabled below serve's cgroup), it
says why once and intake keeps the nice alone. Linux only.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from controlroom.runtime.file_locks import held_elsewhere, hold

log = logging.getLogger(__name__)

PREFIX = "controlroom-intake-"
"""The name of a cgroup serve made, before the serve's process id."""

_WEIGHTS = {"cpu.shares": (2, 1024), "cpu.weight": (1, 100)}
"""Intake's weight per weight file (v1, v2): while serve answers a read, the least the
kernel takes; otherwise a nice-0 process's, the weight the kernel gives a session of its
own (kernel/sched/core.c, sched_prio_to_weight; v2's cpu.weight is it over 1024 x 100)."""

_REMOVE_TRIES = 50  # a backend ends a moment after its connection closes
_NAME_TRIES = 100  # names of intake's cgroup tried before giving up

RECORDS: Final = "intake-cgroups"
"""The directory of serve's data directory that records the cgroups its serves made."""


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
def made_intake_cgroup(share: float, records: Path) -> Iterator[IntakeCgroup | None]:
    """Intake's cgroup, made beside serve's own, and removed on exit (what is still in it
    moved back to serve's cgroup); ``None`` where it cannot be made, said in the log with
    the reason. ``share`` (``ingestion.yield_to_reads``) is said with the weights
    (``IntakeCgroup.weighing``).

    ``records`` (a directory of serve's data directory) holds a file per cgroup made,
    locked (``flock``) while its serve runs: the cgroups an ended serve of this data
    directory left (a second Ctrl+C, a ``kill -9``) are removed first, what is still in
    them moved to serve's cgroup, and said in the log. A cgroup without a record, or
    whose record is locked, is never touched: its process id cannot tell, since a serve in
    another PID namespace may have any id, and its ``cgroup.procs`` may look empty from
    here."""
    place = find_place()
    if isinstance(place, str):
        log.info("intake keeps serve's cgroup (the nice alone): %s", place)
        yield None
        return
    records.mkdir(parents=True, exist_ok=True)
    _remove_left(records, place.directory)
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
    with _record(records / path.name, path):
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
    """Make intake's cgroup in ``directory``: ``PREFIX``, this process's id and a random
    part, so that serves in PID namespaces of their own (whose ids may be equal) never
    share one. Raises ``OSError`` when the kernel refuses."""
    for _ in range(_NAME_TRIES):
        path = directory / f"{PREFIX}{os.getpid()}-{secrets.token_hex(4)}"
        try:
            path.mkdir()
        except FileExistsError:
            continue
        return path
    raise FileExistsError(errno.EEXIST, "every name tried is taken", str(directory))


@contextlib.contextmanager
def _record(record: Path, cgroup: Path) -> Iterator[None]:
    """Hold ``record`` (naming ``cgroup``) locked for the block; remove it after, unless
    ``cgroup`` is still there for the next serve to remove."""
    with record.open("w", encoding="utf-8") as handle:
        hold(handle)
        handle.write(record_text(cgroup, record.parent))
        handle.flush()
        try:
            yield
        finally:
            if not cgroup.is_dir():
                record.unlink(missing_ok=True)


def record_text(cgroup: Path, records: Path) -> str:
    """What the record of ``cgroup`` in ``records`` says: the cgroup's path, then the
    records directory's own identity (device and inode), so that a record copied with a
    data directory (a backup restored beside the live serve) is not taken for one of its
    own."""
    return f"{cgroup}\n{_identity(records)}\n"


def _identity(directory: Path) -> str:
    found = directory.stat()
    return f"{found.st_dev}:{found.st_ino}"


def remove_left(records: Path) -> None:
    """Remove the cgroups that ended serves of one data directory left
    (``records``: its ``RECORDS`` directory), as the next serve of it does at start
    (``made_intake_cgroup``): for what ends serves by ``kill -9`` and starts none after,
    such as the tests. Nothing where intake's cgroup cannot be made or nothing is
    recorded."""
    place = find_place()
    if isinstance(place, _Place) and records.is_dir():
        _remove_left(records, place.directory)


def _remove_left(records: Path, directory: Path) -> None:
    """Remove each cgroup in ``directory`` whose record in ``records`` no serve holds, and
    its record. What is still in one (the sessions of a killed worker's PostgreSQL
    backends, waiting on a lock) is moved to serve's cgroup first: its serve has ended."""
    for record in sorted(records.iterdir()):
        if held_elsewhere(record):
            continue
        cgroup = directory / record.name
        named, _, made_in = record.read_text(encoding="utf-8").partition("\n")
        if not record.name.startswith(PREFIX) or named != str(cgroup):
            log.info("%s names no cgroup of serve's here: left as it is", record)
            continue
        if made_in.strip() not in ("", _identity(records)):  # "": recorded before it was said
            log.info("%s was recorded by another data directory's serve: left as it is", record)
            continue
        if cgroup.is_dir():
            members = _members(cgroup)
            if not _remove(cgroup, directory):
                continue
            moved = (
                f" (its {len(members)} process{'' if len(members) == 1 else 'es'} moved to "
                "serve's cgroup first)"
                if members
                else ""
            )
            log.info("removed intake's cgroup %s, which an ended serve left%s", cgroup, moved)
        record.unlink(missing_ok=True)


def _members(cgroup: Path) -> list[str]:
    """The process ids in ``cgroup``; none when it cannot be read."""
    try:
        return (cgroup / "cgroup.procs").read_text().split()
    except OSError:
        return []


def _remove(cgroup: Path, parent: Path) -> bool:
    """Move what is in ``cgroup`` to ``parent``, then remove it; ``False`` and a warning
    when the kernel keeps it (a process kept moving in)."""
    for _ in range(_REMOVE_TRIES):
        for pid in _members(cgroup):
            with contextlib.suppress(OSError):  # a process that ended meanwhile
                (parent / "cgroup.procs").write_text(f"{pid}\n")
        try:
            cgroup.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError:
            time.sleep(0.1)
    log.warning(
        "intake's cgroup %s could not be removed; the next serve of this data directory "
        "removes it",
        cgroup,
    )
    return False
