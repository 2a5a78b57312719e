"""The ``controlroom`` command: migrate, demo, import-failed, version, and serve end to end."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa
from alembic.script import ScriptDirectory
from pydantic import ValidationError
from typer.testing import CliRunner

from controlroom import __version__
from controlroom.cli import app
from controlroom.config import Settings
from controlroom.db.engine import create_store_engine, store_identity
from controlroom.db.migrate import alembic_config, upgrade_database
from controlroom.db.tables import failed_error_imports, notifications
from controlroom.demo import generate_demo_messages
from controlroom.demo_endpoints import fails_again
from controlroom.demo_sizes import DEFAULT_FAIL_RATIO
from controlroom.errors.ingest import headers as h
from controlroom.errors.ingest.parsing import parse_failed_message
from controlroom.errors.ingest.reimport import ReimportOutcome, reimport_failed_import
from controlroom.errors.ingest.writer import FailedMessageBatchWriter, IngestionBatch
from controlroom.errors.model import FailedImport
from controlroom.event_types import EventType
from controlroom.events import record_event
from controlroom.exceptions import MessageRejected
from controlroom.runtime import serve_lock
from controlroom.server import _quiet_routine_telemetry
from controlroom.transport import Delivery, EmbeddedQueue, TransportError
from tests import servers
from tests.api.test_health import without_vacuum_warnings
from tests.factories import at
from tests.reconciliation.harness import eventually
from tests.servers import TEST_CLIENT_TIMEOUT

runner = CliRunner()
WEBHOOK_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
REPORTED = re.compile(r"ingested \d+ failed messages \([\d.]+/s\), 1 failed imports")
"""The ingestion's periodic report of a run that kept one failed import."""
CONTROLROOM_EXE = Path(sys.executable).parent / "controlroom"
SETTINGS_ENV = (
    "CONTROLROOM_CONFIG",
    "CONTROLROOM_DATABASE_URL",
    "CONTROLROOM_BROKER_URL",
    "CONTROLROOM_ERROR_QUEUE",
    "CONTROLROOM_HOST",
    "CONTROLROOM_PORT",
)


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh data dir as the only setting: the embedded default (SQLite + queue file)."""
    for name in SETTINGS_ENV:
        monkeypatch.delenv(name, raising=False)
    path = tmp_path / "data"
    monkeypatch.setenv("CONTROLROOM_DATA_DIR", str(path))
    return path


def invoke(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.output


async def drain(queue_file: Path, queue: str, count: int) -> list[Delivery]:
    """The first ``count`` messages of ``queue`` in the embedded queue file, left queued."""
    deliveries: list[Delivery] = []
    async with EmbeddedQueue(queue_file) as transport, asyncio.timeout(30):
        stream = transport.consume(queue, prefetch=count)
        async with contextlib.aclosing(stream):  # type: ignore[type-var]
            async for delivery in stream:
                deliveries.append(delivery)
                if len(deliveries) == count:
                    break
    return deliveries


# --- version, migrate, demo ---------------------------------------------------------------
def test_version_prints_the_package_version() -> None:
    code, output = invoke("version")

    assert code == 0
    assert output.strip() == f"controlroom {__version__}"


def test_migrate_creates_the_schema_in_a_fresh_data_dir(data_dir: Path) -> None:
    code, output = invoke("migrate")

    assert code == 0, output
    head = ScriptDirectory.from_config(
        alembic_config(sa.create_engine("sqlite://"))
    ).get_current_head()
    assert f"created at revision {head}" in output  # not "up to date": it was empty
    engine = create_store_engine(f"sqlite:///{data_dir / 'controlroom.db'}")
    try:
        tables = set(sa.inspect(engine).get_table_names())
    finally:
        engine.dispose()
    assert {"failed_messages", "failed_message_groups", "failed_error_imports"} <= tables
    code, output = invoke("migrate")  # idempotent
    assert code == 0 and f"up to date (revision {head})" in output, output


def test_migrate_names_the_revisions_it_upgraded_from_and_to(data_dir: Path) -> None:
    engine = create_store_engine(f"sqlite:///{data_dir / 'controlroom.db'}")
    try:
        upgrade_database(engine, "0030")
        head = ScriptDirectory.from_config(alembic_config(engine)).get_current_head()
    finally:
        engine.dispose()

    code, output = invoke("migrate")

    assert code == 0, output
    assert f"upgraded from revision 0030 to {head}" in output


def test_migrate_writes_the_search_terms_of_rows_stored_before_0009(data_dir: Path) -> None:
    from controlroom.db.migrate import upgrade_database
    from controlroom.errors.read.search import search_failed_messages

    engine = create_store_engine(f"sqlite:///{data_dir / 'controlroom.db'}")
    try:
        upgrade_database(engine, "0004")
        with engine.begin() as conn:  # a row as the previous schema stored it
            conn.exec_driver_sql(
                "INSERT INTO failed_messages (id, message_id, status, status_changed_at, "
                "last_modified, number_of_processing_attempts, first_failure_at, "
                "last_failure_at, is_system_message, queue_address, receiving_endpoint, "
                "headers_json, content_type, body_size, body_text, body_stored_externally) "
                "VALUES ('00000000-0000-0000-0000-000000000001', 'm-1', 1, "
                "'2026-01-01 00:00:00.000000', '2026-01-01 00:00:00.000000', 1, "
                "'2026-01-01 00:00:00.000000', '2026-01-01 00:00:00.000000', 0, 'Sales', "
                "'Sales', '{\"Shop.Tenant\":\"blueberry\"}', 'text/plain', 8, "
                "'zanzibar', 0)"
            )

        code, output = invoke("migrate")

        assert code == 0, output
        assert "Writing search terms of stored messages" in output
        with engine.connect() as conn:
            for text in ("blueberry", "zanzibar"):
                page = search_failed_messages(conn, text, offset=0, limit=10)
                assert [hit.summary.id for hit in page.items] == [
                    "00000000-0000-0000-0000-000000000001"
                ]
    finally:
        engine.dispose()


@pytest.mark.parametrize("command", ["migrate", "sweep"])
def test_a_schema_newer_than_this_version_is_named_in_one_line(
    data_dir: Path, command: str
) -> None:
    # Rolled back under a schema a newer version migrated: say so, never a traceback.
    assert invoke("migrate")[0] == 0
    engine = create_store_engine(f"sqlite:///{data_dir / 'controlroom.db'}")
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql("UPDATE alembic_version SET version_num = '0999'")
    finally:
        engine.dispose()

    code, output = invoke(command)

    assert code == 1, output
    assert "Traceback" not in output and "0999" in output, output
    assert "does not know" in " ".join(output.split()), output


@pytest.mark.parametrize(
    ("variable", "url"),
    [
        ("CONTROLROOM_DATABASE_URL", "postgresql+psycopg://u:s3cret-pw@127.0.0.1:notaport/db"),
        ("CONTROLROOM_MIGRATION_DATABASE_URL", "postgresql+psycopg://u:s3cret-pw@h:70000/db"),
        ("CONTROLROOM_BROKER_URL", "amqp://u:s3cret-pw@127.0.0.1:99999/"),
    ],
)
def test_a_url_whose_port_is_no_port_is_a_setting_refused_in_one_line(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch, variable: str, url: str
) -> None:
    monkeypatch.setenv(variable, url)

    code, output = invoke("migrate")

    assert code == 2, output
    assert "Traceback" not in output and "s3cret-pw" not in output
    assert variable in output and "port" in output, output
    assert "Value error" not in output  # our sentence, without pydantic's prefix


def test_migrate_reports_an_unreachable_database_in_one_line(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CONTROLROOM_DATABASE_URL", "postgresql+psycopg://nobody@127.0.0.1:1/x")

    code, output = invoke("migrate")

    assert code == 1
    assert "error:" in output and "Traceback" not in output


def test_a_command_names_a_missing_database_without_sqlalchemys_background(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    existing = servers.create_postgresql_database()  # the server is there (or a skip)
    servers.drop_postgresql_database(existing)
    missing = servers.scratch_name("missing")
    url = sa.make_url(existing).set(database=missing)
    monkeypatch.setenv("CONTROLROOM_DATABASE_URL", url.render_as_string(hide_password=False))

    code, output = invoke("sweep")

    assert code == 1, output
    assert f'database "{missing}" does not exist' in " ".join(output.split()), output
    assert "sqlalche.me" not in output and "Background on this error" not in output


def test_demo_publishes_to_the_embedded_error_queue(data_dir: Path) -> None:
    code, output = invoke("demo", "--count", "20", "--seed", "3")

    assert code == 0, output
    assert "Published 20 failed messages (seed 3)" in output
    queued = asyncio.run(drain(data_dir / "queue.db", "error", 20))
    expected = generate_demo_messages(20, seed=3, now=datetime.now(UTC))
    assert [d.body for d in queued] == [m.body for m in expected]
    assert [d.headers[h.MESSAGE_ID] for d in queued] == [m.headers[h.MESSAGE_ID] for m in expected]


def test_demo_beside_a_running_serve_says_that_serve_ingests_them(data_dir: Path) -> None:
    from controlroom.runtime import serve_lock

    with serve_lock.serving(data_dir, store="sqlite", broker="embedded"):
        code, output = invoke("demo", "--count", "12", "--seed", "3")

    assert code == 0, output
    flat = " ".join(output.split())
    assert "Next: `controlroom serve`" not in flat
    assert f"The controlroom serve running on {data_dir} ingests them now" in flat


def test_demo_reads_settings_from_a_toml_file(data_dir: Path, tmp_path: Path) -> None:
    config = tmp_path / "controlroom.toml"
    config.write_text('error_queue = "from-toml"\n')

    code, output = invoke("demo", "--count", "12", "--seed", "1", "--config", str(config))

    assert code == 0, output
    assert len(asyncio.run(drain(data_dir / "queue.db", "from-toml", 12))) == 12


@pytest.mark.parametrize(
    ("variable", "command"),
    [("CONTROLROOM_CONFIG", ["migrate"]), ("CONTROLROOM_SITE_CONFIG", ["site", "serve"])],
)
def test_a_settings_file_named_in_the_environment_must_exist(
    data_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    variable: str,
    command: list[str],
) -> None:
    """A missing file named by ``CONTROLROOM_CONFIG`` is refused as ``--config``'s is
    (fresh-user pass: a typo in it started the service on the defaults, without its
    tokens and database, and said nothing)."""
    missing = tmp_path / "nope.toml"
    monkeypatch.setenv(variable, str(missing))

    code, output = invoke(*command)

    assert code == 2, output
    # The error box wraps a long path at the terminal's width: read it unwrapped.
    flat = "".join(output.replace("│", " ").split())
    assert f"'{missing}'doesnotexist" in flat, output
    assert not data_dir.exists()  # nothing started on the defaults


@pytest.mark.parametrize("command", [["migrate"], ["site", "serve"]])
def test_a_settings_file_that_is_not_toml_is_refused_in_one_line(
    data_dir: Path, tmp_path: Path, command: list[str]
) -> None:
    """A file that does not parse as TOML is a settings error (exit 2, the parser's
    message), not a traceback (second fresh-user pass: 165 lines)."""
    config = tmp_path / "broken.toml"
    config.write_text("database_url =\n")

    code, output = invoke(*command, "--config", str(config))

    assert code == 2, output
    assert "not valid TOML" in output and "line 1" in output
    assert "Traceback" not in output


@pytest.mark.parametrize("command", [["migrate"], ["site", "serve"]])
def test_a_settings_file_that_is_a_pipe_is_refused(
    data_dir: Path, tmp_path: Path, command: list[str]
) -> None:
    """Breaker pass: ``--config <(...)`` (a pipe) was skipped without a word and serve ran
    on its defaults; a settings file is refused, never skipped."""
    pipe = tmp_path / "settings.toml"
    os.mkfifo(pipe)

    code, output = invoke(*command, "--config", str(pipe))

    assert code == 2, output
    assert "not a regular file" in " ".join(output.split()), output


@pytest.mark.parametrize(
    ("given", "said"),
    [
        ("", "--config is empty: name a TOML file"),
        ("{dir}", "is a directory, not a TOML file"),
        ("{dir}/missing.toml", "does not exist"),
    ],
)
@pytest.mark.parametrize("command", [["migrate"], ["site", "serve"]])
def test_a_settings_file_option_naming_no_file_says_what_it_names(
    data_dir: Path, tmp_path: Path, command: list[str], given: str, said: str
) -> None:
    """Fresh-user pass (second): ``--config ""`` said "file '' is a directory" (click
    read the empty path as the current directory)."""
    code, output = invoke(*command, "--config", given.format(dir=tmp_path))

    assert code == 2, output
    assert said in " ".join(output.replace("│", " ").split()), output


@pytest.mark.parametrize(
    ("variable", "command"),
    [("CONTROLROOM_CONFIG", ["migrate"]), ("CONTROLROOM_SITE_CONFIG", ["site", "serve"])],
)
def test_an_empty_settings_file_variable_is_refused(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch, variable: str, command: list[str]
) -> None:
    """Fresh-user pass: ``CONTROLROOM_CONFIG=`` (a script's variable left empty) was taken
    as no file, and the command ran on its defaults: a settings file is refused, never
    skipped."""
    monkeypatch.setenv(variable, "")
    monkeypatch.delenv("CONTROLROOM_SITE_SITE_ID", raising=False)  # site serve never starts

    code, output = invoke(*command)

    assert code == 2, output
    assert f"{variable} is empty: unset it, or name a TOML file" in " ".join(output.split())


@pytest.mark.parametrize("command", [["migrate"], ["site", "serve"]])
def test_a_settings_file_with_a_byte_order_mark_is_refused_saying_so(
    data_dir: Path, tmp_path: Path, command: list[str]
) -> None:
    """Windows editors may save UTF-8 with a byte order mark, which TOML does not allow:
    the parser's own words ("Invalid statement (at line 1, column 1)") did not say what
    was wrong with a file that looks right."""
    config = tmp_path / "bom.toml"
    config.write_bytes(b'\xef\xbb\xbfsite_id = "a"\n')

    code, output = invoke(*command, "--config", str(config))

    assert code == 2, output
    assert "byte order mark" in output and "without" in output
    assert "Traceback" not in output


@pytest.mark.parametrize("command", [["migrate"], ["site", "serve"]])
def test_a_settings_file_that_is_not_utf8_is_refused_in_one_line(
    data_dir: Path, tmp_path: Path, command: list[str]
) -> None:
    """Central's commands and the site agent's alike (breaker pass: the site agent printed
    a traceback of 111 lines)."""
    config = tmp_path / "latin1.toml"
    config.write_bytes(b'site_id = "\xff"\n')

    code, output = invoke(*command, "--config", str(config))

    assert code == 2, output
    assert "not valid TOML" in output and "UTF-8" in output
    assert "Traceback" not in output


@pytest.mark.parametrize(
    ("variable", "value", "named"),
    [
        ("CONTROLROOM_AUTH_TOKENS", "[{name:a}]", "line 1 column 3"),
        ("CONTROLROOM_NOTIFICATIONS", "{bad", "line 1 column 2"),
        ("CONTROLROOM_NOTIFICATIONS__RULES", "[bad", "line 1 column 2"),
        ("CONTROLROOM_SITES", "[", "line 1 column 2"),
    ],
)
def test_a_setting_that_is_not_json_names_its_variable_and_where(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch, variable: str, value: str, named: str
) -> None:
    """The variable as typed and the place the JSON parser stopped, without the library's
    own words (its source class, "error parsing value for field")."""
    monkeypatch.setenv(variable, value)

    code, output = invoke("migrate")

    assert code == 2, output
    assert f"({variable}): its value is not JSON" in output, output
    assert "(a list as [...], a table as {...}, strings in double quotes)" in output, output
    assert named in output, output
    assert "EnvSettingsSource" not in output and "error parsing" not in output, output
    assert len(output.strip().splitlines()) == 1, output


@pytest.mark.parametrize("value", ["", "  "])
@pytest.mark.parametrize("variable", ["CONTROLROOM_AUTH_TOKENS", "CONTROLROOM_SITES"])
def test_a_json_setting_set_empty_is_told_to_unset_it(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    """Fresh-user pass (sixth): ``CONTROLROOM_AUTH_TOKENS=''`` said "its value is not
    JSON ... Expecting value at line 1 column 1", where every other empty setting says
    to unset it."""
    monkeypatch.setenv(variable, value)

    code, output = invoke("migrate")

    assert code == 2, output
    assert f"({variable}): it is empty: unset it, or give its JSON (a list as [...]" in (
        " ".join(output.split())
    ), output


@pytest.mark.parametrize(
    ("variable", "value", "named"),
    [
        ("CONTROLROOM_SITES", '[{"id": "x"}]', "CONTROLROOM_SITES, item 0, field base_url"),
        (
            "CONTROLROOM_AUTH_TOKENS",
            '[{"name": "a", "role": "reader"}]',
            "CONTROLROOM_AUTH_TOKENS, item 0, field token",
        ),
        (
            "CONTROLROOM_NOTIFICATIONS__WEBHOOKS",
            '[{"name": "a", "url": "http://x"}]',
            "CONTROLROOM_NOTIFICATIONS__WEBHOOKS, item 0, field secret",
        ),
        (
            "CONTROLROOM_NOTIFICATIONS",
            '{"webhooks": [{"name": "a", "url": "http://x"}]}',
            "CONTROLROOM_NOTIFICATIONS, field webhooks, item 0, field secret",
        ),
        ("CONTROLROOM_KPI", '{"interval": 0}', "CONTROLROOM_KPI, field interval"),
        ("CONTROLROOM_KPI__INTERVAL", "0", "(CONTROLROOM_KPI__INTERVAL)"),
    ],
)
def test_a_field_inside_a_json_setting_is_named_by_the_variable_that_holds_it(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch, variable: str, value: str, named: str
) -> None:
    """A field of a list item (or of a table) given as JSON is named by the variable the
    user set, then the item and the field: no variable like CONTROLROOM_SITES__BASE_URL
    exists to set."""
    monkeypatch.setenv(variable, value)

    code, output = invoke("migrate")

    assert code == 2, output
    assert named in output, output
    assert "__BASE_URL" not in output and "__TOKEN" not in output and "__SECRET" not in output


@pytest.mark.parametrize(
    ("variable", "toml", "named", "meant"),
    [
        (None, "[ingestion]\nbatch_siz = 5\n", "ingestion.batch_siz", "batch_size"),
        ("CONTROLROOM_INGESTION__BATCH_SIZ", None, "ingestion.batch_siz", "batch_size"),
        (None, "prot = 5\n", "prot", "port"),
        (None, "[startup]\nwait_second = 5\n", "startup.wait_second", "wait_seconds"),
        (None, '[[sites]]\nid = "x"\nbase_url = "http://x"\ntokn = "x"\n', "sites.0.tokn", "token"),
    ],
)
def test_a_misspelt_setting_is_refused_naming_the_closest(
    data_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    variable: str | None,
    toml: str | None,
    named: str,
    meant: str,
) -> None:
    """A name that is no setting, in the settings file or in a table's variable, is
    refused (it was ignored: the setting it meant kept its default), with the setting
    meant when one is close."""
    args = ["migrate"]
    if variable is not None:
        monkeypatch.setenv(variable, "5")
    if toml is not None:
        config = tmp_path / "controlroom.toml"
        config.write_text(toml)
        args += ["--config", str(config)]

    code, output = invoke(*args)

    assert code == 2, output
    assert f"invalid setting {named} (" in output, output
    assert f"no such setting; did you mean {meant}?" in " ".join(output.split()), output


def test_a_misspelt_required_setting_is_refused_as_misspelt_not_also_as_missing(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fresh-user pass (second): ``CONTROLROOM_NOTIFICATIONS__SMTP__HOTS`` was refused with
    "smtp.host: Field required" first, then "did you mean host?"."""
    monkeypatch.setenv("CONTROLROOM_NOTIFICATIONS__SMTP__HOTS", "mail.example.org")

    code, output = invoke("migrate")

    assert code == 2, output
    assert "no such setting; did you mean host?" in " ".join(output.split()), output
    assert "Field required" not in output, output


@pytest.mark.parametrize(
    ("toml", "named"),
    [
        ("port = true\n", "port"),
        ("[ingestion]\nbatch_size = true\n", "ingestion.batch_size"),
        ("[ingestion]\nstop_grace_seconds = false\n", "ingestion.stop_grace_seconds"),
        ("error_retention_period = true\n", "error_retention_period"),
    ],
)
def test_true_or_false_for_a_number_in_the_settings_file_is_refused(
    data_dir: Path, tmp_path: Path, toml: str, named: str
) -> None:
    """TOML's booleans are no numbers: pydantic's lax mode reads ``true`` as 1 (one
    second, a batch of one), which the user did not mean."""
    config = tmp_path / "controlroom.toml"
    config.write_text(toml)

    code, output = invoke("migrate", "--config", str(config))

    assert code == 2, output
    assert f"invalid setting {named} (" in output, output
    assert "a number is wanted, not true or false" in " ".join(output.split()), output


def test_a_misspelt_name_in_the_file_names_the_file_when_the_tables_variable_is_set(
    data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file's ``[ingestion]`` and ``CONTROLROOM_INGESTION`` are merged: a name the
    variable's JSON does not hold comes from the file (breaker pass: only the variable
    was named, which holds no such name)."""
    config = tmp_path / "mix.toml"
    config.write_text("[ingestion]\nbatch_sze = 1\n")
    monkeypatch.setenv("CONTROLROOM_INGESTION", '{"workers": 0}')

    code, output = invoke("sweep", "--config", str(config))

    assert code == 2, output
    flat = "".join(output.split())
    assert f"invalidsettingingestion.batch_sze(in{config}):nosuchsetting" in flat, output


def test_a_misspelt_name_only_in_the_file_names_the_file_alone(
    data_dir: Path, tmp_path: Path
) -> None:
    """Fresh-user pass: a name misspelt in the file was said to be in the variable that
    would hold it "or in" the file, which set no variable."""
    config = tmp_path / "x.toml"
    config.write_text("[ingestion]\nbatch_siz = 1\n")

    code, output = invoke("migrate", "--config", str(config))

    assert code == 2, output
    flat = "".join(output.split())
    assert f"invalidsettingingestion.batch_siz(in{config}):nosuchsetting" in flat, output


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("amqp//someone:Sup3rSecretPw@127.0.0.1:5672/", "it must be an amqp:// or amqps:// URL"),
        ("http://someone:Sup3rSecretPw@127.0.0.1:5672/", "it must be an amqp:// or amqps:// URL"),
        # Fresh-user pass (third): reconnecting for ever, never refused; a vhost ' '. And
        # (fourth) each refused as "it must be an amqp:// URL", naming no part of it.
        ("amqp://someone:Sup3rSecretPw@rabbit..local:5672/", "its host is no host name"),
        ("amqp://someone:Sup3rSecretPw@bad_host!/", "its host is no host name"),
        # Breaker pass (third): waited for, then exit 1 (a webhook's URL refused it).
        ("amqp://someone:Sup3rSecretPw@999.1.1.1/", "its host is no host name"),
        # Breaker pass (fourth): a NUL reached RabbitMQ in the vhost, and in the user.
        ("amqp://someone:Sup3rSecretPw@127.0.0.1/v%00x", "no part of it may hold a NUL"),
        ("amqp://some%00one:Sup3rSecretPw@127.0.0.1/v", "no part of it may hold a NUL"),
        ("amqp://someone:Sup3rSecretPw@127.0.0.1:5672/ ", "it must be a URL without white space"),
        ("amqp://someone:Sup3rSecretPw@127.0.0.1:0/", "its port must be a number from 1 to 65535"),
        ("amqp://someone:Sup3rSecretPw@rabbit:99999/", "its port must be a number from 1 to"),
        (
            "amqp://someone:Sup3rSecretPw@::1:5672/",
            "its port must be a number from 1 to 65535 (an IPv6 address goes in brackets",
        ),
    ],
)
def test_a_broker_url_that_is_no_amqp_url_is_refused_without_its_password(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch, url: str, said: str
) -> None:
    """Fresh-user pass: ``amqp//...`` (a colon missing) was taken for RabbitMQ, retried
    for ever, and aio-pika's reconnect line logged the password every 5 s."""
    monkeypatch.setenv("CONTROLROOM_BROKER_URL", url)

    code, output = invoke("migrate")

    assert code == 2, output
    assert f"invalid setting broker_url (CONTROLROOM_BROKER_URL): {said}" in (
        " ".join(output.split())
    ), output
    assert "Sup3rSecretPw" not in output


def test_a_database_url_naming_a_driver_not_installed_is_refused_in_one_line(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fresh-user pass: ``postgresql+psycopg2://`` printed a traceback ending in
    ``ModuleNotFoundError``; ``postgres://`` was already one line."""
    monkeypatch.setenv("CONTROLROOM_DATABASE_URL", "postgresql+psycopg2://postgres@127.0.0.1/x")

    code, output = invoke("migrate")

    assert code != 0 and "Traceback" not in output, output
    assert "database driver 'psycopg2' is not installed; give the URL as postgresql://" in (
        " ".join(output.split())
    ), output


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("notaurl", "it must be a database URL (sqlite:///path/to/file.db, postgresql://"),
        ("mysql://u:Sup3rSecretPw@db/x", "database provider 'mysql' is not supported; use one of"),
        # Fresh-user pass (second): a misspelt driver failed at the first connection with
        # SQLAlchemy's NoSuchModuleError, naming no setting.
        (
            "postgresql+pyscopg://u:Sup3rSecretPw@db/x",
            "SQLAlchemy knows no database driver 'pyscopg' for postgresql; give the URL as "
            "postgresql://",
        ),
        ("sqlite+pysqlit:///x.db", "SQLAlchemy knows no database driver 'pysqlit' for sqlite"),
        # ... no database named: libpq took the user's name, and serve migrated ``postgres``.
        ("postgresql://u:Sup3rSecretPw@127.0.0.1:5432", "it names no database"),
        ("postgresql://u:Sup3rSecretPw@127.0.0.1:5432/", "it names no database"),
        # ... an option libpq does not know was refused only by the first connection.
        (
            "postgresql://u@db/x?sslmod=disable&password=Sup3rSecretPw",
            'libpq knows no connection option "sslmod" in its query',
        ),
        # Fresh-user pass (third): a traceback of 439 lines; the wrong database, waited
        # for as unreachable; the default port taken for 0.
        ("postgresql://u:Sup3rSecretPw@db..local:5432/x", "its host is no host name"),
        ("postgresql://u:Sup3rSecretPw@bad_host!/x", "its host is no host name"),
        ("postgresql://u:Sup3rSecretPw@999.1.1.1/x", "its host is no host name"),
        # Breaker pass (fourth): taken, then waited for, or another user connected.
        ("postgresql://u:Sup3rSecretPw@db/x?hostaddr=999.1.1.1", "its hostaddr is no IP"),
        ("postgresql://u:Sup3rSecretPw@db/x?user=evil", "the user goes before its host"),
        (
            "postgresql://u:Sup3rSecretPw@db/x?port=5432,5433",
            "it gives more than one port, but not one for each of its hosts",
        ),
        ("postgresql://u:Sup3rSecretPw@127.0.0.1:5432/x ", "it must be a URL without white space"),
        ("postgresql://u:Sup3rSecretPw@127.0.0.1:0/x", "its port must be a number from 1 to"),
        # Fresh-user pass (fourth): libpq's options in the query skipped the checks (a bad
        # host was waited for as unreachable), and a port out of range, a port that is no
        # number and a host missing its bracket were all "a number from 0 to 65535".
        ("postgresql://u:Sup3rSecretPw@127.0.0.1/x?host=bad_host!", "its host is no host name"),
        ("postgresql://u:Sup3rSecretPw@127.0.0.1/x?port=0", "its port must be a number from 1"),
        ("postgresql://u:Sup3rSecretPw@db/x?port=99999", "its port must be a number from 1"),
        ("postgresql://u:Sup3rSecretPw@db:99999/x", "its port must be a number from 1 to 65535"),
        ("postgresql://u:Sup3rSecretPw@db:abc/x", "its port must be a number from 1 to 65535"),
        ("postgresql://u:Sup3rSecretPw@[::1/x", "its host must be a host name or an IP address;"),
        # Breaker pass (third): libpq cut the connection string at a NUL, so serve
        # connected as another user (the URL's user and password dropped); a database
        # name ending in a space was waited for; ?dbname= migrated another database.
        ("postgresql://u:Sup3rSecretPw@127.0.0.1/x%00", "no part of it may hold a NUL"),
        ("postgresql://u%00x:Sup3rSecretPw@127.0.0.1/x", "no part of it may hold a NUL"),
        ("postgresql://u:Sup3rSecretPw@127.0.0.1/x?application_name=a%00", "no part of it may"),
        ("postgresql://u:Sup3rSecretPw@127.0.0.1/x%20", "its database begins or ends with"),
        ("postgresql://u:Sup3rSecretPw@127.0.0.1/x?dbname=y", "the database goes in its path"),
        # Breaker pass (second): ?mode=ro was ignored by the driver, and the store written.
        ("sqlite:///x.db?mode=ro", "the SQLite driver ignores options in its query"),
        ("postgresql://u:Sup3rSecretPw@127.0.0.1/x#y", "it holds a '#'"),
        ("sqlite:///x.db?timeout=abc", "the SQLite driver cannot read its query's options"),
        # Breaker pass (fifth): libpq refuses these values before it connects, and serve
        # waited for the store as unreachable.
        (
            "postgresql://u:Sup3rSecretPw@127.0.0.1/x?sslmode=disabled",
            "its sslmode must be one of disable, allow, prefer, require, verify-ca, verify-full",
        ),
        ("postgresql://u:Sup3rSecretPw@127.0.0.1/x?target_session_attrs=rw", "its target_ses"),
        ("postgresql://u:Sup3rSecretPw@127.0.0.1/x?connect_timeout=ten", "its connect_timeout"),
    ],
)
@pytest.mark.parametrize("setting", ["database_url", "migration_database_url"])
def test_a_database_url_that_is_no_url_of_a_supported_database_is_refused_naming_it(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch, setting: str, url: str, said: str
) -> None:
    """Fresh-user pass: ``notaurl`` said "the database: ArgumentError: Could not parse
    SQLAlchemy URL" and exited 1, naming no setting."""
    variable = f"CONTROLROOM_{setting.upper()}"
    monkeypatch.setenv(variable, url)

    code, output = invoke("migrate")

    assert code == 2, output
    assert f"invalid setting {setting} ({variable}): {said}" in " ".join(output.split()), output
    assert "Sup3rSecretPw" not in output


