"""PostgreSQL roles: the service role that may only insert into and read the audit log.

``controlroom migrate``, connected as the schema's owner, makes ``serve``'s database user
a member of ``<database>_service``, a role without login that holds every grant the
service needs: the usual DML on every table but the audit log's, ``SELECT`` and
``INSERT`` alone on ``audit_log`` and ``audit_event_ids``, nothing on the month partitions
(rows reach them through the parent), reading the schema version and the retention
floor, and ``EXECUTE`` on the owner's audit functions (migration 0019), through which
alone partitions are made and old months removed. Not owning the tables, it cannot
alter, detach, drop or truncate them, nor disable a trigger. Source: docs/design.md
"Audit log".
"""

from __future__ import annotations

import sqlalchemy as sa

from controlroom.exceptions import ConfigurationError

AUDIT_TABLES = ("audit_log", "audit_event_ids")
"""Tables the service role may only read and insert into."""
READ_ONLY_TABLES = ("alembic_version", "audit_log_policy")
"""Tables the service role may only read."""
AUDIT_FUNCTIONS = ("audit_log_prepare_partitions()", "audit_log_purge(integer, integer)")


def service_group(database: str) -> str:
    """The role holding the service's grants on ``database``: ``<database>_service``, cut
    to PostgreSQL's 63 bytes of a name."""
    return f"{database}_service".encode()[:63].decode(errors="ignore")


def _quoted(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'


def _role_exists(conn: sa.Connection, name: str) -> bool:
    exists: bool = conn.execute(
        sa.text("SELECT EXISTS (SELECT FROM pg_roles WHERE rolname = :name)"), {"name": name}
    ).scalar_one()
    return exists


def grant_service_role(conn: sa.Connection, service: sa.URL) -> str:
    """Make ``service``'s user (created when missing, with the URL's password when it has
    one) a member of the service group and give that group its grants, in ``conn``'s
    transaction, as the owner of the schema (a role that may also create roles).
    Idempotent: run after every migration, so that new tables get their grants. Returns
    the group's name. Raises ``ConfigurationError`` when ``service`` names no user or
    the owner itself."""
    login = service.username
    owner, database, schema = conn.execute(
        sa.text("SELECT current_user, current_database(), current_schema()")
    ).one()
    if not login:
        raise ConfigurationError("the database URL of serve names no user to make the service role")
    if login == owner:
        raise ConfigurationError(
            f"the database URL of serve names {login}, the owner migrate connects as: give "
            "serve a user of its own (README, Database roles)"
        )
    group = service_group(database)
    role = _quoted(group)

    def run(statement: str) -> None:
        conn.exec_driver_sql(statement)

    if not _role_exists(conn, group):
        run(f"CREATE ROLE {role} NOLOGIN")
    password = ""
    if service.password:
        literal = conn.execute(sa.select(sa.func.quote_literal(service.password))).scalar_one()
        password = f" PASSWORD {literal}"
    verb = "ALTER" if _role_exists(conn, login) else "CREATE"
    run(f"{verb} ROLE {_quoted(login)} LOGIN{password}")
    run(f"GRANT {role} TO {_quoted(login)}")
    run(f"GRANT CONNECT, TEMPORARY ON DATABASE {_quoted(database)} TO {role}")
    run(f"GRANT USAGE ON SCHEMA {_quoted(schema)} TO {role}")
    run(f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {_quoted(schema)} TO {role}")
    run(f"GRANT USAGE, SELECT, UPDATE ON ALL SEQUENCES IN SCHEMA {_quoted(schema)} TO {role}")
    partitions = conn.execute(
        sa.text(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = 'audit_log'::regclass"
        )
    ).scalars()
    closed = [*AUDIT_TABLES, *READ_ONLY_TABLES, "audit_verifications", *partitions]
    run(f"REVOKE ALL ON {', '.join(map(_quoted, closed))} FROM {role}")
    run(f"GRANT SELECT, INSERT ON {', '.join(AUDIT_TABLES)}, audit_verifications TO {role}")
    run(f"GRANT SELECT ON {', '.join(READ_ONLY_TABLES)} TO {role}")
    run(f"GRANT EXECUTE ON FUNCTION {', '.join(AUDIT_FUNCTIONS)} TO {role}")
    return group


def audit_log_exposure(conn: sa.Connection) -> str | None:
    """Why ``conn``'s user could rewrite the audit log (superuser, owner of ``audit_log``,
    or granted UPDATE, DELETE or TRUNCATE on it or a partition), ``None`` when it cannot."""
    user, superuser, owns, writes = conn.execute(
        sa.text(
            "SELECT current_user, r.rolsuper, pg_has_role(c.relowner, 'MEMBER'), "
            "EXISTS (SELECT FROM (SELECT c.oid UNION ALL SELECT i.inhrelid FROM pg_inherits i "
            "WHERE i.inhparent = c.oid) t(oid) "
            "WHERE has_table_privilege(t.oid, 'UPDATE, DELETE, TRUNCATE')) "
            "FROM pg_roles r, pg_class c "
            "WHERE r.rolname = current_user AND c.oid = 'audit_log'::regclass"
        )
    ).one()
    if superuser:
        why = "is a superuser"
    elif owns:
        why = "owns audit_log"
    elif writes:
        why = "may UPDATE, DELETE or TRUNCATE audit_log or one of its partitions"
    else:
        return None
    return (
        f"the database user {user} {why}: the audit log is append-only only against the "
        "service role, which `controlroom migrate` makes when CONTROLROOM_MIGRATION_DATABASE_URL "
        "names the owner (README, Database roles); the hash chain still shows a change "
        "(`controlroom audit verify`)"
    )
