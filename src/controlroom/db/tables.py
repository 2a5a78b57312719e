"""SQLAlchemy Core tables: the schema the migrations create, used by every query.

Source: docs/design.md "Data model". The stored source of truth of a failed message is
``headers_json`` plus its body; every other column is a derived extraction for indexing.
``failed_messages.search_vector`` holds the message's search terms (computed by
``errors.ingest.search_terms``): a ``tsvector`` on PostgreSQL, their text on SQLite.
Objects whose DDL differs between providers — the full-text index over it, the partial
retention and search-pending indexes — are created by the migrations' per-provider
branches and are not modelled here.
"""

from __future__ import annotations

import enum
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import ARRAY

from controlroom.db.types import SearchTermsText, SearchTermsVector, UtcDateTime
from controlroom.telemetry.widths import (
    ACTION_WIDTH,
    ACTOR_WIDTH,
    CATEGORY_WIDTH,
    CHANNEL_WIDTH,
    LAST_ERROR_WIDTH,
    NODE_WIDTH,
    NOTIFICATION_SOURCE_WIDTH,
    OUTCOME_WIDTH,
    SITE_WIDTH,
    SOURCE_EVENT_ID_WIDTH,
    STATUS_WIDTH,
    SUBJECT_WIDTH,
    TARGET_WIDTH,
    UUID_LEN,
)

metadata = sa.MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)


class FailedMessageStatus(enum.IntEnum):
    """Status of a failed message (values match ServiceControl's)."""

    UNRESOLVED = 1
    RESOLVED = 2
    RETRY_ISSUED = 3
    ARCHIVED = 4


failed_messages = sa.Table(
    "failed_messages",
    metadata,
    sa.Column("id", sa.String(UUID_LEN), primary_key=True, comment="UniqueMessageId"),
    sa.Column("message_id", sa.String(400), nullable=False),
    sa.Column("status", sa.SmallInteger, nullable=False),
    sa.Column("status_changed_at", UtcDateTime, nullable=False),
    sa.Column("last_modified", UtcDateTime, nullable=False),
    sa.Column("number_of_processing_attempts", sa.Integer, nullable=False),
    sa.Column("first_failure_at", UtcDateTime, nullable=False),
    sa.Column("last_failure_at", UtcDateTime, nullable=False, comment="the stored attempt's"),
    # The distinct times of failure already counted, newest first, at most
    # errors.ingest.upsert.COUNTED_FAILURE_TIMES of them (migration 0009): what lets a
    # redelivered attempt be told from a new one. Integers, microseconds since the Unix
    # epoch (UTC); a JSON array on SQLite, a bigint[] on PostgreSQL. Empty for rows
    # stored before migration 0009 (their earlier attempts follow the seed's rule).
    sa.Column(
        "counted_failure_times",
        sa.JSON().with_variant(ARRAY(sa.BigInteger), "postgresql"),
        nullable=False,
    ),
    # Payload of the stored (newest) attempt; everything below is taken together.
    sa.Column("message_type", sa.Text),
    sa.Column("time_sent", UtcDateTime),
    sa.Column("is_system_message", sa.Boolean, nullable=False),
    sa.Column("conversation_id", sa.String(400)),
    sa.Column("exception_type", sa.Text),
    sa.Column("exception_message", sa.Text),
    sa.Column("exception_source", sa.Text),
    sa.Column("stack_trace", sa.Text),
    sa.Column("queue_address", sa.String(400), nullable=False, comment="NServiceBus.FailedQ"),
    sa.Column("receiving_endpoint", sa.String(400), nullable=False),
    sa.Column("receiving_host_id", sa.String(100)),
    sa.Column("receiving_host", sa.String(400)),
    sa.Column("sending_endpoint", sa.String(400)),
    sa.Column("sending_host_id", sa.String(100)),
    sa.Column("sending_host", sa.String(400)),
    sa.Column("headers_json", sa.Text, nullable=False),
    sa.Column("content_type", sa.String(400), nullable=False),
    sa.Column("body_size", sa.BigInteger, nullable=False, comment="true size, bytes"),
    sa.Column("body_text", sa.Text, comment="inline text, or the searchable prefix"),
    sa.Column("body_stored_externally", sa.Boolean, nullable=False),
    sa.Column("body_key", sa.String(200), comment="key in the body store"),
    # NULL only for rows stored before migration 0009 until their terms are written
    # (errors.ingest.search_backfill); ix_failed_messages_search_pending finds those.
    sa.Column(
        "search_vector",
        SearchTermsText().with_variant(SearchTermsVector(), "postgresql"),
        comment="the search terms of headers and body text",
    ),
    sa.Index("ix_failed_messages_status_last_modified", "status", "last_modified"),
    sa.Index("ix_failed_messages_status_id", "status", "id"),  # the status sort (0011)
    sa.Index("ix_failed_messages_queue_address", "queue_address"),
    sa.Index("ix_failed_messages_conversation_id", "conversation_id"),
)