@pytest.mark.parametrize("name", ["", "  ", "\t", " error", "error "])
@pytest.mark.parametrize("queue", ["ERROR_QUEUE", "TELEMETRY_QUEUE"])
def test_an_empty_or_blank_queue_name_is_refused(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch, queue: str, name: str
) -> None:
    """Fresh-user pass: an empty ``CONTROLROOM_ERROR_QUEUE`` started serve, whose intake
    worker then failed and restarted in a loop while health said ok; a name of spaces
    was taken (a queue nobody publishes to, by mistake), and (second pass) so was a name
    beginning or ending with one."""
    monkeypatch.setenv(f"CONTROLROOM_{queue}", name)

    code, output = invoke("migrate")

    assert code == 2, output
    assert f"invalid setting {queue.lower()} (CONTROLROOM_{queue})" in output, output


@pytest.mark.parametrize("command", [["migrate"], ["serve", "--port", "0"]])
def test_a_data_directory_that_is_a_file_is_refused_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: list[str]
) -> None:
    """Fresh-user pass: ``CONTROLROOM_DATA_DIR`` naming a file ended in a traceback of
    about 100 lines (``FileExistsError``)."""
    a_file = tmp_path / "not-a-directory"
    a_file.write_text("")
    monkeypatch.setenv("CONTROLROOM_DATA_DIR", str(a_file))

    code, output = invoke(*command)

    assert code == 2, output
    assert "invalid setting data_dir (CONTROLROOM_DATA_DIR): it names a file" in (
        " ".join(output.split())
    ), output
    assert "Traceback" not in output


