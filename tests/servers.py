"""Where the test servers are, what to do when one is missing, and the scratch databases
and vhosts the tests create on them.

On a user's machine a missing server skips the tests that need it, saying why; with
``CONTROLROOM_REQUIRE_SERVERS=1`` (set by ``.ci/run``) the skip becomes a failure, so CI
never passes by skipping. Both hold in every pytest-xdist worker: workers inherit the
environment.

Parallel workers (``make test`` runs ``pytest -n``) share the servers, so every scratch
name carries the worker's id (``PYTEST_XDIST_WORKER``, ``main`` without xdist) and a
random part; nothing here has a fixed name.

Three costs are taken off each test: migrating (each process migrates one template per
provider and copies it: ``CREATE DATABASE ... TEMPLATE`` on PostgreSQL, a file copy on
SQLite), creating (``CREATE DATABASE`` writes the whole template, about 9 MB, to the WAL
and waits for its flush: 0.3-0.8 s a test while another process writes a big database,
so each process creates its next PostgreSQL database on a background thread while the
current test runs) and dropping (``DROP DATABASE`` waits for a checkpoint of the whole
server, so drops run on background threads, where concurrent ones share a checkpoint;
``finish()`` waits for them and reports any that failed, and drops the databases
created ahead and never used).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest
import sqlalchemy as sa

from controlroom.db.engine import create_store_engine
from controlroom.db.migrate import upgrade_database

TEST_CLIENT_TIMEOUT = 60.0
"""Seconds any HTTP client of the tests waits for an answer, and the product's own request
timeouts the tests configure (a site's answer to central, ``reconciliation.request_timeout``)
unless a test is about that timeout: a bound on a hang, generous enough for a loaded
two-core CI machine, not an assertion about speed (httpx's default of 5 s was not)."""

REQUIRE_SERVERS = os.environ.get("CONTROLROOM_REQUIRE_SERVERS") == "1"
POSTGRESQL_ADMIN_URL = os.environ.get(
    "CONTROLROOM_TEST_POSTGRESQL_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)
RABBITMQ_HOST_URL = os.environ.get(
    "CONTROLROOM_TEST_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/"
)
WORKER = os.environ.get("PYTEST_XDIST_WORKER", "main")
"""This process's xdist worker id (``gw0``, ``gw1``, ...), ``main`` when run without."""

DROP_THREADS = 6  # concurrent DROP DATABASEs (each holds one admin connection): 3 fell
# behind the tests once creating no longer paced them, leaving a minute of drops at the end


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


def scratch_name(kind: str = "") -> str:
    """A database or vhost name no other test, worker or concurrent run uses, e.g.
    ``controlroom_test_gw1_3f2a9c0d1e4b`` (at most 63 bytes, PostgreSQL's limit)."""
    return "_".join(filter(None, ["controlroom_test", WORKER, kind, uuid.uuid4().hex[:12]]))


# --- PostgreSQL -----------------------------------------------------------------------------
class _PostgreSQL:
    """This process's admin connection, migrated template, databases created ahead and
    pending drops."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._admin: sa.Engine | None = None
        self._template: str | None = None
        self._migrated: set[str] = set()
        self._creates: ThreadPoolExecutor | None = None
        self._ahead: dict[bool, Future[str]] = {}
        """The next database of each kind (migrated or not), being created ahead."""
        self._drops: ThreadPoolExecutor | None = None
        self._pending: list[Future[None]] = []

    def admin(self) -> sa.Engine:
        with self._lock:
            if self._admin is None:
                self._admin = sa.create_engine(  # the drop threads and the creating one
                    POSTGRESQL_ADMIN_URL, isolation_level="AUTOCOMMIT", pool_size=DROP_THREADS + 1
                )
            return self._admin

    def create(self, *, migrated: bool) -> str:
        """A new database: the one created ahead of this call, if any, else one created
        now; then starts creating the next one of the same kind in the background. A
        failure to create (``missing_server``) is raised here either way."""
        template = self._migrated_template() if migrated else None
        with self._lock:
            ahead = self._ahead.pop(migrated, None)
            if self._creates is None:
                self._creates = ThreadPoolExecutor(1, thread_name_prefix="create-db")
            self._ahead[migrated] = self._creates.submit(self._create_named, template)
        url = ahead.result() if ahead is not None else self._create_named(template)
        if migrated:
            self._migrated.add(url)
        return url

    def _create_named(self, template: str | None) -> str:
        name = scratch_name()
        self._create(name, template)
        return _url_of(name)

    def is_migrated(self, url: str) -> bool:
        return url in self._migrated

    def _create(self, name: str, template: str | None) -> None:
        statement = f'CREATE DATABASE "{name}"'
        if template is not None:
            statement += f' TEMPLATE "{template}"'
        try:
            with self.admin().connect() as conn:
                conn.exec_driver_sql(statement)
        except sa.exc.OperationalError as exc:
            missing_server("PostgreSQL", exc.orig)

    def _migrated_template(self) -> str:
        """This process's database migrated to head (made on first use): a copy of it is
        what migrating a new database would give, at a fraction of the cost."""
        if self._template is None:
            name = scratch_name("template")
            self._create(name, None)
            engine = create_store_engine(_url_of(name))
            try:
                upgrade_database(engine)
            finally:
                engine.dispose()
            # CREATE DATABASE ... TEMPLATE refuses while anyone is connected to it.
            with self.admin().connect() as conn:
                conn.exec_driver_sql(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
            self._template = name
        return self._template

    def drop_later(self, url: str) -> None:
        """Drop ``url``'s database on a background thread; raises the error of an
        earlier drop that failed (so it is reported by the test that caused it or the
        next one)."""
        self._migrated.discard(url)
        with self._lock:
            if self._drops is None:
                self._drops = ThreadPoolExecutor(DROP_THREADS, thread_name_prefix="drop-db")
            self._pending.append(self._drops.submit(self._drop, sa.make_url(url).database))
        self._raise_failed_drops(wait=False)

    def _drop(self, name: str | None) -> None:
        with self.admin().connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def _raise_failed_drops(self, *, wait: bool) -> None:
        """Raise the errors of the finished drops (of all of them, ``wait``ing)."""
        with self._lock:
            ended = [f for f in self._pending if wait or f.done()]
            self._pending = [f for f in self._pending if f not in ended]
        failed = [f.exception() for f in ended if f.exception() is not None]
        if failed:
            raise RuntimeError(f"dropping scratch PostgreSQL databases failed: {failed!r}")

    def finish(self) -> None:
        """Drop the databases created ahead and the template, wait for every drop, and
        raise if any failed."""
        if self._creates is not None:
            self._creates.shutdown(wait=True)
            self._creates = None
        for ahead in self._ahead.values():
            if ahead.exception() is None:
                self.drop_later(ahead.result())
        self._ahead.clear()
        if self._template is not None:
            self.drop_later(_url_of(self._template))
            self._template = None
        try:
            self._raise_failed_drops(wait=True)
        finally:
            if self._drops is not None:
                self._drops.shutdown(wait=True)
                self._drops = None
            if self._admin is not None:
                self._admin.dispose()
                self._admin = None


def _url_of(name: str) -> str:
    return str(sa.make_url(POSTGRESQL_ADMIN_URL).set(database=name).render_as_string(False))


_postgresql = _PostgreSQL()


def create_postgresql_database(*, migrated: bool = False) -> str:
    """Create a scratch database, empty or (``migrated``) already migrated to head;
    returns its URL. Skips (or fails) the test when PostgreSQL is not reachable."""
    return _postgresql.create(migrated=migrated)


def drop_postgresql_database(url: str) -> None:
    """Drop a scratch database (in the background; ``finish()`` waits for it)."""
    _postgresql.drop_later(url)


# --- SQLite ---------------------------------------------------------------------------------
class _SQLiteTemplate:
    """A database file migrated to head once per process, copied for each test."""

    def __init__(self) -> None:
        self._dir: Path | None = None

    def copy_to(self, path: Path) -> None:
        if self._dir is None:
            scratch = Path(tempfile.mkdtemp(prefix=f"controlroom-{WORKER}-template-"))
            engine = create_store_engine(f"sqlite:///{scratch / 'template.db'}")
            try:
                upgrade_database(engine)
                with engine.connect() as conn:  # everything into the main file
                    conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
            finally:
                engine.dispose()
            self._dir = scratch
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(self._dir / "template.db", path)

    def finish(self) -> None:
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None


_sqlite = _SQLiteTemplate()


def prepare_migrated(url: str) -> bool:
    """Make ``url``'s database a migrated copy when that is cheaper than migrating it:
    True when it now is at head (a new SQLite file copied from the template, or a
    PostgreSQL database created from the template), False when the caller must migrate."""
    parsed = sa.make_url(url)
    if parsed.get_backend_name() == "sqlite":
        path = Path(parsed.database or "")
        if parsed.database in (None, "", ":memory:") or path.exists():
            return False
        _sqlite.copy_to(path)
        return True
    return _postgresql.is_migrated(url)


# --- RabbitMQ -------------------------------------------------------------------------------
def create_rabbitmq_vhost(vhost: str | None = None) -> tuple[str, str]:
    """Create a vhost with ``rabbitmqctl``, a scratch name unless ``vhost`` is given;
    returns (amqp URL, vhost name)."""
    ctl = shutil.which("rabbitmqctl")
    if ctl is None:
        missing_server("RabbitMQ", "rabbitmqctl not found")
    vhost = vhost or scratch_name()
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


def finish() -> None:
    """End of this process's session: remove the templates, wait for the background
    drops; raises RuntimeError naming the drops that failed."""
    _sqlite.finish()
    _postgresql.finish()
