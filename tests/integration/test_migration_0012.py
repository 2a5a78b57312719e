"""Migration 0012 on a database of the previous schema, per provider: the tallies are
filled from the messages stored before it, the triggers count what follows, and the
downgrade removes both."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import command

from controlroom.db.engine import create_store_engine
from controlroom.db.migrate import alembic_config, upgrade_database
from controlroom.db.tables import FailedMessageStatus, failed_messages
from controlroom.db.transactions import begin_write
from tests.integration.older_schema import group_copies_before_0020
from tests.integration.test_tallies import assert_tallies_equal_aggregate, ingest

fm = failed_messages.c
TABLES = {"failed_message_tallies", "failed_message_tally_deltas"}


def test_tallies_are_filled_from_the_stored_messages_and_removed_on_downgrade(
    database_url: str,
) -> None:
    engine = create_store_engine(database_url)
    try:
        upgrade_database(engine)
        command.downgrade(alembic_config(engine), "0011")
        assert TABLES.isdisjoint(sa.inspect(engine).get_table_names())
        with group_copies_before_0020():
            for n in range(6):  # messages of several keys, some written at 0011 only
                ingest(engine, n, second=n, choice=n)
        with begin_write(engine) as conn:
            archived = conn.execute(sa.select(fm.id).order_by(fm.id).limit(2)).scalars().all()
            conn.execute(
                sa.update(failed_messages)
                .where(fm.id.in_(archived))
                .values(status=int(FailedMessageStatus.ARCHIVED))
            )
        upgrade_database(engine)
        assert_tallies_equal_aggregate(engine)
        ingest(engine, 1, second=40, choice=3)  # a new attempt moving a counted message
        assert_tallies_equal_aggregate(engine)
        command.downgrade(alembic_config(engine), "0011")
        assert TABLES.isdisjoint(sa.inspect(engine).get_table_names())
        with group_copies_before_0020():
            ingest(engine, 7, second=7, choice=7)  # no trigger left behind to fail a write
    finally:
        engine.dispose()
