"""docs/decisions.md "Store errors never carry message data": store errors, and the transient-retry
warnings that log them, never carry the statement's bound values (message bodies, headers, exception
texts)."""

from __future__ import annotations

import logging

import pytest
import sqlalchemy as sa

from controlroom.db.engine import create_store_engine

SECRET = "card-number-4111111111111111"


def test_a_failed_statement_does_not_show_its_parameters(
    database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    engine = create_store_engine(database_url)
    try:
        with pytest.raises(sa.exc.DBAPIError) as raised, engine.connect() as conn:
            conn.execute(
                sa.text("SELECT * FROM no_such_table WHERE body = :body"), {"body": SECRET}
            )
    finally:
        engine.dispose()
    logging.getLogger("test").warning("retrying after %s", raised.value)

    assert SECRET not in str(raised.value)
    assert SECRET not in caplog.text