# The list's sort keys, each followed by the id (migration 0004): a page in either
# direction reads the index in order. Empty values sort smallest (errors.read.filters.order_by);
# Nullable keys are indexed NULLS FIRST, the order of the queries.
sa.Index(
    "ix_failed_messages_last_modified_id", failed_messages.c.last_modified, failed_messages.c.id
)

STATUS_SORT_KEYS = ("time_sent", "last_failure_at", "message_type", "message_id")
"""The sort columns indexed after the status, ``(status, key, id)`` (migration 0025,
replacing 0004's ``(key, id)``; migration 0027 for the message id, replacing its own
index): a status's page walks its own rows in order, a page of several statuses (or all)
merges one such walk per status. A lookup by message id names every status
(``errors.read.filters.message_id_is``). The message type's index is ``(status,
message_type, last_failure_at, id)`` (``TYPE_TIES``)."""

TYPE_TIES = "last_failure_at"
"""The column that orders equal message types before the id, in the lists' sort by
message type (``errors.read.filters``) and in every index by message type, the group
rows' from their copy (migration 0036): a new failure's entry lands at the end of its
type's range, not at a random place by its random id."""


def _ties(key: str, table: sa.Table) -> list[sa.Column[Any]]:
    """The columns of ``table`` between sort ``key`` and the id in ``key``'s index."""
    return [table.c[TYPE_TIES]] if key == "message_type" else []


for _key in STATUS_SORT_KEYS:
    _column = failed_messages.c[_key]
    sa.Index(
        f"ix_failed_messages_status_{_key}_id",
        failed_messages.c.status,
        _column.asc().nulls_first() if _column.nullable else _column,
        *_ties(_key, failed_messages),
        failed_messages.c.id,
    )

SUBSET_SORT_KEYS = ("time_sent", "last_failure_at")
"""The sort columns an endpoint's or a queue address's page walks its own index of,
``(subset column, key, id)`` (migration 0020); by message type it walks the partial
indexes of migration 0032, ``(subset column, message_type, last_failure_at, id)`` since
0036 (not modelled here: their predicate is each provider's expression,
``errors.read.lists.INDEXED_TYPE_BYTES``); other keys read the subset and sort it."""

QUEUE_ADDRESS_COVERED = "ix_failed_messages_queue_address_lower_time_sent"
"""The index of the lower-cased queue address that holds the address itself too
(PostgreSQL ``INCLUDE``, migration 0029): a queue address's count reads its own entries
alone (an index-only scan of its range), never the plain ``queue_address`` index whole."""

FENCED_SORT_KEYS = ["last_modified", "status"]
"""The columns of a subset's sorts no index walks (read and sorted, fenced), included in
the ``time_sent`` index the subset is read by (PostgreSQL ``INCLUDE``, migration 0031):
the fence reads the subset's sort keys from the index alone once vacuumed."""

SUBSET_INCLUDED = {
    "ix_failed_messages_receiving_endpoint_time_sent": FENCED_SORT_KEYS,
    QUEUE_ADDRESS_COVERED: ["queue_address", *FENCED_SORT_KEYS],
}
"""The columns each subset index includes (PostgreSQL ``INCLUDE``, migrations 0029, 0031)."""

# A subset's sort keys, after the subset's column (migration 0020): an endpoint's or a queue
# address's page walks its own rows in order. They replace the subset columns' own indexes.
for _subset_name, _subset in (
    ("ix_failed_messages_receiving_endpoint", failed_messages.c.receiving_endpoint),
    ("ix_failed_messages_queue_address_lower", sa.func.lower(failed_messages.c.queue_address)),
):
    for _key in SUBSET_SORT_KEYS:
        _column = failed_messages.c[_key]
        _name = f"{_subset_name}_{_key}"
        sa.Index(
            _name,
            _subset,
            _column.asc().nulls_first() if _column.nullable else _column,
            failed_messages.c.id,
            postgresql_include=SUBSET_INCLUDED.get(_name, []),
        )