def test_a_data_directory_under_a_file_is_refused_by_the_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fresh-user pass (sixth): a data directory under a file was refused by the database
    code ("cannot make the database's directory ...: Not a directory"), exit 1, not by
    the setting."""
    a_file = tmp_path / "not-a-directory"
    a_file.write_text("")
    monkeypatch.setenv("CONTROLROOM_DATA_DIR", str(a_file / "data"))

    code, output = invoke("migrate")

    assert code == 2, output
    assert (
        "invalid setting data_dir (CONTROLROOM_DATA_DIR): it is under a file, not a "
        f"directory: {a_file}"
    ) in " ".join(output.split()), output


def test_a_data_directory_under_home_is_under_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fresh-user pass (fourth): ``CONTROLROOM_DATA_DIR='~/cr'`` made a directory named
    ``~`` where serve ran."""
    monkeypatch.setenv("HOME", str(tmp_path))
    assert Settings(data_dir="~/cr").data_dir == tmp_path / "cr"
    # ... and (fifth) ~nouser ended in a traceback (RuntimeError).
    with pytest.raises(ValidationError, match="no home directory is known for ~no-such-user"):
        Settings(data_dir="~no-such-user/cr")


@pytest.mark.parametrize("value", ["controlroom-data\n", "data\tdir", "data\u00a0dir"])
def test_a_data_directory_holding_a_control_character_is_refused(value: str) -> None:
    """Breaker pass (fifth): a value copied with its line break made a directory whose
    name ends in one. A no-break space (copied from a web page) is refused too, and the
    refusal names white space: it is no control character."""
    with pytest.raises(
        ValidationError,
        match="a path holds no control character and no white space but the space",
    ):
        Settings(data_dir=value)


