"""Fixtures of the API tests: the app over a migrated store on each provider."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from controlroom.api import create_app
from controlroom.config import Settings
from controlroom.errors.bodies import FileSystemBodyStore
from controlroom.errors.writer import FailedMessageBatchWriter


@pytest.fixture
def body_store(tmp_path: Path) -> FileSystemBodyStore:
    return FileSystemBodyStore(tmp_path / "bodies")


@pytest.fixture
def writer(engine: sa.Engine) -> FailedMessageBatchWriter:
    return FailedMessageBatchWriter(engine)


@pytest.fixture
def client(
    settings: Settings, engine: sa.Engine, body_store: FileSystemBodyStore
) -> Iterator[TestClient]:
    """A client of the API over ``engine`` (each provider) and ``body_store``."""
    with TestClient(create_app(settings, engine, body_store)) as test_client:
        yield test_client
