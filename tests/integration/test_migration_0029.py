"""Migration 0029 on each provider: a group's rows get an index of the message type, the
queue address's index holds the address itself on PostgreSQL, a group's pages by message
type and a queue address's pages and counts read the same answers through them, and a
downgrade takes them back."""

from __future__ import annotations

import uuid

import sqlalchemy as sa
from alembic import command

from controlroom.db.migrate import alembic_config, upgrade_database
from controlroom.db.tables import FailedMessageStatus
from controlroom.errors.model import FailureGroup
from controlroom.errors.read.filters import FailedMessageFilter
from tests.subset_pages import answers, indexes, write_subsets

GROUP = FailureGroup(id=str(uuid.uuid5(uuid.NAMESPACE_URL, "0029")), classifier="T", title="t")
GROUP_INDEX = "ix_failed_message_groups_group_id_message_type"
QUEUE_INDEX = "ix_failed_messages_queue_address_lower_time_sent"
SUBSETS = (
    FailedMessageFilter(group_id=GROUP.id),
    FailedMessageFilter(group_id=GROUP.id, statuses=frozenset({FailedMessageStatus.UNRESOLVED})),
    FailedMessageFilter(queue_address="QUEUE"),
)


def test_0029_indexes_a_groups_message_type_and_covers_the_queue_address(
    engine: sa.Engine,
) -> None:
    write_subsets(engine, GROUP)
    at_head = answers(engine, SUBSETS)
    assert all(ids for _, ids in at_head.values())
    found = indexes(engine)
    assert GROUP_INDEX in found
    if engine.dialect.name == "postgresql":
        # the address first; migration 0031 includes the fenced sorts' keys after it
        assert "INCLUDE (queue_address" in found[QUEUE_INDEX]

    command.downgrade(alembic_config(engine), "0028")
    found = indexes(engine)
    assert GROUP_INDEX not in found and QUEUE_INDEX in found
    assert "INCLUDE" not in found[QUEUE_INDEX]
    assert answers(engine, SUBSETS) == at_head
    upgrade_database(engine)
    assert answers(engine, SUBSETS) == at_head
    assert GROUP_INDEX in indexes(engine)
