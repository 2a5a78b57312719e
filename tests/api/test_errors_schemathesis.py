"""Property test of the whole API against its own OpenAPI schema, on every provider.

Schemathesis generates requests from ``/openapi.json`` for every operation, valid ones
and ones that break the schema; none may end in a 5xx status the operation does not
document (a documented one, such as 503 "the body store cannot be read", is a designed
answer) or in an exception escaping the app. One test per operation and provider, so a
failure names its route; bounded in examples and without shrinking, so a provider's run
takes seconds; derandomized, so a failure reproduces.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hypothesis
import pytest
import schemathesis
import sqlalchemy as sa
from schemathesis import GenerationMode
from schemathesis.python import asgi

from controlroom.app import create_app
from controlroom.config import Settings
from controlroom.db.engine import create_store_engine
from controlroom.db.migrate import upgrade_database
from controlroom.errors.ingest.bodies import FileSystemBodyStore
from controlroom.errors.ingest.writer import FailedMessageBatchWriter, IngestionBatch
from tests import servers
from tests.conftest import PROVIDERS
from tests.factories import at, attempt

EXAMPLES_PER_MODE = 10

SETTINGS = hypothesis.settings(
    max_examples=EXAMPLES_PER_MODE,
    deadline=None,
    derandomize=True,
    database=None,
    phases=[hypothesis.Phase.explicit, hypothesis.Phase.generate],
    suppress_health_check=list(hypothesis.HealthCheck),
)


def _operation_labels() -> list[str]:
    """Every operation of the schema (``"GET /api/errors"``), read from an app over a
    throwaway store: the schema does not depend on the store."""
    with tempfile.TemporaryDirectory() as scratch:
        engine = sa.create_engine("sqlite://")
        app = create_app(Settings(data_dir=Path(scratch)), engine, FileSystemBodyStore(scratch))
        schema = schemathesis.openapi.from_asgi("/openapi.json", app)
        labels = [result.ok().label for result in schema.get_all_operations()]
        engine.dispose()
    return labels


@dataclass
class Target:
    """The app over a migrated store with a few rows, its schema, one in-process client."""

    schema: Any
    session: Any


@pytest.fixture(scope="module", params=PROVIDERS)
def target(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Target]:
    scratch = tmp_path_factory.mktemp(f"schemathesis-{request.param}")
    if request.param == "sqlite":
        url = f"sqlite:///{scratch / 'controlroom.db'}"
    else:
        url = servers.create_postgresql_database()
    engine = create_store_engine(url)
    try:
        upgrade_database(engine)
        # Some rows, so list, group and search routes have something to page and match.
        writer = FailedMessageBatchWriter(engine)
        writer.write(IngestionBatch(attempts=[attempt(n, at(n)) for n in range(5)]))
        settings = Settings(data_dir=scratch / "data", database_url=url)
        app = create_app(settings, engine, FileSystemBodyStore(scratch / "bodies"))
        # One client for the run: schemathesis would start the app once per request.
        with asgi.get_client(app) as session:
            yield Target(schemathesis.openapi.from_asgi("/openapi.json", app), session)
    finally:
        engine.dispose()
        if request.param == "postgresql":
            servers.drop_postgresql_database(url)


def server_errors(operation: Any, mode: GenerationMode, session: Any) -> list[str]:
    """Generated requests of ``operation`` in ``mode`` answered with an undocumented 5xx,
    or whose handling raised."""
    found: list[str] = []
    documented = {str(status) for status in operation.definition.raw.get("responses", {})}

    @SETTINGS
    @hypothesis.given(case=operation.as_strategy(generation_mode=mode))
    def call(case: Any) -> None:
        request = f"{case.method} {case.formatted_path} query={case.query!r} body={case.body!r}"
        try:
            status = case.call(session=session).status_code
        except Exception as exc:  # the in-process client re-raises what the app raised
            found.append(f"{request[:300]} -> {type(exc).__name__}: {str(exc)[:200]}")
            return
        if status >= 500 and str(status) not in documented:
            found.append(f"{request[:300]} -> {status}")

    # Negative mode on an operation without parameters or body: nothing to break.
    with contextlib.suppress(hypothesis.errors.Unsatisfiable):
        call()
    return found


@pytest.mark.parametrize("label", _operation_labels())
def test_no_generated_request_gets_an_undocumented_server_error(target: Target, label: str) -> None:
    operation = target.schema.find_operation_by_label(label)

    failures = [
        failure
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
        for failure in server_errors(operation, mode, target.session)
    ]

    assert not failures, "\n".join(failures[:10])
