"""Findings of the break-it pass, each pinned: hostile bodies, bad values, migration races."""

from __future__ import annotations

import multiprocessing
import multiprocessing.synchronize

import psycopg
import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from controlroom.db.engine import create_store_engine
from controlroom.db.errors import classify_store_error
from controlroom.db.migrate import upgrade_database
from controlroom.db.providers import provider_named
from controlroom.errors.ingest.parsing import parse_failed_message
from controlroom.errors.ingest.writer import FailedMessageBatchWriter, IngestionBatch
from controlroom.exceptions import ErrorKind
from tests.nsb import failed_headers


def test_a_html_body_is_never_served_as_a_page_of_the_api(
    client: TestClient, writer: FailedMessageBatchWriter
) -> None:
    attempt = parse_failed_message(
        failed_headers("xss", content_type="text/html"),
        b"<script>fetch('/api/errors/retry/all', {method: 'POST'})</script>",
        max_body_size_to_store=102_400,
    )
    writer.write(IngestionBatch(attempts=[attempt]))

    response = client.get(f"/api/messages/{attempt.unique_message_id}/body")

    assert response.status_code == 200
    assert response.headers["x-content-type-options"] == "nosniff"
    assert response.headers["content-disposition"] == "attachment"
    assert "sandbox" in response.headers["content-security-policy"]


def test_a_nul_in_a_parameter_is_a_client_error_not_a_500(client: TestClient) -> None:
    response = client.get("/api/recoverability/groups", params={"classifierFilter": "a\x00b"})

    assert response.status_code < 500, response.text


def test_a_tsvector_over_the_limit_is_the_message_s_fault() -> None:
    class ProgramLimit(psycopg.errors.ProgramLimitExceeded):
        sqlstate = "54000"

    # psycopg raises only through an engine the PostgreSQL provider made, which loads it;
    # classify_store_error asks the loaded providers alone.
    provider_named("postgresql")
    assert classify_store_error(ProgramLimit("string is too long for tsvector")) is ErrorKind.DATA


def _migrate(url: str, barrier: multiprocessing.synchronize.Barrier) -> None:
    engine = create_store_engine(url)
    barrier.wait(timeout=60)
    upgrade_database(engine)
    engine.dispose()


def test_processes_starting_together_migrate_one_after_the_other(postgresql_url: str) -> None:
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(3)
    processes = [context.Process(target=_migrate, args=(postgresql_url, barrier)) for _ in range(3)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=120)

    assert [process.exitcode for process in processes] == [0, 0, 0]
    engine = create_store_engine(postgresql_url)
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM alembic_version")).scalar_one() == 1
    engine.dispose()


@pytest.mark.parametrize(
    ("window", "field"),
    [
        ({"from": "2020-01-01T00:00:00", "to": "9999-12-31T23:59:59-14:00"}, "to"),
        ({"from": "0001-01-01T00:00:00+14:00", "to": "2020-01-01T00:00:00Z"}, "from"),
    ],
)
@pytest.mark.parametrize(
    "path", ["/api/pendingretries/resolve", "/api/pendingretries/queues/resolve"]
)
def test_a_time_outside_the_utc_calendar_is_a_client_error_naming_its_field(
    client: TestClient, window: dict[str, str], field: str, path: str
) -> None:
    """Breaker, session 33: "a value of this request is out of range: date value out of
    range" named no field, and the queue's window called a valid time no ISO 8601 time."""
    response = client.patch(path, json={**window, "queueaddress": "Sales"})

    assert 400 <= response.status_code < 500, response.text
    assert f"'{field}' time" in response.text
    assert "out of range in UTC" in response.text and "not an ISO 8601" not in response.text


def test_concurrent_overlapping_archive_and_unarchive_never_fail(
    client: TestClient, writer: FailedMessageBatchWriter
) -> None:
    import random
    from concurrent.futures import ThreadPoolExecutor

    attempts = [
        parse_failed_message(failed_headers(f"storm-{n}"), b"{}", max_body_size_to_store=10)
        for n in range(100)
    ]
    writer.write(IngestionBatch(attempts=attempts))
    ids = [a.unique_message_id for a in attempts]

    def storm(worker: int) -> list[int]:
        rng = random.Random(worker)
        codes = []
        for request in range(15):
            chosen = rng.sample(ids, 50)
            path = "/api/errors/archive" if (worker + request) % 2 else "/api/errors/unarchive"
            codes.append(client.patch(path, json=chosen).status_code)
        return codes

    with ThreadPoolExecutor(8) as pool:
        codes = [code for worker_codes in pool.map(storm, range(8)) for code in worker_codes]

    assert set(codes) == {202}
