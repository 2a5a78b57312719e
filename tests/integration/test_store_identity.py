"""``Provider.store_identity``: one text for one database however its URL spells it, the
key serves of one store share their broker by (``runtime.serve_lock``; docs/design.md
"Process shape"). Second breaker pass: the lock compared URL texts, so a serve of the
same PostgreSQL database spelt without its port, or with ``localhost``, on another broker
was let in and took retries into its embedded queue that RabbitMQ's endpoints never saw."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa

from controlroom.db.engine import create_store_engine, store_identity
from tests import servers


def identity(url: str | sa.URL) -> str:
    engine = create_store_engine(url)
    try:
        return store_identity(engine)
    finally:
        engine.dispose()


def other_spellings(url: sa.URL, tmp_path: Path) -> list[sa.URL]:
    """The same database by other URLs: another host name, no port, a query option; for
    a file, a path through a symbolic link, through ``..`` and a hard link (breaker pass,
    second: a hard link was another store, and SQLite names its write-ahead log after
    the path, so two serves' logs of one file could corrupt it)."""
    if url.get_backend_name() == "sqlite":
        path = Path(url.database or "")
        link = tmp_path / "linked"
        link.symlink_to(path.parent, target_is_directory=True)
        hard = tmp_path / "hard.db"
        hard.hardlink_to(path)
        return [
            url.set(database=str(link / path.name)),
            url.set(database=str(path.parent / ".." / path.parent.name / path.name)),
            url.set(database=str(hard)),
        ]
    return [
        url.set(host="localhost"),
        url.set(port=None),
        url.update_query_dict({"application_name": "another-serve"}),
    ]


def test_one_database_spelt_otherwise_has_one_identity(database_url: str, tmp_path: Path) -> None:
    url = sa.make_url(database_url)
    first = identity(url)
    for spelling in other_spellings(url, tmp_path):
        assert identity(spelling) == first, spelling.render_as_string()


def test_another_database_has_another_identity(database_url: str, tmp_path: Path) -> None:
    url = sa.make_url(database_url)
    if url.get_backend_name() == "sqlite":
        other_url = url.set(database=str(tmp_path / "other.db"))
        assert identity(other_url) != identity(url)
        return
    other = servers.create_postgresql_database()
    try:
        assert identity(other) != identity(url)
    finally:
        servers.drop_postgresql_database(other)


@pytest.mark.postgresql
def test_another_schema_of_one_database_has_another_identity(postgresql_url: str) -> None:
    """Breaker pass (second): ``?options=-csearch_path%3Dother`` is a store of its own (its
    tables made in that schema) and was refused as the same store."""
    url = sa.make_url(postgresql_url)
    engine = create_store_engine(url)
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql("CREATE SCHEMA other")
    finally:
        engine.dispose()
    other = url.update_query_dict({"options": "-csearch_path=other"})
    assert identity(other) != identity(url)


def test_the_identity_names_no_credentials(database_url: str) -> None:
    url = sa.make_url(database_url)
    if url.get_backend_name() != "sqlite":
        url = url.update_query_dict({"password": "S3CRETPW"})
    assert "S3CRETPW" not in identity(url)


@pytest.mark.postgresql
def test_by_address_one_postgresql_database_spelt_otherwise_has_one_identity(
    postgresql_url: str, tmp_path: Path
) -> None:
    """Where a managed server refuses ``pg_control_system()``, the identity is the address
    and port the server answered on: still one for ``localhost`` and ``127.0.0.1``."""
    from controlroom.db.providers.postgresql import address_identity

    def by_address(url: sa.URL) -> str:
        engine = create_store_engine(url)
        try:
            with engine.connect() as conn:
                return address_identity(conn)
        finally:
            engine.dispose()

    url = sa.make_url(postgresql_url)
    assert {by_address(u) for u in [url, *other_spellings(url, tmp_path)]} == {by_address(url)}