failed_message_groups = sa.Table(
    "failed_message_groups",
    metadata,
    sa.Column(
        "failed_message_id",
        sa.String(UUID_LEN),
        sa.ForeignKey("failed_messages.id", ondelete="CASCADE"),
        primary_key=True,
    ),
    sa.Column("group_id", sa.String(UUID_LEN), primary_key=True),
    sa.Column("classifier", sa.String(100), nullable=False),
    sa.Column("title", sa.Text, nullable=False),
    # Copies of the message's columns (GROUP_COPIES, migration 0011), equal to the
    # message's in every committed state: the groups views read the group rows alone.
    # The writer inserts them read from the message in the same statement; a row
    # inserted without them gets them from a trigger (NULL only within that statement
    # on SQLite); a change of the message passes them on (trigger; migrations 0011, 0013).
    sa.Column("status", sa.SmallInteger),
    sa.Column("first_failure_at", UtcDateTime),
    sa.Column("last_failure_at", UtcDateTime),
    sa.Column("time_sent", UtcDateTime),  # these four since migration 0020
    sa.Column("last_modified", UtcDateTime),
    sa.Column("message_type", sa.Text),
    sa.Column("message_id", sa.String(400)),
    sa.Index(
        "ix_failed_message_groups_classifier_status_group_id",
        "classifier",
        "status",
        "group_id",
        "last_failure_at",
        "first_failure_at",
    ),
    # A group's rows with or without a status (migration 0014), with the console's
    # ``modified`` included (PostgreSQL, migration 0031): the group's fenced sorts read
    # their keys from the index alone once vacuumed.
    sa.Index(
        "ix_failed_message_groups_group_id_status_first",
        "group_id",
        "status",
        "first_failure_at",
        "failed_message_id",
        postgresql_include=["last_modified"],
    ),
)

GROUP_COPIES = (
    "status",
    "first_failure_at",
    "last_failure_at",
    "time_sent",
    "last_modified",
    "message_type",
    "message_id",
)
"""The columns of ``failed_messages`` each group row carries a copy of (same names)."""

GROUP_SORT_KEYS = ("time_sent", "last_failure_at", "message_type")
"""The sort columns a group's page walks its own index of, ``(group_id, key,
failed_message_id)``: ServicePulse's sorts of a group's messages, ``time_sent``,
``time_of_failure`` (migration 0020) and ``message_type`` (migration 0029; ``(group_id,
message_type, last_failure_at, failed_message_id)`` since 0036, ``TYPE_TIES``); other keys
read the group's rows and sort them."""

# A group's sort keys (migrations 0020, 0029): its page walks its own rows in order.
# Nullable as the message's column is (the copies are NULL only within an insert on SQLite).
for _key in GROUP_SORT_KEYS:
    _column = failed_message_groups.c[_key]
    sa.Index(
        f"ix_failed_message_groups_group_id_{_key}",
        failed_message_groups.c.group_id,
        _column.asc().nulls_first() if failed_messages.c[_key].nullable else _column,
        *_ties(_key, failed_message_groups),
        failed_message_groups.c.failed_message_id,
    )

# Signed counts of group rows per (classifier, group, status), written by the database's
# triggers (migration 0014): a group's count in a status is the SUM of its rows here.
# PostgreSQL appends a row per statement and key (never updating a shared row, so writers
# never wait on a counter); Provider.compact_group_counts folds them, one row per key.
failed_message_group_counts = sa.Table(
    "failed_message_group_counts",
    metadata,
    sa.Column("classifier", sa.String(100), nullable=False),
    sa.Column("group_id", sa.String(UUID_LEN), nullable=False),
    sa.Column("status", sa.SmallInteger, nullable=False),
    sa.Column("n", sa.BigInteger, nullable=False),
    sa.Index(
        "ix_failed_message_group_counts_classifier_status", "classifier", "status", "group_id"
    ),
    sa.Index("ix_failed_message_group_counts_group_id_status", "group_id", "status"),
)


