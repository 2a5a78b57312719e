"""``serve`` started before its database or broker waits for them (docs/design.md
"Operational contract"), against the real servers: a port where nothing listens until a
proxy to the real server starts there, a database or virtual host created only after
``serve`` started; and it gives up, in one line, after ``startup.wait_seconds``."""

from __future__ import annotations

import asyncio
import logging
import re
import socket
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

from controlroom import server
from controlroom.cli import app
from controlroom.config import Settings
from controlroom.db.engine import create_store_engine
from controlroom.db.migrate import upgrade_database
from controlroom.exceptions import DependencyUnreachable
from controlroom.runtime.sockets import listen
from controlroom.runtime.startup import wait_until_reachable
from tests.servers import (
    POSTGRESQL_ADMIN_URL,
    RABBITMQ_HOST_URL,
    TEST_CLIENT_TIMEOUT,
    create_postgresql_database,
    create_rabbitmq_vhost,
    delete_rabbitmq_vhost,
    drop_postgresql_database,
    scratch_name,
)
from tests.tcp_proxy import TcpProxy

TIMEOUT = 120.0
WAITING = "waiting for "


class Records(logging.Handler):
    """The startup wait's log records, as they come."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
def records() -> Iterator[Records]:
    handler = Records()
    logger = logging.getLogger("controlroom.runtime.startup")
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


def free_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as probe:
        return int(probe.getsockname()[1])


def serve_once_reachable(
    settings: Settings, records: Records, make_reachable: Callable[[], object]
) -> int:
    """Start ``server.run``; once it has logged that it waits, call ``make_reachable`` (in a
    thread); wait until it serves; return the status of ``GET /api/health``."""

    async def main() -> int:
        stop = asyncio.Event()
        seen: list[server.Serving] = []
        with listen("127.0.0.1", 0) as listener:
            running = asyncio.create_task(
                server.run(settings, listener=listener, stop=stop, on_serving=seen.append)
            )
            try:
                async with asyncio.timeout(TIMEOUT):
                    while not any(m.startswith(WAITING) for m in records.messages):
                        assert not running.done(), running.exception()
                        await asyncio.sleep(0.05)
                    await asyncio.to_thread(make_reachable)
                    while not seen:
                        assert not running.done(), running.exception()
                        await asyncio.sleep(0.05)
                    async with httpx.AsyncClient(
                        base_url=seen[0].url, timeout=TEST_CLIENT_TIMEOUT
                    ) as client:
                        status = (await client.get("/api/health")).status_code
            finally:
                stop.set()
                await running
        return status

    return asyncio.run(main())


def with_port(url: str, port: int) -> str:
    return sa.make_url(url).set(port=port).render_as_string(hide_password=False)


def test_serve_waits_for_postgresql_to_listen(tmp_path: Path, records: Records) -> None:
    url = create_postgresql_database()
    port = free_port()
    settings = Settings(data_dir=tmp_path / "data", database_url=with_port(url, port))
    target = sa.make_url(url)
    proxies: list[TcpProxy] = []

    def start_proxy() -> None:
        proxies.append(TcpProxy(target.host or "127.0.0.1", target.port or 5432, port=port))
        proxies[0].__enter__()

    try:
        assert serve_once_reachable(settings, records, start_proxy) == 200
    finally:
        for proxy in proxies:
            proxy.__exit__(None, None, None)
        drop_postgresql_database(url)
    waits = [m for m in records.messages if m.startswith(WAITING)]
    assert "the database" in waits[0]
    assert "refused" in waits[0].lower()


def test_serve_waits_for_its_postgresql_database_to_be_created(
    tmp_path: Path, records: Records
) -> None:
    name = scratch_name("late")
    url = sa.make_url(POSTGRESQL_ADMIN_URL).set(database=name).render_as_string(False)
    settings = Settings(data_dir=tmp_path / "data", database_url=url)

    def create_database() -> None:
        admin = sa.create_engine(POSTGRESQL_ADMIN_URL, isolation_level="AUTOCOMMIT")
        try:
            with admin.connect() as conn:
                conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
        finally:
            admin.dispose()

    try:
        assert serve_once_reachable(settings, records, create_database) == 200
    finally:
        drop_postgresql_database(url)
    assert name in next(m for m in records.messages if m.startswith(WAITING))


def test_serve_waits_for_rabbitmq_to_listen(tmp_path: Path, records: Records) -> None:
    url, vhost = create_rabbitmq_vhost()
    port = free_port()
    broker = sa.make_url(url.replace("amqp", "x", 1))
    settings = Settings(
        data_dir=tmp_path / "data", broker_url=url.replace(f":{broker.port}/", f":{port}/")
    )
    proxies: list[TcpProxy] = []

    def start_proxy() -> None:
        proxies.append(TcpProxy(broker.host or "127.0.0.1", broker.port or 5672, port=port))
        proxies[0].__enter__()

    try:
        assert serve_once_reachable(settings, records, start_proxy) == 200
    finally:
        for proxy in proxies:
            proxy.__exit__(None, None, None)
        delete_rabbitmq_vhost(vhost)
    assert "the broker" in next(m for m in records.messages if m.startswith(WAITING))


def test_serve_waits_for_its_rabbitmq_vhost_to_be_created(tmp_path: Path, records: Records) -> None:
    vhost = scratch_name("late")
    settings = Settings(
        data_dir=tmp_path / "data", broker_url=RABBITMQ_HOST_URL.rstrip("/") + "/" + vhost
    )
    try:
        assert serve_once_reachable(settings, records, lambda: create_rabbitmq_vhost(vhost)) == 200
    finally:
        delete_rabbitmq_vhost(vhost)
    assert vhost in next(m for m in records.messages if m.startswith(WAITING))


@pytest.mark.parametrize("dependency", ["database", "broker"])
def test_serve_gives_up_after_the_bound_in_one_line(
    tmp_path: Path, records: Records, dependency: str
) -> None:
    dead = f"127.0.0.1:{free_port()}"
    where = (
        {"database_url": f"postgresql+psycopg://postgres@{dead}/postgres"}
        if dependency == "database"
        else {"broker_url": f"amqp://guest:guest@{dead}/"}
    )
    settings = Settings(data_dir=tmp_path / "data", startup={"wait_seconds": 2}, **where)
    if dependency == "broker":
        # The broker's wait shares the bound with the store's migration, which on a busy
        # machine took 1.7 of the 2 s (one try, CI): the store is migrated beforehand.
        engine = create_store_engine(settings.effective_database_url)
        upgrade_database(engine)
        engine.dispose()

    async def main() -> None:
        with listen("127.0.0.1", 0) as listener:
            await server.run(settings, listener=listener)

    with pytest.raises(DependencyUnreachable) as raised:
        asyncio.run(main())
    text = str(raised.value)
    assert "\n" not in text
    assert f"the {dependency}" in text
    # The seconds since serve began to wait, the setting's: the broker's wait comes after
    # the store's migration, and said "after 1 s" of a wait_seconds of 2 (fresh-user pass,
    # sixth).
    assert "still unreachable after 2 s (startup.wait_seconds)" in text
    assert len([m for m in records.messages if m.startswith(WAITING)]) >= 2  # tried again


def test_serve_with_no_wait_gives_up_at_once(tmp_path: Path) -> None:
    dead = f"127.0.0.1:{free_port()}"
    settings = Settings(
        data_dir=tmp_path / "data",
        database_url=f"postgresql+psycopg://postgres@{dead}/postgres",
        startup={"wait_seconds": 0},
    )

    async def main() -> None:
        with listen("127.0.0.1", 0) as listener:
            await server.run(settings, listener=listener)

    with pytest.raises(DependencyUnreachable, match="after 0 s"):
        asyncio.run(main())


def test_a_stop_while_waiting_ends_run(tmp_path: Path, records: Records) -> None:
    dead = f"127.0.0.1:{free_port()}"
    settings = Settings(
        data_dir=tmp_path / "data", database_url=f"postgresql+psycopg://postgres@{dead}/postgres"
    )

    async def main() -> None:
        stop = asyncio.Event()
        with listen("127.0.0.1", 0) as listener:
            running = asyncio.create_task(server.run(settings, listener=listener, stop=stop))
            async with asyncio.timeout(TIMEOUT):
                while not records.messages:
                    await asyncio.sleep(0.05)
                stop.set()
                await running  # returns: no error

    asyncio.run(main())


def test_the_command_exits_1_with_one_line_after_the_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CONTROLROOM_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv(
        "CONTROLROOM_DATABASE_URL", f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/x"
    )
    monkeypatch.setenv("CONTROLROOM_STARTUP__WAIT_SECONDS", "1")
    result = CliRunner().invoke(app, ["serve", "--port", "0"])

    assert result.exit_code == 1
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1
    assert "the database postgresql+psycopg://postgres@127.0.0.1:" in errors[0]
    assert "still unreachable after 1 s" in errors[0]


def wait_for_a_refusing_broker(seconds: float, *, waited_before: float = 0.0) -> None:
    """``wait_until_reachable`` of a broker that refuses every try, ``seconds`` until the
    deadline, serve having begun to wait ``waited_before`` seconds earlier."""

    async def refused() -> None:
        raise ConnectionRefusedError("refused")

    async def main() -> None:
        loop = asyncio.get_running_loop()
        await wait_until_reachable(
            "the broker",
            refused,
            unreachable=lambda exc: isinstance(exc, ConnectionRefusedError),
            describe=str,
            deadline=loop.time() + seconds,
            stop=asyncio.Event(),
            began=loop.time() - waited_before,
        )

    asyncio.run(main())


def test_the_seconds_given_up_after_count_from_when_serve_began_to_wait() -> None:
    """One ``startup.wait_seconds`` covers the store and then the broker: the broker's
    refusal counts from when serve began to wait (``began``), not from its own first try
    (fresh-user pass, sixth: "after 3 s" of a wait_seconds of 4)."""
    with pytest.raises(DependencyUnreachable, match="still unreachable after 4 s"):
        wait_for_a_refusing_broker(0.2, waited_before=3.9)


def test_the_try_at_the_deadline_is_announced_as_the_last(records: Records) -> None:
    """Fresh-user pass (seventh): the last wait said "(try 4, 0 s left) ...; next try in
    0.5 s", as if more were to come. Each line says the seconds left to a tenth, and the
    try at the deadline is called the last."""
    with pytest.raises(DependencyUnreachable):
        wait_for_a_refusing_broker(0.7)
    said = [message for message in records.messages if "waiting for the broker" in message]
    assert len(said) == 2, said
    assert said[0].endswith("; next try in 0.5 s"), said
    assert re.search(r"\(try 2, 0\.\d s left\): refused; last try in 0\.\d s$", said[1]), said
