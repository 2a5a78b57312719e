"""Fold a batch's failed attempts into one row per failed message (pure, no I/O).

Source: docs/design.md "Writer": per message, attempts sorted by time of failure; the winner is
the last; the count is the number of distinct attempt timestamps, which are kept (newest
first) for the upsert to tell new attempts from counted ones; the failure window is their
min and max. Rows come out sorted by UniqueMessageId, the stable lock order that
keeps concurrent writers from deadlocking on each other.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from controlroom.errors.model import FailedAttempt, KnownEndpoint


@dataclass(frozen=True, slots=True)
class FoldedMessage:
    """What one batch knows about one failed message."""

    winner: FailedAttempt  # the newest attempt: its payload is the row's payload
    failure_times: tuple[datetime, ...]  # distinct attempt timestamps, UTC, newest first
    first_failure_at: datetime  # UTC
    last_failure_at: datetime  # UTC, equals winner.time_of_failure

    @property
    def unique_message_id(self) -> str:
        return self.winner.unique_message_id

    @property
    def attempt_count(self) -> int:
        """Distinct attempt timestamps in this batch."""
        return len(self.failure_times)


def fold_attempts(attempts: Iterable[FailedAttempt]) -> list[FoldedMessage]:
    """Fold attempts into one ``FoldedMessage`` per UniqueMessageId, sorted by that id.

    Among attempts with the same time of failure (redeliveries of one attempt), the one
    that arrived last wins; the sort is stable.
    """
    by_message: dict[str, list[FailedAttempt]] = defaultdict(list)
    for attempt in attempts:
        by_message[attempt.unique_message_id].append(attempt)
    return [_fold_one(by_message[key]) for key in sorted(by_message)]


def _fold_one(attempts: list[FailedAttempt]) -> FoldedMessage:
    ordered = sorted(attempts, key=lambda attempt: attempt.time_of_failure)
    return FoldedMessage(
        winner=ordered[-1],
        failure_times=tuple(sorted({attempt.time_of_failure for attempt in ordered}, reverse=True)),
        first_failure_at=ordered[0].time_of_failure,
        last_failure_at=ordered[-1].time_of_failure,
    )


def unique_endpoints(endpoints: Iterable[KnownEndpoint]) -> list[KnownEndpoint]:
    """One endpoint per id (first seen wins), sorted by id for a stable lock order."""
    by_id: dict[str, KnownEndpoint] = {}
    for endpoint in endpoints:
        by_id.setdefault(endpoint.id, endpoint)
    return [by_id[key] for key in sorted(by_id)]