# Failures per (group, hour): ``hour`` counts whole hours since 1970-01-01 UTC of a
# failure's time. Written by the database's triggers when a group row is inserted with
# its failure time (migration 0022); PostgreSQL appends a row per statement and key and
# Provider.compact_group_counts folds them (one row per key) and drops old hours.
failed_message_group_hours = sa.Table(
    "failed_message_group_hours",
    metadata,
    sa.Column("group_id", sa.String(UUID_LEN), nullable=False),
    sa.Column("hour", sa.BigInteger, nullable=False),
    sa.Column("n", sa.BigInteger, nullable=False),
    sa.Index("ix_failed_message_group_hours_group_id_hour", "group_id", "hour"),
    sa.Index("ix_failed_message_group_hours_hour", "hour"),
)

GROUP_HOURS_KEPT = 48
"""Hours of failures kept per group (migration 0022): the groups views' last day and the
day before it."""


# How many failed messages share a key of the columns the summary and the counts group
# by (migration 0012; docs/decisions.md "The database keeps the counts"): kept by the database's
# triggers on failed_messages in the transaction that changes a message, never written by the
# application. A key's count is its tally plus its deltas (errors.tallies). The key's index is an
# expression index the migrations create (not modelled here): unique, NULL as one value, on SQLite
# (0012); on PostgreSQL over a digest of the key (0015: a key may be longer than a btree index row),
# its fold keeping one row per key.
def _tally_columns() -> list[sa.Column[object]]:
    return [
        sa.Column("status", sa.SmallInteger, nullable=False),
        sa.Column("is_system_message", sa.Boolean, nullable=False),
        sa.Column("receiving_endpoint", sa.String(400), nullable=False),
        sa.Column("receiving_host_id", sa.String(100)),
        sa.Column("receiving_host", sa.String(400)),
        sa.Column("message_type", sa.Text),
        sa.Column("messages", sa.BigInteger, nullable=False),
    ]


failed_message_tallies = sa.Table("failed_message_tallies", metadata, *_tally_columns())

# Changes of the tallies not folded in yet: appended by PostgreSQL's statement triggers
# (so concurrent writers share no row), folded by Provider.compact_tallies; SQLite's
# triggers write the tallies directly and leave this table empty.
failed_message_tally_deltas = sa.Table("failed_message_tally_deltas", metadata, *_tally_columns())

# An operator's note on a failure group (migration 0003). Keyed by group id alone: groups
# exist only as rows of failed_message_groups, so there is nothing to reference.
failed_message_group_comments = sa.Table(
    "failed_message_group_comments",
    metadata,
    sa.Column("group_id", sa.String(UUID_LEN), primary_key=True),
    sa.Column("comment", sa.Text, nullable=False),
    sa.Column("updated_at", UtcDateTime, nullable=False),
)

# ServiceControl's message redirects (migration 0007): retries of messages that failed in
# from_physical_address are sent to to_physical_address. id = the deterministic id of the
# from-address (ServiceControl's MessageRedirectId).
message_redirects = sa.Table(
    "message_redirects",
    metadata,
    sa.Column("id", sa.String(UUID_LEN), primary_key=True),
    sa.Column("from_physical_address", sa.String(400), nullable=False, unique=True),
    sa.Column("to_physical_address", sa.String(400), nullable=False),
    sa.Column("last_modified", UtcDateTime, nullable=False),
)

known_endpoints = sa.Table(
    "known_endpoints",
    metadata,
    sa.Column("id", sa.String(UUID_LEN), primary_key=True),
    sa.Column("name", sa.String(400), nullable=False),
    sa.Column("host_id", sa.String(100), nullable=False),
    sa.Column("host", sa.String(400)),
    sa.Column("monitored", sa.Boolean, nullable=False, comment="the user's choice"),
    sa.Column("first_seen_at", UtcDateTime, nullable=False),
)

retry_batches = sa.Table(
    "retry_batches",
    metadata,
    sa.Column("id", sa.String(UUID_LEN), primary_key=True),
    sa.Column("request_id", sa.String(400), nullable=False),
    sa.Column("retry_type", sa.String(50), nullable=False),
    sa.Column("status", sa.String(20), nullable=False),
    sa.Column("originator", sa.Text),
    sa.Column("classifier", sa.String(100)),
    sa.Column("initial_batch_size", sa.Integer, nullable=False),
    sa.Column("started_at", UtcDateTime, nullable=False),
    sa.Column("last_modified", UtcDateTime, nullable=False),
    sa.Column("completed_at", UtcDateTime),
    sa.Index("ix_retry_batches_status", "status"),
)

