"""Migration 0033 on each provider: SQLite's indexes a subset is read by end with the
fenced sorts' keys, every page of a group, an endpoint and a queue address reads the same
answers through them, and a downgrade takes them back; PostgreSQL's are left as 0031
made them."""

from __future__ import annotations

import uuid

import sqlalchemy as sa
from alembic import command

from controlroom.db.migrate import alembic_config, upgrade_database
from controlroom.errors.model import FailureGroup
from tests.subset_pages import answers, every_subset, indexes, write_subsets

GROUP = FailureGroup(id=str(uuid.uuid5(uuid.NAMESPACE_URL, "0033")), classifier="T", title="t")
# index: (the columns it is walked by, the fenced sorts' keys 0033 puts after them)
COVERED = {
    "ix_failed_message_groups_group_id_status_first": (
        "group_id, status, first_failure_at, failed_message_id",
        "last_modified",
    ),
    "ix_failed_messages_receiving_endpoint_time_sent": (
        "receiving_endpoint, time_sent, id",
        "last_modified, status",
    ),
    "ix_failed_messages_queue_address_lower_time_sent": (
        "lower(queue_address), time_sent, id",
        "queue_address, last_modified, status",
    ),
}
SUBSETS = every_subset(GROUP)


def definitions(engine: sa.Engine) -> dict[str, str]:
    """The definition of each index of ``COVERED``: its columns (SQLite) or its whole
    ``CREATE INDEX`` (PostgreSQL)."""
    found = indexes(engine)
    if engine.dialect.name == "postgresql":
        return {name: found[name] for name in COVERED}
    return {name: found[name].partition("(")[2].rpartition(")")[0] for name in COVERED}


def test_0033_ends_sqlites_subset_indexes_with_the_fenced_sorts_keys(engine: sa.Engine) -> None:
    write_subsets(engine, GROUP)
    at_head = answers(engine, SUBSETS)
    assert all(ids for _, ids in at_head.values())
    sqlite = engine.dialect.name == "sqlite"
    before = definitions(engine)
    if sqlite:
        assert before == {name: f"{walked}, {keys}" for name, (walked, keys) in COVERED.items()}

    command.downgrade(alembic_config(engine), "0032")
    if sqlite:
        assert definitions(engine) == {name: walked for name, (walked, _) in COVERED.items()}
    else:
        assert definitions(engine) == before
    assert answers(engine, SUBSETS) == at_head
    upgrade_database(engine)
    assert definitions(engine) == before
    assert answers(engine, SUBSETS) == at_head
