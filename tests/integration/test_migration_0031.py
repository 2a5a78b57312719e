"""Migration 0031 on each provider: on PostgreSQL the indexes a subset is read by include
its fenced sorts' keys, every page of a group, an endpoint and a queue address reads the
same answers through them, and a downgrade takes them back; SQLite's indexes are left as
they were."""

from __future__ import annotations

import uuid

import sqlalchemy as sa
from alembic import command

from controlroom.db.migrate import alembic_config, upgrade_database
from controlroom.errors.model import FailureGroup
from tests.subset_pages import answers, every_subset, indexes, write_subsets

GROUP = FailureGroup(id=str(uuid.uuid5(uuid.NAMESPACE_URL, "0031")), classifier="T", title="t")
INCLUDED = {
    "ix_failed_message_groups_group_id_status_first": "INCLUDE (last_modified)",
    "ix_failed_messages_receiving_endpoint_time_sent": ("INCLUDE (last_modified, status)"),
    "ix_failed_messages_queue_address_lower_time_sent": (
        "INCLUDE (queue_address, last_modified, status)"
    ),
}
BEFORE = {"ix_failed_messages_queue_address_lower_time_sent": "INCLUDE (queue_address)"}
SUBSETS = every_subset(GROUP)


def included(engine: sa.Engine) -> dict[str, str]:
    """The ``INCLUDE`` clause of each index of ``INCLUDED`` (empty: none)."""
    found = indexes(engine)
    return {
        name: found[name].partition("INCLUDE")[1] + found[name].partition("INCLUDE")[2]
        for name in INCLUDED
    }


def test_0031_includes_the_fenced_sorts_keys_in_the_subsets_indexes(engine: sa.Engine) -> None:
    write_subsets(engine, GROUP)
    at_head = answers(engine, SUBSETS)
    assert all(ids for _, ids in at_head.values())
    postgresql = engine.dialect.name == "postgresql"
    if postgresql:
        assert included(engine) == INCLUDED
    else:
        assert not any("INCLUDE" in sql for sql in indexes(engine).values())

    command.downgrade(alembic_config(engine), "0030")
    if postgresql:
        assert included(engine) == {name: BEFORE.get(name, "") for name in INCLUDED}
    assert answers(engine, SUBSETS) == at_head
    upgrade_database(engine)
    assert answers(engine, SUBSETS) == at_head
    if postgresql:
        assert included(engine) == INCLUDED