failed_message_retries = sa.Table(
    "failed_message_retries",
    metadata,
    sa.Column("failed_message_id", sa.String(UUID_LEN), primary_key=True),
    sa.Column(
        "retry_batch_id",
        sa.String(UUID_LEN),
        sa.ForeignKey("retry_batches.id", ondelete="CASCADE"),
        nullable=False,
    ),
    sa.Column("stage_attempts", sa.Integer, nullable=False, server_default="0"),
    # Set when the batch is staged: what this retry attempt sends, and where (migration 0002).
    sa.Column(
        "attempt_message_id", sa.String(UUID_LEN), comment="ServiceControl.Retry.Attempt.MessageId"
    ),
    sa.Column("destination", sa.String(400), comment="address the retry is sent to"),
    sa.Column("sent_at", UtcDateTime, comment="when the broker confirmed the send"),
    # A window's sends are under way until then: no other process sends it (migration 0035).
    sa.Column("in_flight_until", UtcDateTime, comment="a window's sends are under way until then"),
    sa.Index("ix_failed_message_retries_retry_batch_id", "retry_batch_id"),
)

# One retry request of an operator (migration 0002). Its batches carry its id in
# retry_batches.request_id; the counts are kept up to date as batches progress.
retry_operations = sa.Table(
    "retry_operations",
    metadata,
    sa.Column("id", sa.String(UUID_LEN), primary_key=True),
    sa.Column("retry_type", sa.String(50), nullable=False, comment="ServiceControl's RetryType"),
    sa.Column("target", sa.String(400), comment="group id, queue address, endpoint or message id"),
    sa.Column("originator", sa.Text),
    sa.Column("classifier", sa.String(100)),
    sa.Column("message_count", sa.Integer, nullable=False, comment="messages claimed"),
    sa.Column(
        "forwarded_count", sa.Integer, nullable=False, comment="sent, confirmed by the broker"
    ),
    sa.Column("skipped_count", sa.Integer, nullable=False, comment="claimed, then not sent"),
    sa.Column("failed", sa.Boolean, nullable=False, comment="a message could not be sent"),
    sa.Column("acknowledged", sa.Boolean, nullable=False, comment="the operator dismissed it"),
    sa.Column("started_at", UtcDateTime, nullable=False),
    sa.Column("last_modified", UtcDateTime, nullable=False),
    sa.Column("prepared_at", UtcDateTime, comment="every batch of the request exists"),
    sa.Column("completed_at", UtcDateTime),
    sa.Column("failure_reason", sa.Text, comment="why messages were given up (migration 0006)"),
    sa.Index("ix_retry_operations_target_retry_type", "target", "retry_type"),
    sa.Index("ix_retry_operations_completed_at", "completed_at"),
)

# The failed messages a retry operation claimed, written with its claims (migration 0034):
# its outcome counts those that failed again since it started, wherever they are now
# (docs/decisions.md "A retry's outcome counts the failures since"). The rows go with
# their operation (the retention sweep's purge of completed operations).
retry_operation_messages = sa.Table(
    "retry_operation_messages",
    metadata,
    sa.Column("operation_id", sa.String(UUID_LEN), primary_key=True),
    sa.Column("failed_message_id", sa.String(UUID_LEN), primary_key=True),
)

# A time-limited lease of a background singleton, for providers without server-side
# locks (db.leases.LeaseRow); migration 0002.
service_leases = sa.Table(
    "service_leases",
    metadata,
    sa.Column("name", sa.String(100), primary_key=True),
    sa.Column("owner", sa.String(100), nullable=False),
    sa.Column("expires_at", UtcDateTime, nullable=False),
)

failed_error_imports = sa.Table(
    "failed_error_imports",
    metadata,
    sa.Column("id", sa.String(UUID_LEN), primary_key=True, comment="hash of headers + body"),
    sa.Column("queue", sa.String(400), nullable=False),
    sa.Column("headers_json", sa.Text, nullable=False),
    sa.Column("body", sa.LargeBinary, nullable=False),
    sa.Column("reason", sa.Text, nullable=False),
    sa.Column("failed_at", UtcDateTime, nullable=False),
)


