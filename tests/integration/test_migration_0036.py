"""Migration 0036 on each provider: the four indexes by message type (a status's, an
endpoint's, a queue address's, a group's rows') hold the time of failure between the
message type and the id, the lists read the same pages through them, and a downgrade
takes them back to ``(..., message_type, id)``."""

from __future__ import annotations

import re
import uuid

import sqlalchemy as sa
from alembic import command

from controlroom.db.migrate import alembic_config, upgrade_database
from controlroom.errors.model import FailureGroup
from tests.subset_pages import answers, every_subset, indexes, write_subsets

GROUP = FailureGroup(id=str(uuid.uuid5(uuid.NAMESPACE_URL, "0036")), classifier="T", title="t")
INDEXES = {
    # index: its columns after 0036, as both providers write them (NULLS FIRST aside)
    "ix_failed_messages_status_message_type_id": "status, message_type, last_failure_at, id",
    "ix_failed_messages_receiving_endpoint_message_type": (
        "receiving_endpoint, message_type, last_failure_at, id"
    ),
    "ix_failed_messages_queue_address_lower_message_type": (
        "lower(queue_address), message_type, last_failure_at, id"
    ),
    "ix_failed_message_groups_group_id_message_type": (
        "group_id, message_type, last_failure_at, failed_message_id"
    ),
}


def columns(definition: str) -> str:
    """The indexed columns of an index's SQL or definition, without ``NULLS FIRST`` and
    what follows the column list (``INCLUDE``, ``WHERE``), PostgreSQL's cast of the queue
    address undone."""
    inside = re.search(r"\((.*?)\)(?: INCLUDE| WHERE|$)", definition.replace("\n", " "))
    assert inside, definition
    written = inside.group(1).replace(" NULLS FIRST", "")
    return written.replace("lower((queue_address)::text)", "lower(queue_address)")


def test_0036_indexes_equal_message_types_by_time_of_failure(engine: sa.Engine) -> None:
    write_subsets(engine, GROUP)
    subsets = every_subset(GROUP)
    at_head = answers(engine, subsets)
    assert all(ids for _, ids in at_head.values())
    found = indexes(engine)
    assert {name: columns(found[name]) for name in INDEXES} == INDEXES
    partial = found["ix_failed_messages_receiving_endpoint_message_type"]
    assert "<= 1000" in partial
    if engine.dialect.name == "postgresql":
        assert "INCLUDE (status)" in partial

    command.downgrade(alembic_config(engine), "0035")
    found = indexes(engine)
    assert {name: columns(found[name]) for name in INDEXES} == {
        name: cols.replace("last_failure_at, ", "") for name, cols in INDEXES.items()
    }
    assert "<= 1000" in found["ix_failed_messages_receiving_endpoint_message_type"]
    # The lists order by the time of failure whatever the indexes: the same pages.
    assert answers(engine, subsets) == at_head
    upgrade_database(engine)
    assert {name: columns(indexes(engine)[name]) for name in INDEXES} == INDEXES
    assert answers(engine, subsets) == at_head
