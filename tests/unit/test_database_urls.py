"""The store's URLs an operator writes, taken at start (``Settings.database_url``): the
forms libpq documents, a Unix socket's among them (fresh-user pass, fourth: an empty host,
libpq's default socket, was refused as "no host name")."""

from __future__ import annotations

import pytest

from controlroom.config import Settings


@pytest.mark.parametrize(
    "url",
    [
        "postgresql+psycopg:///controlroom",
        "postgresql:///controlroom?host=/var/run/postgresql",
        "postgresql://postgres@/controlroom?host=/var/run/postgresql&port=5433",
        "postgresql://postgres@db1.example,db2.example:5432/controlroom",
        "postgresql://postgres@[::1]:5432/controlroom",
        "postgresql://postgres@127.0.0.1/controlroom?host=@abstract-socket",
        "postgresql://postgres@/controlroom?port=5432,5433&host=a.example,b.example",
        "sqlite:///relative/path/controlroom.db",
        "postgresql://postgres@127.0.0.1/control%23room",
        "postgresql://postgres@db1.example,db2.example/controlroom?port=5432,5433",
        "postgresql://postgres@db.example/controlroom?hostaddr=10.0.0.5",
        "postgresql://postgres@db.example/controlroom?sslmode=verify-full&connect_timeout=10",
        "postgresql://postgres@db.example/controlroom?target_session_attrs=read-write",
        "postgresql://postgres@db.example/controlroom?keepalives_idle=30&gssencmode=disable",
    ],
)
def test_a_database_url_libpq_or_sqlite_takes_is_taken(url: str) -> None:
    assert Settings(database_url=url).database_url == url
