"""Apply the Alembic migrations that ship inside the package, then what only the schema's
owner may set: the audit purge's floor and the service role (``secure_audit_log``); check
that the store takes writes (``require_writable``)."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import CommandError

from controlroom.db.engine import normalize_database_url, shown_url
from controlroom.db.errors import describe_store_error, is_transient, store_error_advice
from controlroom.db.providers import provider_for
from controlroom.db.tables import audit_log_policy, service_leases
from controlroom.db.transactions import begin_write
from controlroom.exceptions import ConfigurationError

MIGRATIONS_DIR = Path(__file__).parent / "migrations"


def alembic_config(engine: sa.Engine) -> Config:
    """An Alembic configuration bound to ``engine`` (no alembic.ini needed)."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.attributes["engine"] = engine
    return config


def upgrade_database(engine: sa.Engine, revision: str = "head") -> tuple[str | None, str | None]:
    """Bring the schema of ``engine``'s database up to ``revision`` (idempotent). Returns
    its revision before and after (``None``: no schema, an empty database). Raises
    ``ConfigurationError`` when the schema is at a revision this package does not ship
    (a newer version migrated it)."""
    config = alembic_config(engine)
    before = schema_revision(engine)
    if before is not None and not _is_known(config, before):
        where = shown_url(engine.url)
        raise ConfigurationError(
            f"the schema of {where} is at revision {before}, which this version of "
            "controlroom does not know: a newer version migrated it; run that version "
            "(migrations only go forward)"
        )
    command.upgrade(config, revision)
    return before, schema_revision(engine)


def require_writable(engine: sa.Engine) -> None:
    """Raise ``ConfigurationError`` naming the store when its user cannot write it: SQLite
    opened with ``mode=ro``, a PostgreSQL standby or read-only session, a missing grant.
    Such a store answers every read, so without this check serve would start and fail
    every write (ingestion, retries, sweeps) instead. Writes nothing: it updates no row.
    A transient error (the store unreachable) propagates as it is."""
    probe = sa.update(service_leases).where(sa.false()).values(owner=service_leases.c.owner)
    try:
        with begin_write(engine) as conn:
            conn.execute(probe)
    except sa.exc.DBAPIError as exc:
        if is_transient(exc):
            raise
        advice = store_error_advice(exc)
        raise ConfigurationError(
            f"the database {shown_url(engine.url)} takes no writes "
            f"({describe_store_error(exc)}), and Controlroom writes its store"
            + (f": {advice}" if advice else "")
        ) from exc


def _is_known(config: Config, revision: str) -> bool:
    """Whether ``revision`` is one of the migrations shipped in this package."""
    try:
        return ScriptDirectory.from_config(config).get_revision(revision) is not None
    except CommandError:  # alembic wraps its "Can't locate revision"
        return False


def schema_revision(engine: sa.Engine) -> str | None:
    """The migration revision of ``engine``'s database; ``None`` when it has none."""
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def secure_audit_log(
    engine: sa.Engine, *, retention_days: int, service_url: str | None
) -> str | None:
    """As the schema's owner (``engine``), after ``upgrade_database``: store
    ``retention_days`` as the audit purge's floor (``audit_log_policy``: no purge removes
    a month younger, whoever asks), and when ``service_url`` is given, make its user the
    service role (``Provider.grant_service_role``). Returns the role granted, ``None``
    without one or where the provider has no roles. Raises ``ConfigurationError`` when
    ``service_url`` is another provider's or another database's."""
    provider = provider_for(engine)
    with begin_write(engine) as conn:
        conn.execute(
            sa.update(audit_log_policy)
            .where(audit_log_policy.c.id == 1)
            .values(min_retention_days=retention_days)
        )
        if service_url is None:
            return None
        service = normalize_database_url(service_url)
        if (service.get_backend_name(), service.database) != (
            engine.url.get_backend_name(),
            engine.url.database,
        ):
            raise ConfigurationError(
                "the database URL of serve and the migration database URL must name the "
                "same database"
            )
        return provider.grant_service_role(conn, service)
