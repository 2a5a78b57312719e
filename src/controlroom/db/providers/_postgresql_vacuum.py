"""What PostgreSQL's autovacuum settings cost the store (docs/decisions.md "The counter
tables are vacuumed as they turn over").

Every drain of the error queue deletes and updates rows of the counter tables far faster
than it adds live ones (deltas appended then folded, counts rewritten, tallies updated):
only vacuum makes that space reusable. With autovacuum off, server-wide or for one of
these tables, they fill with dead rows, and the pages, counts and groups views that read
them slow down with every failure stored.
"""

from __future__ import annotations

import sqlalchemy as sa

VACUUMED_TABLES = (
    "failed_messages",
    "failed_message_groups",
    "failed_message_group_counts",
    "failed_message_tally_deltas",
    "failed_message_tallies",
    "site_call_counts",
)
"""The tables a drain rewrites, whose autovacuum the store needs (the site-call counts
turn over with every fold of telemetry's writes, migration 0028)."""

COST = (
    "the rows every drain deletes and updates stay as dead rows in the counter tables "
    "(failed_message_group_counts, failed_message_tally_deltas, failed_message_tallies, "
    "failed_message_groups, site_call_counts) until a VACUUM, so they grow and the messages, "
    "counts and groups pages and the site-call KPIs that read them get slower with every "
    "failure or call stored; and nothing analyzes the tables, so the planner keeps the "
    "statistics of the store as it was: searches are planned for it, and their estimated "
    "counts (beyond exact_count_limit) are far off"
)
ADVICE = 'turn it on, or run VACUUM ANALYZE on a schedule (README, "What the store needs")'


def vacuum_warnings(conn: sa.Connection) -> list[str]:
    """Sentences, one per problem: the server's ``autovacuum`` (or ``track_counts``,
    without which autovacuum never starts) is off, or ``autovacuum_enabled`` is false on
    one of ``VACUUMED_TABLES`` (its reloptions). Empty when autovacuum runs on all of
    them. Reads settings and ``pg_class`` only; any user may."""
    autovacuum, track_counts = conn.execute(
        sa.text("SELECT current_setting('autovacuum'), current_setting('track_counts')")
    ).one()
    warnings = []
    if autovacuum != "on":
        warnings.append(f"autovacuum is off on the store's PostgreSQL server: {COST}; {ADVICE}")
    elif track_counts != "on":
        warnings.append(
            f"track_counts is off on the store's PostgreSQL server, so autovacuum never "
            f"starts: {COST}; turn track_counts on"
        )
    disabled = conn.execute(
        sa.text(
            "SELECT c.relname FROM pg_class c "
            "CROSS JOIN LATERAL pg_options_to_table(c.reloptions) o "
            "WHERE c.oid IN (SELECT to_regclass(t) FROM unnest(CAST(:tables AS text[])) t) "
            "AND o.option_name = 'autovacuum_enabled' AND NOT CAST(o.option_value AS boolean) "
            "ORDER BY c.relname"
        ),
        {"tables": list(VACUUMED_TABLES)},
    ).scalars()
    warnings += [
        f"autovacuum is disabled for table {table} (autovacuum_enabled = false): {COST}; "
        f"ALTER TABLE {table} RESET (autovacuum_enabled)"
        for table in disabled
    ]
    return warnings