# --- site call audit (migration 0005) ------------------------------------------------------
# Widths are characters (docs/design.md "site_calls"), defined by the telemetry
# contract (``controlroom.telemetry.widths``), which refuses a value longer than its column
# before it reaches the store, on every provider.
# A site's stamp is two columns (migration 0017, ``telemetry.stamps``): ``<name>_utc``, the
# instant to the microsecond every index, filter and KPI reads, and ``<name>_tick``, the
# 100 ns past it (0-9), which the ordering, the cursor and the API read with it.


def tick_column(name: str) -> sa.Column[int]:
    """The 100 ns part of the stamp ``{name}_utc``: ``{name}_tick``, 0-9 (0 without one)."""
    return sa.Column(
        f"{name}_tick",
        sa.SmallInteger,
        nullable=False,
        server_default="0",
        comment=f"100 ns past {name}_utc's microsecond, 0-9",
    )


site_calls = sa.Table(
    "site_calls",
    metadata,
    sa.Column("tracked_operation_id", sa.String(UUID_LEN), primary_key=True),
    sa.Column(
        "channel", sa.String(CHANNEL_WIDTH), nullable=False, comment="ApiOutbound | DbOutbound"
    ),
    sa.Column("target", sa.String(TARGET_WIDTH), nullable=False),
    sa.Column("source_site", sa.String(SITE_WIDTH), nullable=False),
    sa.Column("source_node", sa.String(NODE_WIDTH)),
    sa.Column("status", sa.String(STATUS_WIDTH), nullable=False),
    sa.Column("retry_count", sa.Integer, nullable=False),
    sa.Column("last_error", sa.String(LAST_ERROR_WIDTH)),
    sa.Column("http_status", sa.Integer),
    sa.Column("created_at_utc", UtcDateTime, nullable=False),
    sa.Column("updated_at_utc", UtcDateTime, nullable=False),
    sa.Column("terminal_at_utc", UtcDateTime),
    sa.Column("ingested_at_utc", UtcDateTime, nullable=False),
    sa.Column("epoch", sa.Integer, nullable=False),
    tick_column("created_at"),
    tick_column("updated_at"),
    tick_column("terminal_at"),
)

# How many non-terminal site calls share a (source_site, source_node, status): signed
# counts kept by the database's triggers on site_calls in the transaction that changes a
# call (migration 0028; docs/decisions.md "The database keeps the counts"), never written
# by the application. A key's count is the SUM of its rows: PostgreSQL appends a row per
# statement and key (writers never wait on a counter), Provider.compact_counts folds them
# to one per key; SQLite's row triggers keep one row per key.
site_call_counts = sa.Table(
    "site_call_counts",
    metadata,
    sa.Column("source_site", sa.String(SITE_WIDTH), nullable=False),
    sa.Column("source_node", sa.String(NODE_WIDTH)),
    sa.Column("status", sa.String(STATUS_WIDTH), nullable=False),
    sa.Column("n", sa.BigInteger, nullable=False),
    sa.Index("ix_site_call_counts_key", "source_site", "source_node", "status"),
)

audit_log = sa.Table(
    "audit_log",
    metadata,
    sa.Column("event_id", sa.String(UUID_LEN), primary_key=True),
    sa.Column("occurred_at_utc", UtcDateTime, nullable=False),
    sa.Column("ingested_at_utc", UtcDateTime, nullable=False),
    sa.Column("actor", sa.String(ACTOR_WIDTH), nullable=False),
    sa.Column("action", sa.String(ACTION_WIDTH), nullable=False),
    sa.Column(
        "outcome", sa.String(OUTCOME_WIDTH), nullable=False, comment="Success | Failure | Denied"
    ),
    sa.Column("category", sa.String(CATEGORY_WIDTH), nullable=False),
    sa.Column("target", sa.String(TARGET_WIDTH)),
    sa.Column("source_site", sa.String(SITE_WIDTH)),
    sa.Column("source_node", sa.String(NODE_WIDTH)),
    sa.Column("correlation_id", sa.String(UUID_LEN)),
    sa.Column("details_json", sa.Text),
    sa.Column("payload_truncated", sa.Boolean, nullable=False),
    tick_column("occurred_at"),
    # The hash chain (migration 0019, db.audit_chain): the event's month chain
    # (yyyymm of occurred_at_utc), its place in it and its link hash (hex SHA-256).
    sa.Column("chain_month", sa.Integer),
    sa.Column("chain_seq", sa.BigInteger),
    sa.Column("chain_hash", sa.String(64)),
)

