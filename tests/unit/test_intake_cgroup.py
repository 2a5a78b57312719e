"""Intake's own cgroup (``ingestion.cpu_cgroup``): which directories serve's workers may
join (``workers.cgroup_problem``, checked by serve at start), and the weight of the one
serve makes (``runtime.intake_cgroup``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from controlroom.config import Settings
from controlroom.runtime.intake_cgroup import IntakeCgroup
from controlroom.workers import cgroup_problem


def test_an_intake_cgroup_that_is_no_cgroup_directory_is_refused(tmp_path: Path) -> None:
    """A directory without ``cgroup.procs`` (a typo of its path, or a cgroup's parent
    mount on another machine) would fail in each worker instead."""
    assert cgroup_problem(tmp_path) == (
        f"{tmp_path} is no cgroup directory (one holding cgroup.procs)"
    )


@pytest.mark.parametrize("control", ["cpu.weight", "cpu.shares", "cpu.idle"])
def test_an_intake_cgroup_directory_is_taken(tmp_path: Path, control: str) -> None:
    """A cgroup of the CPU controller: v2's ``cpu.weight`` or ``cpu.idle``, v1's
    ``cpu.shares``."""
    (tmp_path / "cgroup.procs").write_text("")
    (tmp_path / control).write_text("")
    assert cgroup_problem(tmp_path) is None
    assert Settings(ingestion={"cpu_cgroup": tmp_path}).ingestion.cpu_cgroup == tmp_path


def test_an_intake_cgroup_without_a_cpu_weight_is_refused(tmp_path: Path) -> None:
    """Fresh-user pass (sixth): a cgroup of the memory controller was taken, and the
    workers moved into it kept their CPU share."""
    (tmp_path / "cgroup.procs").write_text("")
    (tmp_path / "memory.limit_in_bytes").write_text("")
    assert f"{tmp_path} sets no CPU weight (no cpu.weight, cpu.shares or cpu.idle)" in (
        cgroup_problem(tmp_path) or ""
    )


def test_the_root_of_a_cgroup_hierarchy_is_refused_as_intake_cgroup() -> None:
    """Fresh-user pass (sixth): the hierarchy's root was taken; every process is in it
    already, so intake gained no lower weight."""
    roots = [
        root
        for root in (Path("/sys/fs/cgroup/cpu"), Path("/sys/fs/cgroup"))
        if os.path.ismount(root) and os.access(root / "cgroup.procs", os.W_OK)
    ]
    if not roots or not any((roots[0] / f).exists() for f in ("cpu.shares", "cpu.weight")):
        pytest.skip("needs a writable cgroup hierarchy of the CPU controller (root)")
    assert cgroup_problem(roots[0]) == (
        f"{roots[0]} is a hierarchy's root, where every process is: make a cgroup under it"
    )


@pytest.mark.parametrize(
    ("weight_file", "reading", "idle"), [("cpu.shares", "2", "1024"), ("cpu.weight", "1", "100")]
)
def test_intake_weighs_least_while_a_read_is_answered_and_as_a_session_otherwise(
    tmp_path: Path, weight_file: str, reading: str, idle: str
) -> None:
    """The least weight the kernel takes while serve answers a read (v1 2, v2 1); a
    nice-0 process's otherwise (docs/decisions.md "Intake's weight follows the reads")."""
    (tmp_path / weight_file).write_text("")
    cgroup = IntakeCgroup(tmp_path, weight_file)
    assert (tmp_path / weight_file).read_text() == f"{idle}\n"
    cgroup.reading(True)
    assert (tmp_path / weight_file).read_text() == f"{reading}\n"
    cgroup.reading(False)
    assert (tmp_path / weight_file).read_text() == f"{idle}\n"


def test_a_weight_that_cannot_be_written_is_said_once_and_serve_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An operator removed the cgroup under a running serve: its reads are answered, one
    warning says the weight no longer follows them."""
    (tmp_path / "cpu.shares").write_text("")
    cgroup = IntakeCgroup(tmp_path, "cpu.shares")
    (tmp_path / "cpu.shares").unlink()
    for reading in (True, False, True):
        cgroup.reading(reading)
    assert [r.getMessage() for r in caplog.records] == [
        f"intake's weight in {tmp_path / 'cpu.shares'} can no longer be set: "
        "No such file or directory; it no longer follows the reads"
    ]


@pytest.mark.parametrize(
    ("share", "said"),
    [
        (0.2, "cpu.shares 2 while serve answers a read (for at most 0.2 of the time: "
         "ingestion.yield_to_reads), 1024 otherwise"),
        (0.0, "cpu.shares 1024 (ingestion.yield_to_reads 0: not lowered for reads)"),
    ],
)
def test_the_log_says_what_intake_weighs_with_the_reads_share(
    tmp_path: Path, share: float, said: str
) -> None:
    """Fresh user's pass (session 31): with yield_to_reads 0 serve said the weight drops
    to 2 for reads, and it never did."""
    (tmp_path / "cpu.shares").write_text("")
    assert IntakeCgroup(tmp_path, "cpu.shares").weighing(share) == said
