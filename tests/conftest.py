"""Shared fixtures: a migrated store per provider, a scratch RabbitMQ vhost, settings."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from controlroom.app import create_app
from controlroom.config import Settings
from controlroom.db.engine import create_store_engine
from controlroom.db.migrate import upgrade_database
from controlroom.errors.ingest.bodies import FileSystemBodyStore
from controlroom.errors.ingest.writer import FailedMessageBatchWriter
from controlroom.runtime import intake_cgroup
from tests import servers

PROVIDERS = ("sqlite", "postgresql")


@pytest.fixture(scope="session", autouse=True)
def _scratch_servers() -> Iterator[None]:
    """At the end of each process's session (each xdist worker's): remove the migrated
    templates and wait for the scratch databases dropped in the background; a drop
    that failed fails the session here."""
    yield
    servers.finish()


@pytest.fixture(scope="session", autouse=True)
def _intake_cgroups_left(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """At the end of each process's session: remove the intake cgroups that serves the
    tests ended by ``kill -9`` left (``intake_cgroup.remove_left``): the next serve of
    the same data directory would, and a test's data directory has none."""
    yield
    for records in tmp_path_factory.getbasetemp().rglob(intake_cgroup.RECORDS):
        intake_cgroup.remove_left(records)


@pytest.fixture(params=PROVIDERS)
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A database on each supported provider (the test runs once per provider): empty,
    or already migrated to head when the test also uses ``engine`` (a copy of a
    migrated template costs less than migrating)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'controlroom.db'}"
        return
    url = servers.create_postgresql_database(migrated="engine" in request.fixturenames)
    try:
        yield url
    finally:
        servers.drop_postgresql_database(url)


@pytest.fixture
def postgresql_url() -> Iterator[str]:
    """An empty PostgreSQL database, for tests that only make sense on a server."""
    url = servers.create_postgresql_database()
    try:
        yield url
    finally:
        servers.drop_postgresql_database(url)


@pytest.fixture
def engine(database_url: str) -> Iterator[sa.Engine]:
    """A store migrated to head on each provider (a copy of a migrated template where
    ``servers.prepare_migrated`` can make one, else migrated here)."""
    migrated = servers.prepare_migrated(database_url)
    eng = create_store_engine(database_url)
    if not migrated:
        upgrade_database(eng)
    try:
        yield eng
    finally:
        eng.dispose()


@pytest.fixture(scope="session")
def rabbitmq_url() -> Iterator[str]:
    """A scratch RabbitMQ vhost for this test session; deleted afterwards."""
    url, vhost = servers.create_rabbitmq_vhost()
    try:
        yield url
    finally:
        servers.delete_rabbitmq_vhost(vhost)


@pytest.fixture
def settings(tmp_path: Path, database_url: str) -> Settings:
    """Settings on the embedded queue with a fresh data dir, on each provider."""
    return Settings(data_dir=tmp_path / "data", database_url=database_url)


@pytest.fixture
def body_store(settings: Settings) -> FileSystemBodyStore:
    return FileSystemBodyStore(settings.body_dir)


@pytest.fixture
def writer(engine: sa.Engine) -> FailedMessageBatchWriter:
    return FailedMessageBatchWriter(engine)


@pytest.fixture
def client(
    settings: Settings, engine: sa.Engine, body_store: FileSystemBodyStore
) -> Iterator[TestClient]:
    """A client of the API over ``engine`` (each provider) and ``body_store``; no transport,
    so retries wait for a processor the test runs itself."""
    with TestClient(create_app(settings, engine, body_store)) as test_client:
        yield test_client