# One row (id 1): the shortest audit retention the purge honours, whatever its caller asks
# (migration 0019). Written by `controlroom migrate`; on PostgreSQL only the owner can.
audit_log_policy = sa.Table(
    "audit_log_policy",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("min_retention_days", sa.Integer, nullable=False),
)

# One row per `controlroom audit verify`: what it found (the console's badge), and the
# chains' heads an intact walk saw (the next walk checks each chain still reaches them).
audit_verifications = sa.Table(
    "audit_verifications",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("verified_at_utc", UtcDateTime, nullable=False),
    sa.Column("intact", sa.Boolean, nullable=False),
    sa.Column("events", sa.BigInteger, nullable=False),
    sa.Column("chains", sa.Integer, nullable=False),
    sa.Column("broken_event_id", sa.String(UUID_LEN)),
    sa.Column("reason", sa.Text),
    sa.Column("heads_json", sa.Text, comment="month: [place, hash]"),
)

# A packet the contract or the store refused, kept whole (the bytes as received). A
# notification refused (docs/design.md "Rejected notifications") is kept here too, its
# source starting with REJECTED_NOTIFICATION_SOURCE: one retention, one purge, one list.
REJECTED_NOTIFICATION_SOURCE = "notification:"
rejected_telemetry = sa.Table(
    "rejected_telemetry",
    metadata,
    sa.Column("id", sa.String(UUID_LEN), primary_key=True, comment="hash of the packet"),
    sa.Column("source", sa.String(300), nullable=False, comment="queue name or 'http'"),
    sa.Column("packet", sa.LargeBinary, nullable=False),
    sa.Column("reason", sa.Text, nullable=False),
    sa.Column("rejected_at_utc", UtcDateTime, nullable=False),
)

kpi_samples = sa.Table(
    "kpi_samples",
    metadata,
    sa.Column("source", sa.String(32), primary_key=True),
    sa.Column("metric", sa.String(64), primary_key=True),
    sa.Column("scope", sa.String(16), primary_key=True, comment="global | site | node"),
    sa.Column("scope_key", sa.String(200), primary_key=True, comment="'' | site | site/node"),
    sa.Column("captured_at_utc", UtcDateTime, primary_key=True),
    sa.Column("value", sa.Float, nullable=False),
)


# --- site reconciliation (migration 0010) --------------------------------------------------
# One row per configured site: its persisted composite pull cursor and what the last pass
# saw (docs/design.md "Reconciliation"). Rows are created on a site's first pass.
site_reconciliation = sa.Table(
    "site_reconciliation",
    metadata,
    sa.Column("site_id", sa.String(SITE_WIDTH), primary_key=True),
    sa.Column("cursor_updated_at_utc", UtcDateTime, comment="last row pulled: its stamp"),
    sa.Column("cursor_tracked_operation_id", sa.String(UUID_LEN), comment="and its id"),
    sa.Column("last_pull_at_utc", UtcDateTime, comment="when the last pass ended"),
    sa.Column("last_success_at_utc", UtcDateTime),
    sa.Column("last_error", sa.Text, comment="null after a pass that succeeded"),
    sa.Column("reachable", sa.Boolean, nullable=False, comment="its last pass succeeded"),
    sa.Column("pinned", sa.Boolean, nullable=False),
    sa.Column("pinned_changed_at_utc", UtcDateTime, comment="last latch or unlatch"),
    sa.Column("rows_pulled", sa.BigInteger, nullable=False, comment="over every pass"),
    tick_column("cursor_updated_at"),
)

# --- purged site calls (migration 0018) ----------------------------------------------------
# The id and terminal stamp of each site call the retention purge deleted, written in the
# purge's transaction and kept ``sitecalls.tombstone_days`` after it (so at least that long
# beyond retention), so a late packet of a purged call is rejected instead of bringing it
# back (docs/design.md "Site call retention").
site_call_tombstones = sa.Table(
    "site_call_tombstones",
    metadata,
    sa.Column("tracked_operation_id", sa.String(UUID_LEN), primary_key=True),
    sa.Column("terminal_at_utc", UtcDateTime, nullable=False),
    tick_column("terminal_at"),
    sa.Column("purged_at_utc", UtcDateTime, nullable=False),
    sa.Index("ix_site_call_tombstones_purged_at_utc", "purged_at_utc"),
)

