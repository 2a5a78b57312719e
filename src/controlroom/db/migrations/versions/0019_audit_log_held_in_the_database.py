"""audit log held in the database: hash chains, a retention floor, owner-held purge

A hash chain per month, a retention floor, and purge and partitions through the owner's
functions.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-04 06:00:00.000000

Source: docs/design.md "Audit log". Migration 0005's append-only trigger held only for
the polite: any session could set ``controlroom.audit_purge`` and delete, TRUNCATE of a
month partition skipped the parent's trigger, and on SQLite any connection could insert
a purge permit.

- Every event carries ``chain_month`` (yyyymm of ``occurred_at_utc``), ``chain_seq`` (its
  place in that month's chain) and ``chain_hash`` (``db.audit_chain``); events
  already stored are chained here, in (``occurred_at_utc``, ``event_id``) order, with a
  frozen copy of the hash (migrations never run live code). The columns stay nullable
  (SQLite cannot add NOT NULL ones to a table with rows); ``audit verify`` reports an
  empty one as a break.
- ``audit_log_policy`` holds the shortest retention any purge honours (1 day here;
  ``controlroom migrate`` writes ``audit.retention_days``).
- ``audit_verifications`` keeps what each ``controlroom audit verify`` found, and the
  chains' heads it saw (the next verify checks that each chain still reaches its head).
- PostgreSQL: the trigger lets a DELETE through only for the table's owner with the
  purge setting on, which only the owner's functions set. ``audit_log_purge`` and
  ``audit_log_prepare_partitions`` run as their owner (``SECURITY DEFINER``, pinned
  ``search_path``) and compute everything from the server's clock and the policy: the
  purge removes whole months before ``now - max(retention_days, floor)`` and nothing
  else. ``EXECUTE`` is revoked from PUBLIC; ``controlroom migrate`` grants it to the
  service role.
- SQLite: the DELETE trigger also refuses a row whose month is not wholly past the
  policy's retention, permit or not.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from alembic import op

from controlroom.db.migrations._dialects import migrating, unsupported

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None

# A frozen copy of db.audit_chain as it was (the encoding of a stored event never
# changes).
GENESIS = "0" * 64
CHAINED_FIELDS = (
    "event_id",
    "occurred_at_utc",
    "occurred_at_tick",
    "ingested_at_utc",
    "actor",
    "action",
    "outcome",
    "category",
    "target",
    "source_site",
    "source_node",
    "correlation_id",
    "details_json",
    "payload_truncated",
    "chain_month",
    "chain_seq",
)
CHAIN_INDEX = "ix_audit_log_chain_month_chain_seq"
# Stored types of the columns the hash reads that are not text (read back as the live
# code reads them: naive UTC instants, booleans).
_TYPES: dict[str, Any] = {
    "occurred_at_utc": sa.DateTime(),
    "occurred_at_tick": sa.SmallInteger(),
    "ingested_at_utc": sa.DateTime(),
    "payload_truncated": sa.Boolean(),
}


def _link_hash(previous: str, row: dict[str, Any]) -> str:
    values = [
        value.isoformat(timespec="microseconds") if isinstance(value, datetime) else value
        for value in (row[name] for name in CHAINED_FIELDS)
    ]
    encoded = json.dumps(values, ensure_ascii=False, separators=(",", ":")).encode()
    return hashlib.sha256(previous.encode() + encoded).hexdigest()


def upgrade() -> None:
    dialect = migrating(revision)
    op.add_column("audit_log", sa.Column("chain_month", sa.Integer(), nullable=True))
    op.add_column("audit_log", sa.Column("chain_seq", sa.BigInteger(), nullable=True))
    op.add_column("audit_log", sa.Column("chain_hash", sa.String(64), nullable=True))
    op.create_table(
        "audit_log_policy",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("min_retention_days", sa.Integer(), nullable=False),
        sa.CheckConstraint("id = 1", name="ck_audit_log_policy_one_row"),
        sa.CheckConstraint("min_retention_days >= 1", name="ck_audit_log_policy_days"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audit_log_policy")),
    )
    op.execute("INSERT INTO audit_log_policy (id, min_retention_days) VALUES (1, 1)")
    op.create_table(
        "audit_verifications",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("verified_at_utc", sa.DateTime(), nullable=False),
        sa.Column("intact", sa.Boolean(), nullable=False),
        sa.Column("events", sa.BigInteger(), nullable=False),
        sa.Column("chains", sa.Integer(), nullable=False),
        sa.Column("broken_event_id", sa.String(36), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("heads_json", sa.Text(), nullable=True, comment="month: [place, hash]"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audit_verifications")),
    )
    if dialect == "postgresql":
        schema = op.get_bind().exec_driver_sql("SELECT current_schema()").scalar_one()
        op.execute("DROP TRIGGER audit_log_append_only ON audit_log")
        _chain_stored_events()
        op.create_index(CHAIN_INDEX, "audit_log", ["chain_month", "chain_seq"])
        _create_postgresql_guard(schema)
    elif dialect == "sqlite":
        op.execute("DROP TRIGGER audit_log_no_update")
        _chain_stored_events()
        op.create_index(CHAIN_INDEX, "audit_log", ["chain_month", "chain_seq"], unique=True)
        op.execute(
            "CREATE TRIGGER audit_log_no_update BEFORE UPDATE ON audit_log BEGIN "
            "SELECT RAISE(ABORT, 'audit_log is append-only: UPDATE refused'); END"
        )
        op.execute("DROP TRIGGER audit_log_no_delete")
        # Stored instants are 'YYYY-MM-DD HH:MM:SS.ffffff' (naive UTC): one before the
        # text 'YYYY-MM-01' of the first month kept sorts before it.
        op.execute(
            "CREATE TRIGGER audit_log_no_delete BEFORE DELETE ON audit_log "
            "WHEN NOT EXISTS (SELECT 1 FROM audit_purge_permits) "
            "OR OLD.occurred_at_utc >= strftime('%Y-%m-01', 'now', '-' || "
            "(SELECT coalesce(max(min_retention_days), 1) FROM audit_log_policy) || ' days') "
            "BEGIN SELECT RAISE(ABORT, 'audit_log is append-only: DELETE refused (only the "
            "purge deletes, and only whole months past retention)'); END"
        )
    else:
        unsupported(dialect, revision)


def downgrade() -> None:
    dialect = migrating(revision)
    if dialect == "postgresql":
        op.execute("DROP FUNCTION audit_log_purge(integer, integer)")
        op.execute("DROP FUNCTION audit_log_prepare_partitions()")
        op.execute(
            "CREATE OR REPLACE FUNCTION audit_log_append_only() RETURNS trigger "
            "LANGUAGE plpgsql AS $$ BEGIN "
            "IF TG_OP = 'DELETE' AND current_setting('controlroom.audit_purge', true) = 'on' "
            "THEN RETURN OLD; END IF; "
            "RAISE EXCEPTION 'audit_log is append-only: % refused', TG_OP "
            "USING ERRCODE = 'insufficient_privilege'; "
            "END $$"
        )
        op.execute("ALTER FUNCTION audit_log_append_only() RESET search_path")
    elif dialect == "sqlite":
        op.execute("DROP TRIGGER audit_log_no_delete")
        op.execute(
            "CREATE TRIGGER audit_log_no_delete BEFORE DELETE ON audit_log "
            "WHEN NOT EXISTS (SELECT 1 FROM audit_purge_permits) BEGIN "
            "SELECT RAISE(ABORT, 'audit_log is append-only: DELETE refused'); END"
        )
    else:
        unsupported(dialect, revision)
    op.drop_index(CHAIN_INDEX, "audit_log")
    op.drop_table("audit_verifications")
    op.drop_table("audit_log_policy")
    for column in ("chain_hash", "chain_seq", "chain_month"):
        op.drop_column("audit_log", column)


def _chain_stored_events() -> None:
    """Chain the events stored so far, month by month in (occurred_at_utc, event_id)
    order, with the append-only UPDATE trigger dropped by the caller."""
    columns = [
        sa.column(name, _TYPES.get(name))
        for name in CHAINED_FIELDS
        if not name.startswith("chain_")
    ]
    events = sa.table("audit_log", *columns)
    bind = op.get_bind()
    rows = bind.execute(
        sa.select(*columns).order_by(events.c.occurred_at_utc, events.c.event_id)
    ).mappings()
    heads: dict[int, tuple[int, str]] = {}
    updates = []
    for stored in rows:
        row = dict(stored)
        month = row["occurred_at_utc"].year * 100 + row["occurred_at_utc"].month
        seq, previous = heads.get(month, (0, GENESIS))
        row.update(chain_month=month, chain_seq=seq + 1)
        row["chain_hash"] = _link_hash(previous, row)
        heads[month] = (seq + 1, row["chain_hash"])
        updates.append(
            {"id": row["event_id"], "month": month, "seq": seq + 1, "hash": row["chain_hash"]}
        )
    if updates:
        bind.execute(
            sa.text(
                "UPDATE audit_log SET chain_month = :month, chain_seq = :seq, "
                "chain_hash = :hash WHERE event_id = :id"
            ),
            updates,
        )


def _create_postgresql_guard(schema: str) -> None:
    pinned = f"SET search_path = {_quoted(schema)}, pg_catalog, pg_temp"
    # DELETE only by the table's owner with the purge setting on: a role granted DML
    # would pass the privilege check, and anyone can set a custom setting.
    op.execute(
        "CREATE OR REPLACE FUNCTION audit_log_append_only() RETURNS trigger "
        f"LANGUAGE plpgsql {pinned} AS $$ BEGIN "
        "IF TG_OP = 'DELETE' AND current_setting('controlroom.audit_purge', true) = 'on' "
        "AND current_user = (SELECT pg_get_userbyid(relowner) FROM pg_class "
        "WHERE oid = 'audit_log'::regclass) "
        "THEN RETURN OLD; END IF; "
        "RAISE EXCEPTION 'audit_log is append-only: % refused', TG_OP "
        "USING ERRCODE = 'insufficient_privilege'; "
        "END $$"
    )
    op.execute(
        "CREATE TRIGGER audit_log_append_only BEFORE UPDATE OR DELETE ON audit_log "
        "FOR EACH ROW EXECUTE FUNCTION audit_log_append_only()"
    )
    # The month partitions of now and the two months ahead (a month whose events already
    # sit in the default partition cannot get one: PostgreSQL refuses, and it is warned).
    op.execute(
        "CREATE FUNCTION audit_log_prepare_partitions() RETURNS integer "
        f"LANGUAGE plpgsql SECURITY DEFINER {pinned} AS $$ "
        "DECLARE month_start timestamp; part text; made integer := 0; "
        "BEGIN "
        "FOR ahead IN 0..2 LOOP "
        "month_start := date_trunc('month', now() AT TIME ZONE 'UTC') "
        "+ make_interval(months => ahead); "
        "part := 'audit_log_p' || to_char(month_start, 'YYYYMM'); "
        "IF to_regclass(part) IS NULL THEN "
        "BEGIN "
        "EXECUTE format('CREATE TABLE %I PARTITION OF audit_log FOR VALUES FROM (%L) TO (%L)', "
        "part, month_start, month_start + interval '1 month'); "
        "made := made + 1; "
        "EXCEPTION WHEN others THEN "
        "RAISE WARNING 'audit log partition % not created: %', part, SQLERRM; "
        "END; "
        "END IF; "
        "END LOOP; "
        "RETURN made; "
        "END $$"
    )
    # Whole months before the first month kept: month partitions dropped, the default
    # partition's events deleted in chain order (at most max_rows per call: a month cut
    # short lacks only its first events), with their claims.
    op.execute(
        "CREATE FUNCTION audit_log_purge(retention_days integer, max_rows integer) "
        "RETURNS TABLE (purged bigint, purged_from_default bigint, kept_from timestamp) "
        f"LANGUAGE plpgsql SECURITY DEFINER {pinned} AS $$ "
        "DECLARE floor_days integer; part text; month_start timestamp; n bigint; "
        "BEGIN "
        "SELECT min_retention_days INTO floor_days FROM audit_log_policy WHERE id = 1; "
        "kept_from := date_trunc('month', now() AT TIME ZONE 'UTC' - make_interval(days => "
        "greatest(retention_days, coalesce(floor_days, 1)))); "
        "purged := 0; "
        "FOR part IN SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
        "WHERE i.inhparent = 'audit_log'::regclass AND c.relname ~ '^audit_log_p[0-9]{6}$' "
        "ORDER BY 1 LOOP "
        "month_start := make_timestamp(substr(part, 12, 4)::int, substr(part, 16, 2)::int, "
        "1, 0, 0, 0); "
        "IF month_start + interval '1 month' <= kept_from THEN "
        "EXECUTE format('SELECT count(*) FROM %I', part) INTO n; "
        "EXECUTE format('DROP TABLE %I', part); "
        "DELETE FROM audit_event_ids WHERE occurred_at_utc >= month_start "
        "AND occurred_at_utc < month_start + interval '1 month'; "
        "purged := purged + n; "
        "END IF; "
        "END LOOP; "
        "PERFORM set_config('controlroom.audit_purge', 'on', true); "
        "WITH gone AS (DELETE FROM audit_log_default WHERE event_id IN ("
        "SELECT event_id FROM audit_log_default WHERE occurred_at_utc < kept_from "
        "ORDER BY chain_month, chain_seq LIMIT greatest(max_rows, 1)) RETURNING event_id), "
        "claims AS (DELETE FROM audit_event_ids WHERE event_id IN (SELECT event_id FROM gone)) "
        "SELECT count(*) INTO purged_from_default FROM gone; "
        "PERFORM set_config('controlroom.audit_purge', 'off', true); "
        "purged := purged + purged_from_default; "
        "RETURN NEXT; "
        "END $$"
    )
    for function in ("audit_log_prepare_partitions()", "audit_log_purge(integer, integer)"):
        op.execute(f"REVOKE EXECUTE ON FUNCTION {function} FROM PUBLIC")


def _quoted(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'
