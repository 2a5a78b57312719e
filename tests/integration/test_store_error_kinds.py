"""What the store refuses is the input's fault only when the input broke a rule of its
own (a value wider than its column); a NOT NULL or key violation is a bug of the code
that wrote the row, classified alike on every provider (docs/design.md "Failed imports":
only a reason of the message's own makes a failed import)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest
import sqlalchemy as sa

from controlroom.db.errors import classify_store_error
from controlroom.db.tables import site_calls
from controlroom.exceptions import ErrorKind
from controlroom.telemetry.widths import TARGET_WIDTH

NOW = datetime(2026, 1, 1, 8, 30, tzinfo=UTC)


def site_call(**overrides: object) -> dict[str, object]:
    row: dict[str, object] = {
        "tracked_operation_id": str(uuid.uuid4()),
        "channel": "ApiOutbound",
        "target": "https://target.example/x",
        "source_site": "north",
        "status": "Submitted",
        "retry_count": 0,
        "created_at_utc": NOW,
        "updated_at_utc": NOW,
        "ingested_at_utc": NOW,
        "epoch": 0,
    }
    row.update(overrides)
    return row


def refusal(engine: sa.Engine, *rows: dict[str, object]) -> BaseException:
    with pytest.raises(sa.exc.DBAPIError) as raised, engine.begin() as conn:
        for row in rows:
            conn.execute(sa.insert(site_calls).values(**row))
    return raised.value


def test_a_value_wider_than_its_column_is_the_inputs_fault(engine: sa.Engine) -> None:
    exc = refusal(engine, site_call(target="x" * (TARGET_WIDTH + 1)))
    assert classify_store_error(exc) is ErrorKind.DATA


def test_a_missing_required_value_is_a_bug(engine: sa.Engine) -> None:
    exc = refusal(engine, site_call(source_site=None))
    assert classify_store_error(exc) is ErrorKind.FATAL


def test_a_duplicate_key_is_a_bug(engine: sa.Engine) -> None:
    row = site_call()
    exc = refusal(engine, row, row)
    assert classify_store_error(exc) is ErrorKind.FATAL