# Messages whose external bodies wait to be deleted (migration 0006). The sweeper adds one
# row per failed message it deletes, in the same transaction; the body collector deletes
# the files while it holds the row, and the writer deletes the row of every message it
# stores an external body for, so the two never act on one message at the same time.
body_deletions = sa.Table(
    "body_deletions",
    metadata,
    sa.Column("failed_message_id", sa.String(UUID_LEN), primary_key=True),
    sa.Column("requested_at", UtcDateTime, nullable=False),
)

# What happened, for operators (migration 0006): ServiceControl's event log items.
# ``related_to`` is a JSON list of ServiceControl-style paths ("/message/<id>").
event_log_items = sa.Table(
    "event_log_items",
    metadata,
    sa.Column("id", sa.String(UUID_LEN), primary_key=True),
    sa.Column("description", sa.Text, nullable=False),
    sa.Column("severity", sa.String(20), nullable=False, comment="info | warning | error"),
    sa.Column("category", sa.String(100), nullable=False),
    sa.Column("event_type", sa.String(100), nullable=False),
    sa.Column("related_to_json", sa.Text, nullable=False, comment="JSON list of strings"),
    sa.Column("raised_at", UtcDateTime, nullable=False),
    sa.Index("ix_event_log_items_raised_at", "raised_at"),
)

# --- notification outbox (migrations 0023, 0024) --------------------------------------------
# One row per notification (docs/design.md "Notification outbox"). ``payload`` is a
# webhook's body as sent, serialised once at enqueue; ``delivered_to`` the JSON list of the
# recipients an e-mail reached so far; ``recipients`` the JSON list of the addresses a
# site named instead of a recipient list (``target`` then their label); ``claim_token``
# the dispatcher's claim of a row it is sending (its ``next_attempt_at_utc`` then says
# when the claim lapses). On SQLite the
# migration adds a CHECK per bounded column.
notifications = sa.Table(
    "notifications",
    metadata,
    sa.Column("notification_id", sa.String(UUID_LEN), primary_key=True),
    sa.Column("source", sa.String(NOTIFICATION_SOURCE_WIDTH), nullable=False),
    sa.Column("channel", sa.String(16), nullable=False, comment="Email | Webhook"),
    sa.Column("target", sa.String(TARGET_WIDTH), nullable=False),
    sa.Column("subject", sa.String(SUBJECT_WIDTH), nullable=False),
    sa.Column("body", sa.Text, nullable=False),
    sa.Column("severity", sa.String(16), nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("retry_count", sa.Integer, nullable=False),
    sa.Column("last_error", sa.String(LAST_ERROR_WIDTH)),
    sa.Column("reply_code", sa.Integer, comment="HTTP status or SMTP reply code"),
    sa.Column("created_at_utc", UtcDateTime, nullable=False),
    sa.Column("updated_at_utc", UtcDateTime, nullable=False),
    sa.Column("next_attempt_at_utc", UtcDateTime),
    sa.Column("terminal_at_utc", UtcDateTime),
    sa.Column("source_event_id", sa.String(SOURCE_EVENT_ID_WIDTH)),
    sa.Column("payload", sa.Text),
    sa.Column("delivered_to", sa.Text),
    sa.Column("claim_token", sa.String(UUID_LEN)),
    sa.Column("event_count", sa.Integer, comment="events a rule coalesced into it"),
    sa.Column("recipients", sa.Text, comment="JSON list of explicit addresses"),
    # A rule's notification of failure groups (migration 0030): its window and each
    # group's failed messages in it, counted at its first claim (notifications.rules).
    sa.Column(
        "failure_groups",
        sa.Text,
        comment="JSON: the window and its failure groups' failed messages",
    ),
    sa.Index("ix_notifications_next_attempt_at_utc", "next_attempt_at_utc"),
    sa.Index("ix_notifications_created_at_utc", "created_at_utc", "notification_id"),
    sa.Index("ix_notifications_status", "status", "created_at_utc", "notification_id"),
    sa.Index("ix_notifications_terminal_at_utc", "terminal_at_utc"),
    sa.Index("uq_notifications_source_source_event_id", "source", "source_event_id", unique=True),
)
