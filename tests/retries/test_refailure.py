"""docs/decisions.md "A new failure releases the retry claim": a message in RetryIssued that fails
again loses its retry claim in the transaction that records the new failure, so a new retry request
takes it (as ServiceControl's retry cleaner does). Per provider."""

from __future__ import annotations

import sqlalchemy as sa

from controlroom.config import Settings
from controlroom.db.tables import FailedMessageStatus
from controlroom.errors.ingest.bodies import FileSystemBodyStore
from controlroom.errors.ingest.writer import FailedMessageBatchWriter
from controlroom.errors.retries import requests as retries
from tests.factories import at
from tests.nsb import failed_headers
from tests.retries.conftest import claims, statuses, store_failed


def test_a_retried_message_that_fails_again_can_be_retried_again_at_once(
    settings: Settings,
    engine: sa.Engine,
    writer: FailedMessageBatchWriter,
    body_store: FileSystemBodyStore,
) -> None:
    first = store_failed(settings, writer, body_store, failed_headers("order-1", failed_at=at(0)))
    message_id = first.unique_message_id
    old = retries.retry_message(engine, message_id)
    assert statuses(engine)[message_id] is FailedMessageStatus.RETRY_ISSUED

    # The retry went out (or not yet: the batch is still alive) and the message failed again.
    store_failed(settings, writer, body_store, failed_headers("order-1", failed_at=at(60)))

    assert statuses(engine)[message_id] is FailedMessageStatus.UNRESOLVED
    assert message_id not in claims(engine)
    again = retries.retry_message(engine, message_id)
    assert again.message_count == 1 and again.skipped_count == 0
    assert claims(engine)[message_id].retry_batch_id == again.batches[0].id != old.batches[0].id
    assert statuses(engine)[message_id] is FailedMessageStatus.RETRY_ISSUED