def test_an_empty_data_directory_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fresh-user pass: ``CONTROLROOM_DATA_DIR=`` put the store in the current directory."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CONTROLROOM_DATA_DIR", "")

    code, output = invoke("migrate")

    assert code == 2, output
    assert "invalid setting data_dir (CONTROLROOM_DATA_DIR): it is empty" in (
        " ".join(output.split())
    ), output
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "url",
    [
        "sqlite://",
        "sqlite:///:memory:",
        # Breaker pass (third): migrated, then a traceback from the serve lock.
        "sqlite:///file:memdb?mode=memory&cache=shared&uri=true",
        # Fresh-user pass (sixth): SQLite's own shared in-memory name migrated, then
        # serve ended in a traceback (FileNotFoundError) and sweep swept a vanishing store.
        "sqlite:///file::memory:?cache=shared&uri=true",
        "sqlite:///file:?uri=true",
    ],
)
def test_an_in_memory_sqlite_database_is_refused(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch, url: str
) -> None:
    """Breaker pass: serve started on ``sqlite://`` with health ok, each connection seeing
    its own empty database: lists answered 500 and the worker failed every few seconds.
    Refused by the settings, naming the setting (breaker pass, fifth)."""
    monkeypatch.setenv("CONTROLROOM_DATABASE_URL", url)

    code, output = invoke("migrate")

    assert code == 2, output
    assert "invalid setting database_url (CONTROLROOM_DATABASE_URL): an in-memory SQLite" in (
        " ".join(output.split())
    ), output


