"""A small, varied set of NServiceBus failed messages for the group and archive tests,
and the expected groups computed from it in Python (never with the SQL under test)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from controlroom.errors.ingest.parsing import parse_failed_message
from controlroom.errors.ingest.writer import FailedMessageBatchWriter, IngestionBatch
from controlroom.errors.model import FailedAttempt
from tests.factories import at
from tests.nsb import failed_headers

INVALID_OPERATION = "System.InvalidOperationException"
TIMEOUT = "System.TimeoutException"
ARGUMENT = "System.ArgumentException"

# message id -> (endpoint, attempts as (seconds after BASE_TIME, exception type)). Several
# messages fail more than once; "order-8" changes its exception between attempts, so its
# groups must be those of its newest attempt.
FIXTURE: dict[str, tuple[str, tuple[tuple[float, str], ...]]] = {
    "order-1": ("Sales", ((10, INVALID_OPERATION),)),
    "order-2": ("Sales", ((20, INVALID_OPERATION), (50, INVALID_OPERATION))),
    "order-3": (
        "Billing",
        ((5, INVALID_OPERATION), (15, INVALID_OPERATION), (70, INVALID_OPERATION)),
    ),
    "order-4": ("Billing", ((30, TIMEOUT),)),
    "order-5": ("Sales", ((40, TIMEOUT), (45, TIMEOUT))),
    "order-6": ("Shipping", ((60, ARGUMENT),)),
    "order-7": ("Shipping", ((65, TIMEOUT),)),
    "order-8": ("Sales", ((12, ARGUMENT), (80, TIMEOUT))),
}


@dataclass
class ExpectedGroup:
    title: str
    classifier: str
    count: int
    first: datetime
    last: datetime
    members: set[str]  # UniqueMessageIds


def ingest_fixture(writer: FailedMessageBatchWriter) -> dict[str, list[FailedAttempt]]:
    """Write ``FIXTURE`` through the writer, the n-th attempts of all messages in the n-th
    batch; returns each message's parsed attempts by UniqueMessageId."""
    attempts: dict[str, list[FailedAttempt]] = {}
    for message_id, (endpoint, failures) in FIXTURE.items():
        for seconds, exception_type in failures:
            attempt = parse_failed_message(
                failed_headers(
                    message_id,
                    endpoint=endpoint,
                    failed_at=at(seconds),
                    exception_type=exception_type,
                ),
                b'{"order": 1}',
                max_body_size_to_store=102_400,
            )
            attempts.setdefault(attempt.unique_message_id, []).append(attempt)
    rounds = max(len(items) for items in attempts.values())
    for index in range(rounds):
        batch = [items[index] for items in attempts.values() if index < len(items)]
        writer.write(
            IngestionBatch(
                attempts=batch, endpoints=[e for attempt in batch for e in attempt.endpoints]
            )
        )
    return attempts


def expected_groups(
    attempts: dict[str, list[FailedAttempt]], classifier: str, members: Iterable[str]
) -> dict[str, ExpectedGroup]:
    """The groups of ``classifier`` over the messages ``members`` (UniqueMessageIds): each
    message belongs to its newest attempt's groups; ``first`` is the earliest attempt of
    the counted messages, ``last`` the latest."""
    groups: dict[str, ExpectedGroup] = {}
    for unique_id in members:
        tried = attempts[unique_id]
        newest = max(tried, key=lambda attempt: attempt.time_of_failure)
        first = min(attempt.time_of_failure for attempt in tried)
        last = newest.time_of_failure
        for group in newest.groups:
            if group.classifier != classifier:
                continue
            found = groups.get(group.id)
            if found is None:
                groups[group.id] = ExpectedGroup(
                    group.title, group.classifier, 1, first, last, {unique_id}
                )
                continue
            found.count += 1
            found.first = min(found.first, first)
            found.last = max(found.last, last)
            found.members.add(unique_id)
    return groups


def parse_utc(text: str) -> datetime:
    """An API timestamp, which must be ISO 8601 UTC ending in ``Z``."""
    assert text.endswith("Z"), text
    return datetime.fromisoformat(text)
