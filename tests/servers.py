"""Where the test servers are, and what to do when one is missing.

On a user's machine a missing server skips the tests that need it, saying why; with
``CONTROLROOM_REQUIRE_SERVERS=1`` (set by ``.ci/run``) the skip becomes a failure, so CI
never passes by skipping.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid

import pytest
import sqlalchemy as sa

REQUIRE_SERVERS = os.environ.get("CONTROLROOM_REQUIRE_SERVERS") == "1"
POSTGRESQL_ADMIN_URL = os.environ.get(
    "CONTROLROOM_TEST_POSTGRESQL_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)
RABBITMQ_HOST_URL = os.environ.get(
    "CONTROLROOM_TEST_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/"
)


def missing_server(what: str, why: object) -> None:
    """Skip (or, when servers are required, fail) because ``what`` cannot be reached."""
    message = f"{what} is not reachable ({why}); set it up or see README 'Tests'"
    if REQUIRE_SERVERS:
        pytest.fail(f"CONTROLROOM_REQUIRE_SERVERS=1 but {message}", pytrace=False)
    pytest.skip(message)


def missing_browser(why: str) -> None:
    """Skip (or, when servers are required, fail) because the browser cannot be started."""
    message = f"the browser tests need Debian's Chromium: {why}"
    if REQUIRE_SERVERS:
        pytest.fail(f"CONTROLROOM_REQUIRE_SERVERS=1 but {message}", pytrace=False)
    pytest.skip(message)


def create_postgresql_database() -> str:
    """Create an empty scratch database; returns its URL."""
    admin = sa.create_engine(POSTGRESQL_ADMIN_URL, isolation_level="AUTOCOMMIT")
    name = f"controlroom_test_{uuid.uuid4().hex[:12]}"
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    except sa.exc.OperationalError as exc:
        missing_server("PostgreSQL", exc.orig)
    finally:
        admin.dispose()
    return str(sa.make_url(POSTGRESQL_ADMIN_URL).set(database=name).render_as_string(False))


def drop_postgresql_database(url: str) -> None:
    admin = sa.create_engine(POSTGRESQL_ADMIN_URL, isolation_level="AUTOCOMMIT")
    name = sa.make_url(url).database
    with admin.connect() as conn:
        conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    admin.dispose()


def create_rabbitmq_vhost() -> tuple[str, str]:
    """Create a scratch vhost with ``rabbitmqctl``; returns (amqp URL, vhost name)."""
    ctl = shutil.which("rabbitmqctl")
    if ctl is None:
        missing_server("RabbitMQ", "rabbitmqctl not found")
    vhost = f"controlroom_test_{uuid.uuid4().hex[:12]}"
    user = sa.make_url(RABBITMQ_HOST_URL.replace("amqp", "x", 1)).username or "guest"
    try:
        subprocess.run([ctl, "add_vhost", vhost], check=True, capture_output=True, timeout=60)
        subprocess.run(
            [ctl, "set_permissions", "-p", vhost, user, ".*", ".*", ".*"],
            check=True,
            capture_output=True,
            timeout=60,
        )
    except (subprocess.SubprocessError, OSError) as exc:
        missing_server("RabbitMQ", exc)
    return RABBITMQ_HOST_URL.rstrip("/") + "/" + vhost, vhost


def delete_rabbitmq_vhost(vhost: str) -> None:
    ctl = shutil.which("rabbitmqctl")
    if ctl:
        subprocess.run([ctl, "delete_vhost", vhost], capture_output=True, timeout=60)


def rabbitmq_queue_counts(url: str, queue: str) -> tuple[int, int]:
    """(ready, unacknowledged) messages of ``queue`` in the vhost of ``url``, as the broker
    counts them (``rabbitmqctl list_queues``; the management plugin is not required)."""
    ctl = shutil.which("rabbitmqctl")
    if ctl is None:
        missing_server("RabbitMQ", "rabbitmqctl not found")
    vhost = url.rstrip("/").rsplit("/", 1)[1] if url.count("/") > 2 else "/"
    out = subprocess.run(
        [
            ctl,
            "list_queues",
            "-q",
            "--no-table-headers",
            "-p",
            vhost,
            "name",
            "messages_ready",
            "messages_unacknowledged",
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    for line in out.strip().splitlines():
        name, ready, unacked = line.split("\t")
        if name == queue:
            return int(ready), int(unacked)
    raise LookupError(f"queue {queue!r} not found in vhost {vhost!r}")