def test_a_sqlite_path_that_is_no_uri_with_uri_true_is_refused(
    data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fresh-user pass (sixth): with ``uri=true`` SQLite reads the path as a URI only when
    it starts with ``file:``; ``sqlite:////dir/ro.db?mode=ro&uri=true`` made and migrated a
    file named ``ro.db?mode=ro``, neither read-only nor the store meant."""
    store = tmp_path / "stores"
    monkeypatch.setenv("CONTROLROOM_DATABASE_URL", f"sqlite:///{store}/ro.db?mode=ro&uri=true")

    code, output = invoke("migrate")

    assert code == 2, output
    assert (
        "invalid setting database_url (CONTROLROOM_DATABASE_URL): with uri=true SQLite reads "
        "a path as a URI only when it starts with file:"
    ) in " ".join(output.split()), output
    assert not store.exists()


def test_a_sqlite_file_uri_makes_its_own_directory_and_no_other(
    data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fresh-user pass (sixth): ``sqlite:///file:/dir/x.db?uri=true`` made a directory named
    ``file:`` under the working directory (the path's parent taken as written); the
    store's own directory is the URI's path, percent-decoded as SQLite decodes it."""
    monkeypatch.chdir(tmp_path)
    store = tmp_path / "my stores" / "x.db"
    url = f"sqlite:///file:{tmp_path}/my%20stores/x.db?uri=true"
    monkeypatch.setenv("CONTROLROOM_DATABASE_URL", url)

    code, output = invoke("migrate")

    assert code == 0, output
    assert store.is_file()
    assert not (tmp_path / "file:").exists()


@pytest.mark.parametrize("command", [["serve", "--port", "0"], ["sweep"]])
def test_a_read_only_sqlite_store_is_refused_at_start(
    data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: list[str]
) -> None:
    """Fresh-user pass (seventh): ``sqlite:///file:/path?mode=ro&uri=true`` on a migrated
    store was taken by serve: health 200, then every sweep, sample and retry failed with a
    traceback and the API answered 500. A store Controlroom cannot write is refused at
    start, saying what to change."""
    store = tmp_path / "stores" / "x.db"
    monkeypatch.setenv("CONTROLROOM_DATABASE_URL", f"sqlite:///{store}")
    assert invoke("migrate")[0] == 0
    monkeypatch.setenv("CONTROLROOM_DATABASE_URL", f"sqlite:///file:{store}?mode=ro&uri=true")

    code, output = invoke(*command)

    assert code == 1, output
    said = " ".join(output.split())
    assert "attempt to write a readonly database" in said, output
    assert "Controlroom writes its store" in said, output
    assert "Traceback" not in output


def test_a_missing_sqlite_file_that_may_not_be_made_is_named(
    data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fresh-user pass (seventh): ``mode=rw`` (or ``ro``) opens only a file that exists, and
    a missing one said "unable to open database file" without naming it."""
    store = tmp_path / "stores" / "missing.db"
    monkeypatch.setenv("CONTROLROOM_DATABASE_URL", f"sqlite:///file:{store}?mode=rw&uri=true")

    code, output = invoke("migrate")

    assert code == 1, output
    said = " ".join(output.split())
    assert f"the database file {store} does not exist" in said, output
    assert "mode=rw" in said, output


@pytest.mark.postgresql
def test_a_postgresql_store_that_takes_no_writes_is_refused_at_start(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch, postgresql_url: str
) -> None:
    """As a read-only SQLite store: a standby or a read-only session
    (``default_transaction_read_only``) would serve reads and fail every write."""
    url = sa.make_url(postgresql_url)
    monkeypatch.setenv("CONTROLROOM_DATABASE_URL", url.render_as_string(hide_password=False))
    assert invoke("migrate")[0] == 0
    read_only = url.update_query_dict({"options": "-cdefault_transaction_read_only=on"})
    monkeypatch.setenv("CONTROLROOM_DATABASE_URL", read_only.render_as_string(hide_password=False))

    code, output = invoke("serve", "--port", "0")

    assert code == 1, output
    said = " ".join(output.split())
    assert "cannot execute UPDATE in a read-only transaction" in said, output
    assert "Controlroom writes its store" in said, output
    assert "Traceback" not in output


def test_an_intake_cgroup_that_does_not_exist_is_named_by_serve_alone(
    data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fresh-user pass (seventh): a cgroup path with a typo was refused as "no cgroup
    directory" without its path, and by ``sweep`` too, which starts no worker."""
    cgroup = tmp_path / "no-such-cgroup"
    monkeypatch.setenv("CONTROLROOM_INGESTION__CPU_CGROUP", str(cgroup))

    swept, output = invoke("sweep")
    assert swept == 0, output

    code, output = invoke("serve", "--port", "0")

    assert code == 2, output
    said = " ".join(output.split())
    assert (
        "invalid setting ingestion.cpu_cgroup (CONTROLROOM_INGESTION__CPU_CGROUP): "
        f"{cgroup} does not exist"
    ) in said, output


def test_a_database_directory_that_cannot_be_made_is_refused_in_one_line(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CONTROLROOM_DATABASE_URL", "sqlite:////proc/no-such-place/store.db")

    code, output = invoke("migrate")

    assert code == 1, output
    assert "cannot make the database's directory /proc/no-such-place" in (
        " ".join(output.split())
    ), output
    assert "Traceback" not in output


@pytest.mark.postgresql
def test_a_search_path_schema_that_does_not_exist_is_named_as_the_cause(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch, postgresql_url: str
) -> None:
    """Fresh-user pass (sixth): migrate said only "InvalidSchemaName: no schema has been
    selected to create in"."""
    url = sa.make_url(postgresql_url).update_query_dict({"options": "-csearch_path=no_such"})
    monkeypatch.setenv("CONTROLROOM_DATABASE_URL", url.render_as_string(hide_password=False))

    code, output = invoke("migrate")

    assert code == 1, output
    said = " ".join(output.split())
    assert "InvalidSchemaName: no schema has been selected to create in" in said
    assert "the schema that search_path names does not exist in this database" in said


@pytest.mark.postgresql
def test_a_database_password_given_in_the_query_is_never_shown(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch, postgresql_url: str
) -> None:
    """Breaker pass: ``?password=`` (libpq's keyword, which SQLAlchemy passes on) was
    printed whole by migrate, serve's start-up line and its errors, while a password
    before the host was hidden."""
    url = sa.make_url(postgresql_url).update_query_dict({"password": "S3CRETPW"})
    monkeypatch.setenv("CONTROLROOM_DATABASE_URL", url.render_as_string(hide_password=False))

    code, output = invoke("migrate")

    assert code == 0, output
    assert "S3CRETPW" not in output
    assert "password=***" in output, output


@pytest.mark.parametrize("queue", ["ERROR_QUEUE", "TELEMETRY_QUEUE"])
def test_a_queue_name_rabbitmq_reserves_is_refused(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch, queue: str
) -> None:
    """Breaker pass: ``amq.brk`` started serve, whose worker then failed to declare the
    queue (ACCESS_REFUSED) and restarted in a loop; refused on either transport, as a name
    valid on one is valid on the other."""
    monkeypatch.setenv(f"CONTROLROOM_{queue}", "amq.brk")

    code, output = invoke("migrate")

    assert code == 2, output
    assert "RabbitMQ reserves the names that start with amq." in " ".join(output.split())


def test_one_queue_for_failed_messages_and_telemetry_is_refused(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fresh-user pass: ``CONTROLROOM_TELEMETRY_QUEUE=error`` started serve, and the error
    queue's intake took telemetry packets as failed imports (no ``NServiceBus.FailedQ``),
    losing site calls from their mirror."""
    monkeypatch.setenv("CONTROLROOM_TELEMETRY_QUEUE", "error")

    code, output = invoke("migrate")

    assert code == 2, output
    assert "error_queue and telemetry_queue are both 'error'" in " ".join(output.split()), output


@pytest.mark.parametrize(
    "name", ["http://proxy.example", "proxy.example:8443", "*", "", "proxy.example/api"]
)
def test_an_allowed_host_that_no_host_header_could_match_is_refused(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    """Fresh-user pass: a scheme, a port or ``*`` was taken, and every request then got 421
    (a Host header is compared by name, at any port)."""
    monkeypatch.setenv("CONTROLROOM_ALLOWED_HOSTS", json.dumps(["proxy2.example", name]))

    code, output = invoke("migrate")

    assert code == 2, output
    assert "invalid setting allowed_hosts" in output, output
    assert "without scheme, port or path" in " ".join(output.split()), output


def test_allowed_hosts_take_names_and_addresses(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    names = ["proxy.example", "Proxy.Example.", "10.0.0.5", "[fd00::5]", "ops-1"]
    monkeypatch.setenv("CONTROLROOM_ALLOWED_HOSTS", json.dumps(names))

    code, output = invoke("migrate")

    assert code == 0, output


@pytest.mark.parametrize(
    ("variables", "named", "said"),
    [
        ({"PREFETCH": "70000"}, "ingestion.prefetch", "less than or equal to 65535"),
        (
            {"BATCH_SIZE": "10000", "CONCURRENT_BATCHES": "7"},
            "ingestion",
            "batch_size x concurrent_batches is 70000, more than a prefetch may be (65535",
        ),
    ],
)
def test_a_prefetch_past_amqps_limit_is_refused(
    data_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    variables: dict[str, str],
    named: str,
    said: str,
) -> None:
    """AMQP's prefetch count is a 16-bit number: a larger one stalled the intake at its
    first ``basic.qos`` while serve looked healthy."""
    for name, value in variables.items():
        monkeypatch.setenv(f"CONTROLROOM_INGESTION__{name}", value)

    code, output = invoke("migrate")

    assert code == 2, output
    assert f"invalid setting {named} (" in output, output
    assert said in " ".join(output.split()), output


@pytest.mark.parametrize(
    ("variable", "setting"),
    [
        ("CONTROLROOM_ERROR_RETENTION_PERIOD", "error_retention_period"),
        ("CONTROLROOM_INGESTION__STOP_GRACE_SECONDS", "ingestion.stop_grace_seconds"),
    ],
)
@pytest.mark.parametrize("value", ["P15Q", "fifteen days", "", "PT1H1H", "1h", "5m"])
def test_a_duration_that_does_not_parse_is_refused_naming_its_forms_once(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch, variable: str, setting: str, value: str
) -> None:
    """Fresh-user pass (sixth): ``1h`` was refused with pydantic's '"day" identifier in
    duration not correctly formatted' before the forms, ``PT1H1H`` named "each part at
    most once" twice, and ``5m`` for a setting in seconds said only "Input should be a
    valid number"."""
    monkeypatch.setenv(variable, value)

    code, output = invoke("migrate")

    assert code == 2, output
    said = " ".join(output.split())
    forms = (
        "a duration is ISO 8601 (P30D, PT12H, P1DT6H: each part at most once, in that order) "
        "or a positive number of seconds (3600)"
    )
    assert f"invalid setting {setting} ({variable}): it is no duration; {forms}" in said, said
    assert said.count("at most once") == 1, said


@pytest.mark.parametrize(
    ("variable", "setting"),
    [
        ("CONTROLROOM_INGESTION__STOP_GRACE_SECONDS", "ingestion.stop_grace_seconds"),
        ("CONTROLROOM_STARTUP__WAIT_SECONDS", "startup.wait_seconds"),
    ],
)
@pytest.mark.parametrize("value", ["nan", "inf"])
def test_a_number_of_seconds_that_is_no_number_is_refused_as_such(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch, variable: str, setting: str, value: str
) -> None:
    """ "nan" was refused as "less than or equal to 600" and "inf" passed a check with no
    upper bound: neither is a number of seconds."""
    monkeypatch.setenv(variable, value)

    code, output = invoke("migrate")

    assert code == 2, output
    assert f"invalid setting {setting} ({variable}): it is no duration" in (
        " ".join(output.split())
    ), output


def test_a_variable_that_names_no_setting_is_ignored_with_a_warning(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pydantic-settings ignores a variable under the prefix that names no setting: the
    command says so, with the variable meant, and goes on; the demo's and the site
    agent's own variables are no warning."""
    monkeypatch.setenv("CONTROLROOM_PROT", "9000")
    monkeypatch.setenv("CONTROLROOM_SITE_SITE_ID", "plant-7")
    monkeypatch.setenv("CONTROLROOM_DEMO_QUIET_LOGS", "1")

    code, output = invoke("migrate")

    assert code == 0, output
    warnings = [line for line in output.splitlines() if line.startswith("warning:")]
    assert warnings == [
        "warning: CONTROLROOM_PROT names no setting and is ignored; did you mean CONTROLROOM_PORT?"
    ], output


@pytest.mark.parametrize(
    ("variable", "meant"),
    [
        ("CONTROLROOM_INGESTION_BATCH_SIZE", "CONTROLROOM_INGESTION__BATCH_SIZE"),
        ("CONTROLROOM_STOP_GRACE_SECONDS", "CONTROLROOM_INGESTION__STOP_GRACE_SECONDS"),
    ],
)
def test_a_variable_meaning_a_tables_setting_is_pointed_to_its_variable(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch, variable: str, meant: str
) -> None:
    """Fresh-user pass: a single underscore before a table's field, or the field's name
    alone, was pointed to an unrelated setting (``CONTROLROOM_INGEST_ON_SERVE``) or to none."""
    monkeypatch.setenv(variable, "5")

    code, output = invoke("migrate")

    assert code == 0, output
    flat = " ".join(output.split())
    assert f"warning: {variable} names no setting and is ignored; did you mean {meant}?" in (
        flat
    ), output


@pytest.mark.parametrize("given", ["batch_size", "batch_siz"])
def test_a_tables_setting_at_the_files_top_level_is_pointed_to_its_table(
    data_dir: Path, tmp_path: Path, given: str
) -> None:
    """Misspelt too (fresh-user pass, sixth: ``batch_siz`` at the top named nothing)."""
    config = tmp_path / "controlroom.toml"
    config.write_text(f"{given} = 500\n")

    code, output = invoke("migrate", "--config", str(config))

    assert code == 2, output
    assert "no such setting; did you mean ingestion.batch_size?" in " ".join(output.split())


@pytest.mark.parametrize(
    ("variable", "command", "said"),
    [
        ("CONTROLROOM_PORT__X", ["migrate"], "CONTROLROOM_PORT is one setting, not a table"),
        (
            "CONTROLROOM_SITE_PORT__X",
            ["site", "serve"],
            "CONTROLROOM_SITE_PORT is one setting, not a table",
        ),
        (
            "CONTROLROOM_INGESTOIN__BATCH_SIZE",
            ["migrate"],
            "no settings table is named INGESTOIN; did you mean CONTROLROOM_INGESTION__BATCH_SIZE?",
        ),
        (
            "CONTROLROOM_SITE_OUTBOX__BATCH",
            ["site", "serve"],
            "no settings table is named OUTBOX; did you mean CONTROLROOM_SITE_OUTBOX_BATCH?",
        ),
    ],
)
def test_a_nested_variable_that_names_no_table_is_refused(
    data_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    variable: str,
    command: list[str],
    said: str,
) -> None:
    """pydantic-settings drops a nested variable (``__``) whose first part is no table: the
    breaker's ``CONTROLROOM_PORT__X=5`` left the port at 8080, the fresh user's
    ``CONTROLROOM_INGESTOIN__BATCH_SIZE=5`` the batch size at 500, with only a warning.
    A file's ``[ingestoin]`` is refused; so is the variable, naming the one meant."""
    monkeypatch.setenv(variable, "5")
    monkeypatch.delenv("CONTROLROOM_SITE_SITE_ID", raising=False)  # site serve never starts

    code, output = invoke(*command)

    assert code == 2, output
    flat = " ".join(output.split())
    assert f"error: {variable} is refused: {said}" in flat, output


def test_a_field_of_a_list_item_in_the_settings_file_names_no_variable_that_cannot_exist(
    data_dir: Path, tmp_path: Path
) -> None:
    config = tmp_path / "controlroom.toml"
    config.write_text('[[sites]]\nid = "x"\n')

    code, output = invoke("migrate", "--config", str(config))

    assert code == 2, output
    assert "sites.0.base_url" in output and str(config) in "".join(output.split()), output
    assert "CONTROLROOM_SITES__BASE_URL" not in output, output


RULE_TO_AN_UNKNOWN_WEBHOOK = (
    '[{"name": "r", "event_types": ["IntakeStalled"], "channel": "Webhook", "target": "nope"}]'
)
TWO_WEBHOOKS_NAMED_A = json.dumps(
    [{"name": "a", "url": f"http://{host}", "secret": WEBHOOK_SECRET} for host in ("x", "y")]
)


@pytest.mark.parametrize(
    ("variables", "named"),
    [
        (
            {"CONTROLROOM_NOTIFICATIONS__RULES": RULE_TO_AN_UNKNOWN_WEBHOOK},
            "(CONTROLROOM_NOTIFICATIONS__RULES)",
        ),
        (
            {"controlroom_notifications__rules": RULE_TO_AN_UNKNOWN_WEBHOOK},
            "(controlroom_notifications__rules)",
        ),
        (
            {"CONTROLROOM_NOTIFICATIONS__WEBHOOKS": TWO_WEBHOOKS_NAMED_A},
            "(CONTROLROOM_NOTIFICATIONS__WEBHOOKS)",
        ),
        (
            {
                "CONTROLROOM_NOTIFICATIONS__WEBHOOKS": TWO_WEBHOOKS_NAMED_A,
                "CONTROLROOM_NOTIFICATIONS__SEND_TIMEOUT": "5",
            },
            "(CONTROLROOM_NOTIFICATIONS__SEND_TIMEOUT and CONTROLROOM_NOTIFICATIONS__WEBHOOKS)",
        ),
    ],
)
def test_a_check_on_a_whole_table_names_the_variables_set_that_make_it_up(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch, variables: dict[str, str], named: str
) -> None:
    """A table's own check (a rule naming an unknown webhook, two webhooks of one name)
    names the variables the user set, as spelled, not the table's own variable, unset."""
    for variable, value in variables.items():
        monkeypatch.setenv(variable, value)

    code, output = invoke("migrate")

    assert code == 2, output
    assert f"invalid setting notifications {named}: " in output, output
    assert "(CONTROLROOM_NOTIFICATIONS)" not in output, output
    assert WEBHOOK_SECRET not in output, output


def test_a_check_on_a_whole_table_names_the_settings_file_too(
    data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "controlroom.toml"
    config.write_text("[notifications]\nsend_timeout = 5.0\n")
    monkeypatch.setenv("CONTROLROOM_NOTIFICATIONS__RULES", RULE_TO_AN_UNKNOWN_WEBHOOK)

    code, output = invoke("migrate", "--config", str(config))

    assert code == 2, output
    flat = "".join(output.split())
    assert f"(CONTROLROOM_NOTIFICATIONS__RULESorin{config})" in flat, output


@pytest.mark.parametrize(
    ("variables", "reason"),
    [
        (
            {
                "CONTROLROOM_NOTIFICATIONS__WEBHOOKS": json.dumps(
                    [{"name": "a", "url": "http://x", "secret": WEBHOOK_SECRET}]
                ),
                "CONTROLROOM_NOTIFICATIONS__RULES": json.dumps(
                    [
                        {
                            "name": "r",
                            "event_types": ["IntakeStalled"],
                            "channel": "Webhook",
                            "target": "a",
                            "site": "s1",
                        }
                    ]
                ),
            },
            "names site 's1', which is not configured in sites",
        ),
        (
            {
                "CONTROLROOM_AUTH_TOKENS": json.dumps(
                    [{"name": "a", "role": "reader", "token": "t" * 20}]
                ),
                "CONTROLROOM_SITES": json.dumps(
                    [{"id": "s", "base_url": "http://x", "central_token": "t" * 20}]
                ),
            },
            "a token is configured twice",
        ),
    ],
)
def test_a_check_across_settings_names_no_variable_that_cannot_exist(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch, variables: dict[str, str], reason: str
) -> None:
    """A check comparing settings (a rule's site against ``sites``) has no one place: it
    is refused as a check across the settings, its message naming those it compares."""
    for variable, value in variables.items():
        monkeypatch.setenv(variable, value)

    code, output = invoke("migrate")

    assert code == 2, output
    assert output.startswith("error: invalid settings: "), output
    assert reason in output, output
    assert "CONTROLROOM_*" not in output and "setting settings" not in output, output
    assert "t" * 20 not in output, output


@pytest.mark.parametrize(
    ("variable", "whole"),
    [
        ("CONTROLROOM_SITES__0__BASE_URL", "CONTROLROOM_SITES"),
        ("controlroom_sites__0__base_url", "CONTROLROOM_SITES"),
        ("CONTROLROOM_AUTH_TOKENS__0__TOKEN", "CONTROLROOM_AUTH_TOKENS"),
        ("CONTROLROOM_NOTIFICATIONS__RULES__0__NAME", "CONTROLROOM_NOTIFICATIONS__RULES"),
    ],
)
def test_a_list_item_given_in_a_nested_variable_says_a_list_is_given_whole_as_json(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch, variable: str, whole: str
) -> None:
    """No variable sets a list's item: the refusal names the variable set and the one
    that takes the list, whole, as JSON."""
    monkeypatch.setenv(variable, "not-a-list-item")

    code, output = invoke("migrate")

    assert code == 2, output
    assert f"({variable}): Input should be a valid list" in output, output
    assert f"a list setting is given whole as JSON in {whole}" in output, output
    assert "not-a-list-item" not in output, output


def test_demo_refuses_a_count_below_the_showcase(data_dir: Path) -> None:
    code, output = invoke("demo", "--count", "3")

    assert code == 2
    assert "--count" in output


def test_demo_ends_with_the_commands_to_run_next_unless_make_demo_runs_them(
    data_dir: Path,
) -> None:
    code, output = invoke("demo", "--count", "12", "--seed", "1")
    assert code == 0, output
    assert "controlroom serve" in output and "controlroom demo endpoints" in output
    assert "controlroom demo notifications" in output

    code, output = invoke("demo", "--count", "12", "--seed", "1", "--no-next-steps")
    assert code == 0, output
    assert "Published 12 failed messages" in output
    assert "controlroom serve" not in output and "controlroom demo endpoints" not in output


def test_demo_options_before_a_subcommand_are_refused_not_ignored(data_dir: Path) -> None:
    code, output = invoke("demo", "--count", "20", "endpoints")

    assert code == 2
    assert "--count" in output
    assert not (data_dir / "queue.db").exists()  # nothing published


def test_a_settings_file_from_the_environment_is_no_option_given_to_demo(
    data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``CONTROLROOM_CONFIG`` reaches ``controlroom demo``'s ``--config`` too, but is not
    an option given before the subcommand: ``demo endpoints`` is not refused for it
    (second fresh-user pass). Its own invalid option still is, so the command ends."""
    config = tmp_path / "controlroom.toml"
    config.write_text('error_queue = "from-toml"\n')
    monkeypatch.setenv("CONTROLROOM_CONFIG", str(config))

    code, output = invoke("demo", "endpoints", "--fail-ratio", "1.5")

    assert code == 2
    assert "is an option of `controlroom demo` alone" not in output, output
    assert "--fail-ratio" in output


def test_demo_endpoints_refuses_a_fail_ratio_above_one(data_dir: Path) -> None:
    code, output = invoke("demo", "endpoints", "--fail-ratio", "1.5")

    assert code == 2
    assert "--fail-ratio" in output


# --- import-failed ------------------------------------------------------------------------
def failed_import(n: int) -> FailedImport:
    headers = {h.MESSAGE_ID: f"broken-{n}", h.TIME_OF_FAILURE: "2026-01-01 00:00:00:000000 Z"}
    return FailedImport(
        id=str(uuid.UUID(int=1000 + n)),
        queue="error",
        headers_json=json.dumps(headers, sort_keys=True),
        body=b"\x00body " + str(n).encode(),
        reason=f"header {h.FAILED_Q} is missing or empty",
        failed_at=at(n),
    )


def stored_import_ids(engine: sa.Engine) -> list[str]:
    with engine.connect() as conn:
        return sorted(conn.scalars(sa.select(failed_error_imports.c.id)))


@pytest.fixture
def store_env(
    data_dir: Path, database_url: str, engine: sa.Engine, monkeypatch: pytest.MonkeyPatch
) -> Path:
    """The embedded queue with the store on each provider, in a data directory a serve of
    the store has run on (and stopped)."""
    monkeypatch.setenv("CONTROLROOM_DATABASE_URL", database_url)
    with serve_lock.serving(data_dir, store=store_identity(engine), broker="the embedded queue"):
        pass
    return data_dir


def test_import_failed_republishes_every_import_and_deletes_its_row(
    store_env: Path, engine: sa.Engine
) -> None:
    imports = [failed_import(n) for n in range(3)]
    FailedMessageBatchWriter(engine).write(IngestionBatch(failed_imports=imports))

    code, output = invoke("import-failed")

    assert code == 0, output
    assert "Re-published 3 of 3" in output
    assert stored_import_ids(engine) == []
    queued = asyncio.run(drain(store_env / "queue.db", "error", 3))
    assert [(d.headers, d.body) for d in queued] == [
        (json.loads(item.headers_json), item.body) for item in imports
    ]


def test_import_failed_refuses_to_publish_where_the_running_serve_never_looks(
    store_env: Path, engine: sa.Engine
) -> None:
    """Fresh-user pass (fifth): with serve on RabbitMQ and ``CONTROLROOM_BROKER_URL``
    forgotten, the imports were deleted and put on the embedded queue, which no serve
    reads."""
    imports = [failed_import(n) for n in range(2)]
    FailedMessageBatchWriter(engine).write(IngestionBatch(failed_imports=imports))
    broker = "RabbitMQ amqp://rabbit.example:5672/%2F"

    with serve_lock.serving(store_env, store=store_identity(engine), broker=broker):
        code, output = invoke("import-failed")

    assert code == 1, output
    assert f"consumes {broker}" in " ".join(output.split()), output
    assert stored_import_ids(engine) == sorted(item.id for item in imports)
    assert not (store_env / "queue.db").exists()


def test_import_failed_refuses_an_embedded_queue_no_serve_of_the_store_reads(
    store_env: Path, engine: sa.Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fresh-user pass (seventh): run from another directory, without the serve's
    ``CONTROLROOM_DATA_DIR`` (its default is relative), the imports were deleted and put
    on the embedded queue of a data directory no serve of the store ever ran on, and the
    command said serve would ingest them."""
    imports = [failed_import(n) for n in range(2)]
    FailedMessageBatchWriter(engine).write(IngestionBatch(failed_imports=imports))
    elsewhere = tmp_path / "elsewhere"
    monkeypatch.setenv("CONTROLROOM_DATA_DIR", str(elsewhere))

    code, output = invoke("import-failed")

    assert code == 1, output
    said = " ".join(output.split())
    assert "no controlroom serve of this store (" in said, output
    assert f"has run on the data directory {elsewhere}, whose embedded queue" in said, output
    assert "nothing was published" in said
    assert stored_import_ids(engine) == sorted(item.id for item in imports)
    assert not (elsewhere / "queue.db").exists()


def test_import_failed_with_an_id_republishes_only_that_one(
    store_env: Path, engine: sa.Engine
) -> None:
    imports = [failed_import(n) for n in range(2)]
    FailedMessageBatchWriter(engine).write(IngestionBatch(failed_imports=imports))

    code, output = invoke("import-failed", "--id", imports[1].id)

    assert code == 0, output
    assert stored_import_ids(engine) == [imports[0].id]
    [queued] = asyncio.run(drain(store_env / "queue.db", "error", 1))
    assert queued.body == imports[1].body


def test_import_failed_list_shows_each_import_and_sends_nothing(
    store_env: Path, engine: sa.Engine
) -> None:
    imports = [failed_import(n) for n in range(2)]
    FailedMessageBatchWriter(engine).write(IngestionBatch(failed_imports=imports))

    code, output = invoke("import-failed", "--list")

    assert code == 0, output
    for item in imports:
        assert item.id in output and item.failed_at.isoformat() in output
    assert f"header {h.FAILED_Q} is missing or empty" in output
    assert "2 failed imports" in output
    assert stored_import_ids(engine) == sorted(item.id for item in imports)


def test_import_failed_list_counts_one_import_in_the_singular(
    store_env: Path, engine: sa.Engine
) -> None:
    FailedMessageBatchWriter(engine).write(IngestionBatch(failed_imports=[failed_import(0)]))

    code, output = invoke("import-failed", "--list")

    assert code == 0, output
    assert "1 failed import; `controlroom import-failed` re-imports it." in output


def test_import_failed_with_an_unknown_id_exits_1(store_env: Path, engine: sa.Engine) -> None:
    code, output = invoke("import-failed", "--id", "no-such-import")

    assert code == 1
    assert "no failed import with id no-such-import" in output
    assert "Re-importing" not in output  # no progress bar of one for a named import


def test_import_failed_with_nothing_to_do_says_so(store_env: Path, engine: sa.Engine) -> None:
    code, output = invoke("import-failed")

    assert code == 0
    assert "No failed imports." in output


def test_import_failed_keeps_an_import_whose_headers_cannot_be_queued(
    store_env: Path, engine: sa.Engine
) -> None:
    unreadable = FailedImport(
        id=str(uuid.UUID(int=7)),
        queue="error",
        headers_json="[1, 2]",
        body=b"x",
        reason="unparseable headers",
        failed_at=at(0),
    )
    FailedMessageBatchWriter(engine).write(IngestionBatch(failed_imports=[unreadable]))

    code, output = invoke("import-failed")

    assert code == 1
    assert "kept" in output
    assert stored_import_ids(engine) == [unreadable.id]


def rule_on(event_type: str) -> str:
    """``CONTROLROOM_NOTIFICATIONS`` with one rule on ``event_type``."""
    hook = {"name": "ops", "url": "http://127.0.0.1:9/x", "secret": WEBHOOK_SECRET}
    rule = {"name": "cli", "event_types": [event_type], "channel": "Webhook", "target": "ops"}
    return json.dumps({"webhooks": [hook], "rules": [rule]})


def rule_notifications(engine: sa.Engine) -> list[tuple[str, int]]:
    with engine.connect() as conn:
        return [
            (row.source, row.event_count)
            for row in conn.execute(sa.select(notifications.c.source, notifications.c.event_count))
        ]


@pytest.mark.parametrize(
    ("command", "event_type"),
    [(("import-failed",), "FailedImportsReimported"), (("sweep",), "RetentionSweepCompleted")],
)
def test_a_command_that_writes_events_applies_the_rules_as_serve_does(
    store_env: Path,
    engine: sa.Engine,
    monkeypatch: pytest.MonkeyPatch,
    command: tuple[str, ...],
    event_type: str,
) -> None:
    FailedMessageBatchWriter(engine).write(IngestionBatch(failed_imports=[failed_import(1)]))
    with engine.begin() as conn:  # an event past its period: the sweep purges it
        record_event(
            conn,
            description="long ago",
            severity="info",
            category="Test",
            event_type=EventType.GROUP_COMMENT_CHANGED,
            raised_at=datetime.now(UTC) - timedelta(days=60),
        )
    monkeypatch.setenv("CONTROLROOM_NOTIFICATIONS", rule_on(event_type))

    code, output = invoke(*command)

    assert code == 0, output
    assert rule_notifications(engine) == [("rule:cli", 1)]


def test_reimport_keeps_the_row_when_the_publish_fails(engine: sa.Engine, tmp_path: Path) -> None:
    item = failed_import(1)
    FailedMessageBatchWriter(engine).write(IngestionBatch(failed_imports=[item]))

    async def reimport_into_closed_queue() -> None:
        transport = EmbeddedQueue(tmp_path / "queue.db")
        await transport.start()
        await transport.close()
        await reimport_failed_import(engine, transport, item.id, error_queue="error")

    with pytest.raises(TransportError):
        asyncio.run(reimport_into_closed_queue())
    assert stored_import_ids(engine) == [item.id]


def test_reimport_of_a_row_already_gone_says_so(engine: sa.Engine, tmp_path: Path) -> None:
    async def reimport_missing() -> ReimportOutcome:
        async with EmbeddedQueue(tmp_path / "queue.db") as transport:
            return await reimport_failed_import(
                engine, transport, str(uuid.uuid4()), error_queue="error"
            )

    assert asyncio.run(reimport_missing()) is ReimportOutcome.GONE


# --- serve --------------------------------------------------------------------------------
def test_serve_on_a_taken_port_exits_1_naming_it(data_dir: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        code, output = invoke("serve", "--port", str(port))

    assert code == 1
    assert f"cannot listen on 127.0.0.1:{port}" in output


@pytest.mark.parametrize("command", [["serve"], ["site", "serve"]])
def test_a_host_option_that_is_no_host_is_refused_naming_the_option(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch, command: list[str]
) -> None:
    """Fresh-user pass (second): ``--host 127.0.0.1:5`` was refused as if
    ``CONTROLROOM_HOST`` held it."""
    monkeypatch.setenv("CONTROLROOM_SITE_SITE_ID", "plant-7")

    code, output = invoke(*command, "--host", "127.0.0.1:5")

    flat = " ".join(output.replace("│", " ").split())
    assert code == 2, output
    assert "--host" in flat and "it must be a host name or an IP address" in flat, output
    assert "CONTROLROOM_HOST" not in flat and "CONTROLROOM_SITE_HOST" not in flat, output


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:18100/?x",
        "http://127.0.0.1:0",
        "http://hooks..example.org:18100",
        "http://127.0.0.1:18100/api",
        "127.0.0.1:18100",
    ],
)
@pytest.mark.parametrize("command", [["site", "demo"], ["demo", "notifications"]])
def test_a_demo_central_url_no_agent_could_use_is_refused_naming_the_option(
    data_dir: Path, command: list[str], url: str
) -> None:
    """Fresh-user pass (third): the site demo printed its banner, then a 98-line
    traceback; without a port it quietly took the default ports."""
    code, output = invoke(*command, "--central-url", url)

    assert code == 2, output
    assert "--central-url" in output and "Traceback" not in output, output


def free_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as probe:
        return int(probe.getsockname()[1])


@pytest.fixture(params=["sqlite", "postgresql"])
def store_spelt_twice(
    request: pytest.FixtureRequest, data_dir: Path, tmp_path: Path
) -> tuple[str, str]:
    """One store's URL spelt two ways: SQLite's file through a symlinked directory,
    PostgreSQL's database by the name ``localhost`` and without its port."""
    if request.param == "sqlite":
        data_dir.mkdir(parents=True)
        link = tmp_path / "link"
        link.symlink_to(data_dir, target_is_directory=True)
        return f"sqlite:///{data_dir}/controlroom.db", f"sqlite:///{link}/controlroom.db"
    url = sa.make_url(request.getfixturevalue("postgresql_url"))
    assert url.host != "localhost" and url.port is not None
    other = url.set(host="localhost", port=None)
    return url.render_as_string(hide_password=False), other.render_as_string(hide_password=False)


def health_answers(base: str, process: subprocess.Popen[bytes]) -> bool:
    """``GET /api/health`` answered 200 (``process``, the serve, must still run)."""
    assert process.poll() is None, "controlroom serve exited early"
    with contextlib.suppress(httpx.TransportError):
        return httpx.get(f"{base}/api/health", timeout=TEST_CLIENT_TIMEOUT).status_code == 200
    return False


@pytest.mark.timeout(180)
def test_a_serve_of_a_running_serves_store_spelt_otherwise_on_another_broker_is_refused(
    store_spelt_twice: tuple[str, str],
    rabbitmq_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """docs/design.md "Process shape": serves of one store consume one broker, however
    each spells the store's URL (``runtime.serve_lock`` keys it by the store's identity)."""
    first_url, second_url = store_spelt_twice
    monkeypatch.setenv("CONTROLROOM_DATABASE_URL", first_url)
    port = free_port()
    with serving(port, tmp_path / "first.log") as first:
        eventually(lambda: health_answers(f"http://127.0.0.1:{port}", first), what="health")
        monkeypatch.setenv("CONTROLROOM_DATABASE_URL", second_url)
        monkeypatch.setenv("CONTROLROOM_BROKER_URL", rabbitmq_url)
        monkeypatch.setenv("CONTROLROOM_ERROR_QUEUE", f"error-{uuid.uuid4().hex[:8]}")
        with serving(free_port(), tmp_path / "second.log") as second:
            with contextlib.suppress(subprocess.TimeoutExpired):
                second.wait(timeout=60)
            running_still = second.poll() is None
        assert first.poll() is None, (tmp_path / "first.log").read_text()

    output = (tmp_path / "second.log").read_text()
    assert not running_still, f"the second serve ran: {output}"
    assert second.returncode == 1, output
    assert "another controlroom serve runs on" in output, output


def expected_rows(seed: int, count: int) -> set[str]:
    """UniqueMessageIds the demo's messages fold into (they do not depend on the time)."""
    ids = set()
    for message in generate_demo_messages(count, seed=seed, now=datetime.now(UTC)):
        with contextlib.suppress(MessageRejected):
            ids.add(
                parse_failed_message(
                    message.headers, message.body, max_body_size_to_store=102_400
                ).unique_message_id
            )
    return ids


def terminate(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM ``process`` if it still runs; SIGKILL it when it has not exited in 30 s."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


@contextlib.contextmanager
def serving(port: int, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``controlroom serve`` in a child process (env as set), stopped with SIGTERM."""
    with log.open("wb") as output:
        process = subprocess.Popen(
            [str(CONTROLROOM_EXE), "serve", "--port", str(port)],
            stdout=output,
            stderr=subprocess.STDOUT,
            env=dict(os.environ),
        )
        try:
            yield process
        finally:
            terminate(process)


def wait_for_rows(base: str, count: int, process: subprocess.Popen[bytes]) -> list[dict]:
    """Poll ``/api/errors`` until it lists ``count`` failed messages (60 s at most)."""
    deadline = time.monotonic() + 60
    total = None
    while time.monotonic() < deadline:
        assert process.poll() is None, "controlroom serve exited early"
        with contextlib.suppress(httpx.TransportError):
            response = httpx.get(
                f"{base}/api/errors", params={"per_page": 500}, timeout=TEST_CLIENT_TIMEOUT
            )
            total = response.headers.get("Total-Count")
            if response.status_code == 200 and total == str(count):
                return list(response.json())
        time.sleep(0.25)
    raise AssertionError(f"/api/errors listed {total} failed messages, not {count}, after 60 s")


@pytest.fixture(params=["embedded", "servers"])
def serve_env(
    request: pytest.FixtureRequest, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[sa.Engine]:
    """The embedded default, or PostgreSQL + RabbitMQ; yields the store's engine."""
    url = f"sqlite:///{data_dir / 'controlroom.db'}"
    if request.param == "servers":
        url = request.getfixturevalue("postgresql_url")
        monkeypatch.setenv("CONTROLROOM_DATABASE_URL", url)
        monkeypatch.setenv("CONTROLROOM_BROKER_URL", request.getfixturevalue("rabbitmq_url"))
        monkeypatch.setenv("CONTROLROOM_ERROR_QUEUE", f"error-{uuid.uuid4().hex[:8]}")
    engine = create_store_engine(url)
    try:
        yield engine
    finally:
        engine.dispose()


@pytest.mark.timeout(180)
def test_demo_then_serve_lists_what_was_sent(
    serve_env: sa.Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CONTROLROOM_INGESTION__REPORT_INTERVAL_SECONDS", "0.5")
    code, output = invoke("demo", "--count", "20", "--seed", "3")
    assert code == 0, output
    rows = expected_rows(seed=3, count=20)
    port = free_port()
    base = f"http://127.0.0.1:{port}"

    log_file = tmp_path / "serve.log"
    with serving(port, log_file) as process:
        items = wait_for_rows(base, len(rows), process)
        health = httpx.get(f"{base}/api/health", timeout=TEST_CLIENT_TIMEOUT)
        binary = next(i for i in items if i["message_type"].endswith("ArchiveInvoice"))
        body = httpx.get(f"{base}/api/messages/{binary['id']}/body", timeout=TEST_CLIENT_TIMEOUT)
        # The report every 0.5 s (set above) says what was ingested, at its next interval.
        eventually(lambda: REPORTED.search(log_file.read_text()), what="the ingestion report")
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0, (tmp_path / "serve.log").read_text()

    assert {item["id"] for item in items} == rows
    assert max(item["number_of_processing_attempts"] for item in items) >= 3
    assert health.status_code == 200
    answer = without_vacuum_warnings(health.json(), serve_env)
    intakes = answer["details"].pop("intakes")
    assert answer == {
        "database": "ok",
        "broker": "ok",
        "intake": "ok",
        "details": {"failed_imports": 1},
    }
    assert set(intakes) == {"error queue intake", "telemetry intake"}
    log = (tmp_path / "serve.log").read_text()
    # docs/decisions.md "serve says what it is doing": said at startup and while it ingests.
    assert f"{base}/docs" in log and f"console {base}/" in log
    # Each address ends its line: a terminal that makes links of them takes no punctuation.
    for path in ("/", "/docs", "/api/health", "/metrics"):
        assert re.search(rf"{re.escape(base + path)}$", log, re.MULTILINE), log
    assert "Store: " in log and "Ingesting queues " in log
    assert REPORTED.search(log), log
    assert "Running upgrade" in log and "setup plugin" not in log, log  # alembic's own lines
    demo_binary = next(
        m.body
        for m in generate_demo_messages(20, seed=3, now=datetime.now(UTC))
        if m.headers[h.CONTENT_TYPE] == "application/octet-stream"
    )
    assert body.content == demo_binary
    with serve_env.connect() as conn:
        reasons = list(conn.scalars(sa.select(failed_error_imports.c.reason)))
    assert reasons == [f"header {h.FAILED_Q} is missing or empty"]


@contextlib.contextmanager
def running(log: Path, *args: str) -> Iterator[subprocess.Popen[bytes]]:
    """``controlroom *args`` in a child process (env as set), stopped with SIGTERM; fails
    the test when it does not exit 0 then."""
    with log.open("wb") as output:
        process = subprocess.Popen(
            [str(CONTROLROOM_EXE), *args], stdout=output, stderr=subprocess.STDOUT
        )
        try:
            yield process
        finally:
            terminate(process)
    assert process.returncode == 0, log.read_text()


@pytest.fixture(params=["embedded", "servers"])
def endpoints_env(
    request: pytest.FixtureRequest, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    """The embedded default, or PostgreSQL + a RabbitMQ vhost of this test's own (the demo
    endpoints consume fixed queue names)."""
    if request.param == "embedded":
        yield
        return
    monkeypatch.setenv("CONTROLROOM_DATABASE_URL", request.getfixturevalue("postgresql_url"))
    url, vhost = servers.create_rabbitmq_vhost()
    monkeypatch.setenv("CONTROLROOM_BROKER_URL", url)
    try:
        yield
    finally:
        servers.delete_rabbitmq_vhost(vhost)


@pytest.mark.timeout(240)
def test_make_demo_loop_a_retry_from_the_api_ends_resolved_or_failed_again(
    endpoints_env: None, tmp_path: Path
) -> None:
    """What ``make demo`` runs (demo, then serve beside demo endpoints): retrying every
    message from the API needs no code to end each one Resolved or failed again."""
    code, output = invoke("demo", "--count", "20", "--seed", "3", "--no-next-steps")
    assert code == 0, output
    rows = expected_rows(seed=3, count=20)
    failing = {row for row in rows if fails_again(8, row, 1, DEFAULT_FAIL_RATIO)}
    assert 0 < len(failing) < len(rows) / 2
    port = free_port()
    base = f"http://127.0.0.1:{port}"

    with (
        running(tmp_path / "serve.log", "serve", "--port", str(port)) as serve,
        running(tmp_path / "endpoints.log", "demo", "endpoints", "--seed", "8"),
    ):
        before = {item["id"]: item for item in wait_for_rows(base, len(rows), serve)}
        retried = httpx.post(f"{base}/api/errors/retry/all", timeout=TEST_CLIENT_TIMEOUT)
        assert retried.status_code == 202
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            after = {item["id"]: item for item in wait_for_rows(base, len(rows), serve)}
            if all(item["status"] in ("resolved", "unresolved") for item in after.values()) and (
                {i for i, item in after.items() if item["status"] == "resolved"} == rows - failing
            ):
                break
            time.sleep(0.5)

    assert {i for i, item in after.items() if item["status"] == "resolved"} == rows - failing
    assert {i for i, item in after.items() if item["status"] == "unresolved"} == failing
    assert {i: after[i]["number_of_processing_attempts"] for i in failing} == {
        i: before[i]["number_of_processing_attempts"] + 1 for i in failing
    }
    printed = (tmp_path / "endpoints.log").read_text().splitlines()
    assert sum(line.endswith(" confirmed") for line in printed) == len(rows - failing)
    assert sum(" failed again" in line for line in printed) == len(failing)


# --- serve's access log -----------------------------------------------------------------


def access_record(method: str, path: str, status: int) -> logging.LogRecord:
    """An access-log record as uvicorn makes it."""
    args = ("127.0.0.1:50000", method, path, "1.1", status)
    return logging.LogRecord(
        "uvicorn.access", logging.INFO, "", 0, '%s - "%s %s HTTP/%s" %d', args, None
    )


def test_serve_leaves_accepted_telemetry_posts_out_of_the_access_log() -> None:
    assert not _quiet_routine_telemetry(access_record("POST", "/api/site-calls/telemetry", 200))
    assert _quiet_routine_telemetry(access_record("POST", "/api/site-calls/telemetry", 422))
    assert _quiet_routine_telemetry(access_record("POST", "/api/errors/retry/all", 202))
    assert _quiet_routine_telemetry(access_record("GET", "/api/site-calls/telemetry", 200))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("access_log", [True, False])
def test_serves_access_lines_are_stamped_as_its_own_and_can_be_turned_off(
    data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, access_log: bool
) -> None:
    """Fresh user's pass (session 31): uvicorn's access lines had no time, unlike every
    other line of serve's log, and nothing turned them off."""
    if not access_log:
        monkeypatch.setenv("CONTROLROOM_ACCESS_LOG", "false")
    port = free_port()
    log = tmp_path / "serve.log"
    with serving(port, log) as process:
        base = f"http://127.0.0.1:{port}"
        eventually(lambda: health_answers(base, process), what="health")
        assert httpx.get(f"{base}/api/endpoints", timeout=TEST_CLIENT_TIMEOUT).status_code == 200
    lines = [line for line in log.read_text().splitlines() if "GET /api/endpoints" in line]
    if access_log:
        assert len(lines) == 1, log.read_text()
        stamped = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} INFO uvicorn\.access: "
        assert re.match(stamped, lines[0]), lines
    else:
        assert lines == [], lines
    assert re.search(r"^\S+ \S+ INFO uvicorn\.error: Started server process", log.read_text(), re.M)


def test_the_by_hand_demos_parts_follow_controlroom_port(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # README "A first look": by hand, a second demo's parts are started with the same
    # CONTROLROOM_PORT as its serve, and must take the ports past it, not 8080's.
    monkeypatch.setenv("CONTROLROOM_PORT", "18130")

    sites_code, sites = invoke("site", "demo", "--print-sites")
    sinks_code, sinks = invoke("demo", "notifications", "--print-settings")

    assert sites_code == sinks_code == 0, sites + sinks
    assert [entry["base_url"] for entry in json.loads(sites)] == [
        "http://127.0.0.1:18141",
        "http://127.0.0.1:18142",
    ]
    assert "127.0.0.1:18144" in sinks and "18145" in sinks and "8094" not in sinks


def test_two_sites_with_one_id_are_refused_naming_the_id(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = {"base_url": "http://127.0.0.1:9", "token": "t" * 16, "central_token": "c" * 16}
    other = {**site, "token": "u" * 16, "central_token": "d" * 16}
    monkeypatch.setenv(
        "CONTROLROOM_SITES", json.dumps([{"id": "plant-7", **site}, {"id": "plant-7", **other}])
    )

    code, output = invoke("migrate")

    assert code == 2, output
    assert "'plant-7'" in output and "distinct" in output, output
