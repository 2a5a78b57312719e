"""The header samples the tests read are in the repository (docs/decisions.md "The tests
need nothing outside the repository")."""

from __future__ import annotations

from tests.unit import SAMPLES_PATH, V5, sample_entries


def test_the_samples_are_part_of_the_repository() -> None:
    repository = SAMPLES_PATH.parents[2]
    assert SAMPLES_PATH.is_relative_to(repository / "tests" / "data")
    assert SAMPLES_PATH.is_file()
    assert "NServiceBus.FailedQ" in sample_entries()[V5]["headers"]
