"""Ingestion benchmark: the error instance's write path on PostgreSQL, beside naive
baselines and COPY ceilings, measured in interleaved rounds on the same machine.

What it does (see ``benchmarks/README.md`` for how to read the figures):

1. Generates ``--messages`` (default 20,000) realistic NServiceBus failed messages: header
   sets shaped like ``../shared/samples/nsb_error_headers.json`` (NServiceBus 7-10 and a
   Python service; several endpoints, hosts, message types, exception types and multi-line
   stack traces), a ~1 KB compact JSON body each, and ``--repeat-share`` (default 10%) of
   them later attempts of an earlier message (same ``NServiceBus.MessageId`` and
   processing endpoint, so the same UniqueMessageId).
2. Parses them with ``parse_failed_message`` (timed on its own: messages/s of parsing).
3. Creates a scratch database (and a second one migrated to 0004 for the previous
   schema), applies the migrations, and times on emptied tables, in ``--rounds`` rounds
   (each runs every method once, the order rotating by one), garbage collector on as
   serve runs (``--gc-off`` pauses it):

   * **write path** (``write1``, ``write2``): ``FailedMessageBatchWriter.write`` over
     batches of the production batch size, one batch at a time, then with
     ``concurrent_batches`` threads writing batches at once, as the service does;
   * **naive baselines**: an ORM ``Session.merge(obj)`` per message onto the same
     ``failed_messages`` table (no guards, no groups, no endpoints), with a ``commit()``
     per message (``naive``) or per batch (``naivebatch``: what batching commits buys),
     over the first ``--naive-messages`` messages only;
   * **ceilings**: ``COPY`` of the folded ``failed_messages`` rows only (``copyone``), and
     of the write path's whole end state, messages, endpoints and group rows (``copyall``);
   * **probes**: the write path without the counters' triggers (``nocounters``), without
     search (``nosearch``: no terms, GIN dropped), and the previous writer on today's
     schema under the same search probe (``prevwriter``: only the writer differs);
   * **previous schema's write path** (``previous``): the writer before migration 0009 on
     the database migrated to 0004 (the server computes the generated ``tsvector``).

   Each run reports wall time, this process's CPU, the CPU of the PostgreSQL backends
   serving its connections, and over the run plus a ``CHECKPOINT`` after it the whole
   server's CPU (all its processes, from ``/proc``), the WAL and the buffers written.

4. Prints the environment, a table of medians and ranges over rounds, and ratios of
   methods measured in the same round (median and range), then drops the databases.

Run: ``make bench`` or ``.venv/bin/python benchmarks/ingest.py [--messages N]``.
Server: ``CONTROLROOM_BENCH_POSTGRESQL_URL`` (an admin URL; the scratch database is created
next to it), default ``postgresql+psycopg://postgres@127.0.0.1:5432/postgres``.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import hashlib
import json
import os
import platform
import random
import statistics
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa
from pgserver import (
    ADMIN_URL_ENV,
    DEFAULT_ADMIN_URL,
    add_server_arguments,
    admin_server,
    cpu_seconds,
    describe_server,
    live_processes,
    process_cpu_seconds,
    stat_fields,
)
from previous_write_path import PREVIOUS_REVISION, PreviousWriter
from query import tsvector_text
from rich.console import Console
from rich.table import Table
from sqlalchemy import orm

from controlroom.config import IngestionSettings, Settings
from controlroom.db.engine import create_store_engine
from controlroom.db.migrate import upgrade_database
from controlroom.db.tables import (
    failed_message_groups,
    failed_messages,
    known_endpoints,
)
from controlroom.demo import NSB_RECEIVE_PIPELINE
from controlroom.errors.ingest import headers as h
from controlroom.errors.ingest import writer as writer_module
from controlroom.errors.ingest.fold import FoldedMessage, fold_attempts
from controlroom.errors.ingest.parsing import parse_failed_message
from controlroom.errors.ingest.writer import (
    FailedMessageBatchWriter,
    IngestionBatch,
    failed_message_row,
)
from controlroom.errors.model import FailedAttempt

DEFAULT_MESSAGES = 20_000
DEFAULT_REPEAT_SHARE = 0.10
DEFAULT_NAIVE_MESSAGES = 5_000  # the naive baseline's sample: ~20-30 s at its rate
BODY_BYTES = 1024
WARM_UP_MESSAGES = 200  # written (and thrown away) before each timed run
MAX_BODY_SIZE_TO_STORE: int = Settings.model_fields["max_body_size_to_store"].default


# --- realistic failed messages ------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Message:
    """One message as it sits in the error queue."""

    headers: dict[str, str | None]
    body: bytes


@dataclass(frozen=True, slots=True)
class _Endpoint:
    name: str
    hosts: tuple[str, ...]
    version: str | None  # NServiceBus version; None for a Python service
    handlers: tuple[str, ...]  # message types (short names) it handles
    namespace: str


_ENDPOINTS = (
    _Endpoint(
        "Sales",
        ("SALES-VM01", "SALES-VM02", "SALES-VM03"),
        "9.2.3",
        ("PlaceOrder", "CancelOrder", "ImportPriceList"),
        "Sales",
    ),
    _Endpoint(
        "Billing",
        ("BILLING-VM01", "BILLING-VM02"),
        "7.8.4",
        ("ChargeCreditCard", "RefundPayment", "OrderPlaced"),
        "Billing",
    ),
    _Endpoint(
        "Shipping",
        ("SHIP-VM01", "SHIP-VM02"),
        "10.2.0",
        ("ShipOrder", "OrderPlaced", "OrderBilled"),
        "Shipping",
    ),
    _Endpoint(
        "Warehouse", ("wh-py-01", "wh-py-02"), None, ("ReserveStock", "ReleaseStock"), "warehouse"
    ),
    _Endpoint(
        "Notifications",
        ("NOTIFY-01",),
        "8.1.6",
        ("SendOrderConfirmation", "SendShippingNotice"),
        "Notifications",
    ),
    _Endpoint(
        "CustomerCare", ("CARE-VM01",), "9.2.3", ("OpenTicket", "EscalateTicket"), "CustomerCare"
    ),
    _Endpoint(
        "Loyalty", ("LOYALTY-01", "LOYALTY-02"), "10.2.0", ("AwardPoints", "OrderPlaced"), "Loyalty"
    ),
    _Endpoint("Reporting", ("REPORT-01",), "8.1.6", ("RecordSale", "RecordRefund"), "Reporting"),
)
_SENDERS = ("ClientUI", "Sales", "Billing", "Shipping", "Backoffice")
_SENDER_HOSTS = ("WEB-01", "WEB-02", "SALES-VM01", "BILLING-VM01", "SHIP-VM01", "BO-01")

# .NET exceptions: type, source, message template, throw-site frames (class.method).
_DOTNET_EXCEPTIONS = (
    (
        "System.InvalidOperationException",
        "{ns}",
        "Order {order} is in state {state}; the operation is not valid.",
        ("{ns}.Domain.Order.Apply(OrderEvent e)",),
    ),
    (
        "System.NullReferenceException",
        "{ns}",
        "Object reference not set to an instance of an object.",
        ("{ns}.Mapping.AddressMapper.Map(Address source)",),
    ),
    (
        "System.TimeoutException",
        "System.Net.Http",
        "The operation was canceled after {ms} ms waiting for https://gateway.internal/v2/{op}.",
        (
            "System.Net.Http.HttpClient.HandleFailure(Exception e, Boolean telemetryStarted, "
            "HttpResponseMessage response, CancellationTokenSource cts, CancellationToken "
            "cancellationToken, CancellationTokenSource pendingRequestsCts)",
            "{ns}.Integration.GatewayClient.SendAsync(HttpRequestMessage request)",
        ),
    ),
    (
        "System.Net.Http.HttpRequestException",
        "System.Net.Http",
        "Response status code does not indicate success: {status} (Service Unavailable).",
        (
            "System.Net.Http.HttpResponseMessage.EnsureSuccessStatusCode()",
            "{ns}.Integration.GatewayClient.PostAsync(String path, Object payload)",
        ),
    ),
    (
        "Microsoft.Data.SqlClient.SqlException",
        "Core Microsoft SqlClient Data Provider",
        "Transaction (Process ID {pid}) was deadlocked on lock resources with another process "
        "and has been chosen as the deadlock victim. Rerun the transaction.",
        (
            "Microsoft.Data.SqlClient.SqlConnection.OnError(SqlException exception, Boolean "
            "breakConnection, Action`1 wrapCloseInAction)",
            "Microsoft.Data.SqlClient.SqlCommand.EndExecuteNonQueryAsync(IAsyncResult asyncResult)",
            "{ns}.Data.OrderRepository.SaveAsync(Order order, CancellationToken token)",
        ),
    ),
    (
        "System.Collections.Generic.KeyNotFoundException",
        "System.Private.CoreLib",
        "The given key '{key}' was not present in the dictionary.",
        (
            "System.Collections.Generic.Dictionary`2.get_Item(TKey key)",
            "{ns}.Tax.RateTable.RateFor(String code)",
        ),
    ),
    (
        "System.Text.Json.JsonException",
        "System.Text.Json",
        "The JSON value could not be "
        "converted to {ns}.Address. Path: $.ShippingAddress | LineNumber: 0 | "
        "BytePositionInLine: {pos}.",
        (
            "System.Text.Json.ThrowHelper.ThrowJsonException(String message)",
            "{ns}.AddressBook.Resolve(JsonElement element)",
        ),
    ),
    (
        "System.ArgumentOutOfRangeException",
        "{ns}",
        "Quantity must be between 1 and 99. (Parameter 'quantity')\nActual value was {qty}.",
        ("{ns}.Domain.OrderLine..ctor(String sku, Int32 quantity)",),
    ),
    (
        "NServiceBus.MessageDeserializationException",
        "NServiceBus.Core",
        "An error occurred while attempting to extract logical messages from incoming physical "
        "message {mid}",
        (
            "NServiceBus.DeserializeMessageConnector.ExtractWithExceptionHandling("
            "IncomingMessage message)",
        ),
    ),
    (
        "System.Data.DataException",
        "{ns}",
        "Saving {entity} {order} failed.",
        ("{ns}.Data.UnitOfWork.CommitAsync(CancellationToken token)",),
    ),
)

# Python exceptions (the Warehouse endpoint): type, message template, frames.
_PYTHON_EXCEPTIONS = (
    (
        "warehouse.stock.OutOfStockError",
        "SKU {sku!r} has {qty} left, {more} requested",
        (
            ("handlers.py", "handle", "reservation = stock.reserve(msg['Sku'], msg['Quantity'])"),
            ("stock.py", "reserve", "raise OutOfStockError(sku, requested=quantity)"),
        ),
    ),
    (
        "psycopg.errors.SerializationFailure",
        "could not serialize access due to concurrent update",
        (
            ("handlers.py", "handle", "repo.save(reservation)"),
            ("repository.py", "save", "cur.execute(SQL_UPSERT, params)"),
        ),
    ),
    ("KeyError", "'Quantity'", (("handlers.py", "handle", "qty = msg['Quantity']"),)),
    (
        "ValueError",
        "invalid literal for int() with base 10: '{qty}x'",
        (("handlers.py", "handle", "qty = int(msg['Quantity'])"),),
    ),
)

_PRODUCTS = (
    "BLU-CHAIR-04",
    "OAK-TABLE-12",
    "CAFE-CUP-02",
    "LAMP-GRN-07",
    "RUG-WOOL-33",
    "DESK-WAL-01",
    "SOFA-GRY-03",
    "SHELF-BIR-09",
)
_STATES = ("Cancelled", "Shipped", "Draft", "OnHold")
_WORDS = (
    "Café crème",
    "Grüne Lampe",
    "Tapis tissé",
    "gift wrap",
    "leave at door",
    "call before delivery",
    "fragile",
    "second floor",
    "side entrance",
)


def _nsb_time(instant: datetime) -> str:
    return instant.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S:%f Z")


def _compact_json(value: object) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


def _host_id(host: str) -> str:
    return hashlib.md5(f"controlroom-bench/{host}".encode(), usedforsecurity=False).hexdigest()


class _Generator:
    """Deterministic (one seeded random stream) factory of failed messages."""

    def __init__(self, seed: int, now: datetime) -> None:
        self._rng = random.Random(seed)
        self._now = now

    def guid(self) -> str:
        return str(uuid.UUID(int=self._rng.getrandbits(128), version=4))

    def body(self, order: str) -> bytes:
        """Compact UTF-8 JSON of ``BODY_BYTES`` bytes (NServiceBus SystemJsonSerializer)."""
        rng = self._rng
        lines = [
            {
                "Sku": rng.choice(_PRODUCTS),
                "Quantity": rng.randrange(1, 9),
                "UnitPrice": f"{rng.randrange(500, 50_000) / 100:.2f}",
            }
            for _ in range(rng.randrange(2, 7))
        ]
        value: dict[str, Any] = {
            "OrderId": order,
            "CustomerId": f"CUST-{rng.randrange(10_000, 99_999)}",
            "Currency": "EUR",
            "Lines": lines,
            "ShippingAddress": {
                "Street": f"{rng.randrange(1, 300)} Rue de la Paix",
                "City": "Paris",
                "PostalCode": f"750{rng.randrange(10, 99)}",
                "Country": "FR",
            },
            "Notes": "",
        }
        room = BODY_BYTES - len(_compact_json(value))  # bytes left for the notes
        notes = ""
        while len(notes.encode()) < room:
            notes += rng.choice(_WORDS) + "; "
        while len(notes.encode()) > room:  # cut whole characters, then pad to the byte
            notes = notes[:-1]
        value["Notes"] = notes + "." * (room - len(notes.encode()))
        return _compact_json(value)

    def exception(
        self, endpoint: _Endpoint, message_type: str, mid: str, order: str
    ) -> tuple[str, str, str, str]:
        """(type, message, source, stack trace) as the endpoint's runtime prints them."""
        rng = self._rng
        values = {
            "ns": endpoint.namespace,
            "order": order,
            "state": rng.choice(_STATES),
            "ms": rng.randrange(5_000, 100_000),
            "op": rng.choice(("charge", "label")),
            "status": rng.choice((502, 503, 504)),
            "pid": rng.randrange(50, 400),
            "key": f"EUR-{rng.choice(('DE', 'FR', 'NL'))}-REDUCED",
            "mid": mid,
            "pos": rng.randrange(10, 200),
            "qty": rng.randrange(0, 200),
            "more": rng.randrange(1, 20),
            "entity": "order",
            "sku": rng.choice(_PRODUCTS),
        }
        handler = f"{endpoint.namespace}.{message_type}Handler"
        if endpoint.version is None:
            kind, template, frames = rng.choice(_PYTHON_EXCEPTIONS)
            message = template.format(**values)
            lines = ["Traceback (most recent call last):"]
            for file, function, code in frames:
                lines += [
                    f'  File "/srv/warehouse/warehouse/{file}", line '
                    f"{rng.randrange(20, 400)}, in {function}",
                    f"    {code}",
                ]
            lines.append(f"{kind}: {message}")
            return kind, message, kind.partition(".")[0], "\n".join(lines)
        kind, source, template, frames = rng.choice(_DOTNET_EXCEPTIONS)
        message = template.format(**values)
        throw_site = [frame.format(**values) for frame in frames]
        throw_site.append(
            f"{handler}.Handle({message_type} message, IMessageHandlerContext context) in "
            f"/src/{endpoint.namespace}/{message_type}Handler.cs:line {rng.randrange(15, 90)}"
        )
        trace = [f"{kind}: {message}"]
        trace += [f"   at {frame}" for frame in throw_site]
        trace.append("--- End of stack trace from previous location ---")
        trace += [f"   at {frame}" for frame in NSB_RECEIVE_PIPELINE]
        return kind, message, source.format(**values), "\n".join(trace)

    def first_attempt(self, window: timedelta) -> tuple[dict[str, str | None], datetime]:
        rng = self._rng
        endpoint = rng.choice(_ENDPOINTS)
        host = rng.choice(endpoint.hosts)
        sender = rng.choice(_SENDERS)
        sender_host = rng.choice(_SENDER_HOSTS)
        short_type = rng.choice(endpoint.handlers)
        namespace = "Sales" if short_type in ("OrderPlaced", "PlaceOrder") else endpoint.namespace
        message_type = f"{namespace}.Messages.{short_type}"
        mid = self.guid()
        order = f"ORD-{rng.randrange(100_000, 999_999)}"
        failed_at = self._now - window + timedelta(seconds=rng.uniform(0, window.total_seconds()))
        kind, message, source, trace = self.exception(endpoint, short_type, mid, order)
        headers: dict[str, str | None] = {
            h.HOST_DISPLAY_NAME: host,
            h.HOST_ID: _host_id(host),
            h.ORIGINATING_HOST_ID: _host_id(sender_host),
            h.CONTENT_TYPE: "application/json",
            h.CONVERSATION_ID: self.guid(),
            "NServiceBus.CorrelationId": mid,
            h.ENCLOSED_MESSAGE_TYPES: f"{message_type}, {namespace}.Messages, Version=1.0.0.0, "
            "Culture=neutral, PublicKeyToken=null",
            h.EXCEPTION_TYPE: kind,
            h.EXCEPTION_MESSAGE: message,
            h.EXCEPTION_SOURCE: source,
            h.EXCEPTION_STACK_TRACE: trace,
            h.FAILED_Q: endpoint.name,
            h.MESSAGE_ID: mid,
            h.MESSAGE_INTENT: "Publish" if short_type.startswith("Order") else "Send",
            h.ORIGINATING_ENDPOINT: sender,
            h.ORIGINATING_MACHINE: sender_host,
            h.PROCESSING_ENDPOINT: endpoint.name,
            h.PROCESSING_MACHINE: host,
            h.REPLY_TO_ADDRESS: sender,
            h.TIME_SENT: _nsb_time(failed_at - timedelta(seconds=rng.uniform(0.05, 30))),
            "NServiceBus.ExceptionInfo.Data.Message ID": mid,
            "NServiceBus.ExceptionInfo.Data.Message type": message_type,
            "NServiceBus.ExceptionInfo.Data.Handler type": f"{namespace}.{short_type}Handler",
            "NServiceBus.ExceptionInfo.Data.Transport message ID": self.guid(),
        }
        if endpoint.version is not None:
            headers["NServiceBus.Version"] = endpoint.version
            if not endpoint.version.startswith("10."):
                headers["NServiceBus.ExceptionInfo.HelpLink"] = None
        headers = self.at(headers, failed_at)
        headers["$body"] = order  # removed by ``messages``; keeps the order id for the body
        return headers, failed_at

    def at(self, headers: dict[str, str | None], failed_at: datetime) -> dict[str, str | None]:
        """``headers`` of an attempt that failed at ``failed_at``."""
        headers = dict(headers)
        headers[h.TIME_OF_FAILURE] = _nsb_time(failed_at)
        headers["NServiceBus.ExceptionInfo.Data.Handler start time"] = _nsb_time(
            failed_at - timedelta(milliseconds=self._rng.randrange(2, 900))
        )
        headers["NServiceBus.ExceptionInfo.Data.Handler failure time"] = _nsb_time(failed_at)
        return headers

    def messages(self, count: int, repeat_share: float) -> list[Message]:
        """``count`` messages, ``round(count * repeat_share)`` of them later attempts of an
        earlier message, sorted by time of failure (the order an error queue holds)."""
        rng = self._rng
        repeats = round(count * repeat_share)
        window = timedelta(hours=6)
        firsts = [self.first_attempt(window) for _ in range(count - repeats)]
        attempts = list(firsts)
        for _ in range(repeats):
            headers, failed_at = rng.choice(firsts)
            later = failed_at + timedelta(seconds=rng.uniform(1, 1800))
            attempts.append((self.at(headers, later), later))
        attempts.sort(key=lambda attempt: attempt[1])
        out = []
        for headers, _ in attempts:
            headers = dict(sorted(headers.items()))
            order = headers.pop("$body")
            assert order is not None
            out.append(Message(headers, self.body(order)))
        return out


def generate_messages(
    count: int, *, repeat_share: float = DEFAULT_REPEAT_SHARE, seed: int = 2, now: datetime
) -> list[Message]:
    """``count`` realistic failed messages (deterministic for a seed and ``now``)."""
    return _Generator(seed, now).messages(count, repeat_share)


# --- the three ways to load -----------------------------------------------------------------
def chunks(items: Sequence[Any], size: int) -> list[Sequence[Any]]:
    return [items[start : start + size] for start in range(0, len(items), size)]


def ingestion_batch(attempts: Sequence[FailedAttempt]) -> IngestionBatch:
    """The batch the service's unit of work hands the writer for these attempts."""
    return IngestionBatch(
        attempts=list(attempts),
        endpoints=[endpoint for attempt in attempts for endpoint in attempt.endpoints],
    )


def write_path(
    engine: sa.Engine,
    attempts: Sequence[FailedAttempt],
    batch_size: int,
    threads: int,
    writer_class: Callable[[sa.Engine], Any] = FailedMessageBatchWriter,
) -> None:
    """The Controlroom write path: one ``write`` per batch, ``threads`` batches at once
    (``writer_class``: the service's writer, or ``PreviousWriter``)."""
    writer = writer_class(engine)
    batches = [ingestion_batch(batch) for batch in chunks(attempts, batch_size)]
    if threads == 1:
        for batch in batches:
            writer.write(batch)
        return
    with ThreadPoolExecutor(max_workers=threads) as pool:
        for _ in pool.map(writer.write, batches):
            pass


class _NaiveBase(orm.DeclarativeBase):
    pass


class NaiveFailedMessage(_NaiveBase):
    """A minimal ORM mapping over the existing ``failed_messages`` table (no guards)."""

    __table__ = failed_messages


def naive_row(attempt: FailedAttempt, now: datetime) -> dict[str, Any]:
    """The row of one attempt on its own: count 1, window of one instant."""
    single = FoldedMessage(
        attempt, (attempt.time_of_failure,), attempt.time_of_failure, attempt.time_of_failure
    )
    return failed_message_row(single, now)


def naive_merge(engine: sa.Engine, attempts: Sequence[FailedAttempt]) -> None:
    """The naive baseline: ``merge`` + ``commit`` per message (a SELECT, then INSERT or
    UPDATE of every column, then a commit)."""
    with orm.Session(engine) as session:
        for attempt in attempts:
            session.merge(NaiveFailedMessage(**naive_row(attempt, datetime.now(UTC))))
            session.commit()


def naive_merge_batched(
    engine: sa.Engine, attempts: Sequence[FailedAttempt], batch_size: int
) -> None:
    """The naive baseline with the write path's commits: ``merge`` per message, one
    ``commit`` per ``batch_size`` messages (what batching alone buys the naive code)."""
    with orm.Session(engine) as session:
        for batch in chunks(attempts, batch_size):
            for attempt in batch:
                session.merge(NaiveFailedMessage(**naive_row(attempt, datetime.now(UTC))))
            session.commit()


END_STATE_TABLES = ("failed_messages", "known_endpoints", "failed_message_groups")
"""The tables the write path writes for this workload, in an order their foreign keys
accept; the counters' tables follow by the same triggers either way."""

EndState = list[tuple[str, str, bytes]]  # (table, column list, COPY text)


def snapshot_end_state(engine: sa.Engine) -> EndState:
    """What the write path left in ``END_STATE_TABLES``, as COPY text per table (every
    column but generated ones), for ``copy_end_state`` to load again."""
    state: EndState = []
    raw = engine.raw_connection()
    try:
        connection = raw.driver_connection
        assert connection is not None
        with connection.cursor() as cursor:
            for table in END_STATE_TABLES:
                cursor.execute(
                    "SELECT column_name FROM information_schema.columns WHERE table_name = %s "
                    "AND table_schema = current_schema() AND is_generated = 'NEVER' "
                    "ORDER BY ordinal_position",
                    (table,),
                )
                names = ", ".join(row[0] for row in cursor.fetchall())
                data = bytearray()
                with cursor.copy(f"COPY (SELECT {names} FROM {table}) TO STDOUT") as copy:
                    for block in copy:
                        data += block
                state.append((table, names, bytes(data)))
        connection.commit()
    finally:
        raw.close()
    return state


def copy_end_state(engine: sa.Engine, state: EndState) -> None:
    """The all-tables ceiling: one ``COPY ... FROM STDIN`` per table of ``state``, in
    one transaction (triggers fire as they do for the write path's inserts)."""
    raw = engine.raw_connection()
    try:
        connection = raw.driver_connection
        assert connection is not None
        with connection.cursor() as cursor:
            for table, names, data in state:
                with cursor.copy(f"COPY {table} ({names}) FROM STDIN") as copy:
                    copy.write(data)
        connection.commit()
    finally:
        raw.close()


def end_state_of(engine: sa.Engine, attempts: Sequence[FailedAttempt], batch_size: int) -> EndState:
    """The end state the write path leaves for ``attempts`` (written untimed, then the
    tables emptied again)."""
    empty_tables(engine)
    write_path(engine, attempts, batch_size, 1)
    state = snapshot_end_state(engine)
    empty_tables(engine)
    return state


def copy_rows(attempts: Sequence[FailedAttempt]) -> tuple[list[str], list[tuple[Any, ...]]]:
    """The final rows (one per UniqueMessageId, folded over every attempt), as COPY tuples.

    Times go naive UTC: the columns are ``timestamp without time zone`` (``UtcDateTime``).
    """
    now = datetime.now(UTC)
    rows = [failed_message_row(message, now) for message in fold_attempts(attempts)]
    columns = list(rows[0])

    def value(name: str, item: Any) -> Any:
        if isinstance(item, datetime):
            return item.astimezone(UTC).replace(tzinfo=None)
        if name == "search_vector":  # COPY reads a tsvector's text form
            return tsvector_text(item)
        return item

    return columns, [tuple(value(name, row[name]) for name in columns) for row in rows]


def copy_load(engine: sa.Engine, columns: Sequence[str], rows: Sequence[tuple[Any, ...]]) -> None:
    """The ceiling: one psycopg 3 ``COPY ... FROM STDIN`` in one transaction."""
    names = ", ".join(columns)
    raw = engine.raw_connection()
    try:
        connection = raw.driver_connection
        assert connection is not None
        statement = f"COPY failed_messages ({names}) FROM STDIN"
        with connection.cursor() as cursor, cursor.copy(statement) as copy:
            for row in rows:
                copy.write_row(row)
        connection.commit()
    finally:
        raw.close()


# --- measuring ----------------------------------------------------------------------------
@dataclass
class Result:
    name: str
    seconds: float
    messages: int  # input messages the run turned into the end state
    rows: int = 0  # failed_messages rows after the run
    attempts: int = 0  # sum of number_of_processing_attempts after the run
    groups: int = 0
    endpoints: int = 0
    note: str = ""
    cache: Counter[str] = field(default_factory=Counter)
    cursor_seconds: float = 0.0  # inside cursor calls (all threads); 0 when not via SQLAlchemy
    cpu_seconds: float = 0.0  # CPU time of this (client) process, all threads
    server_cpu_seconds: float = 0.0  # CPU time of this run's PostgreSQL backends (/proc)
    all_server_cpu_seconds: float = 0.0  # every server process, run + CHECKPOINT after it
    wal_bytes: int = 0  # pg_stat_wal, run + CHECKPOINT
    buffers_written: int = 0  # pg_stat_bgwriter, run + CHECKPOINT
    checkpoint_seconds: float = 0.0  # the CHECKPOINT after the clock stopped

    @property
    def per_second(self) -> float:
        return self.messages / self.seconds


def process_tree_cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system) of process ``pid`` and every live descendant (``serve``'s
    intake worker processes among them), from ``/proc``; 0 if ``pid`` is gone."""
    processes = live_processes()
    tree, frontier = {pid}, [pid]
    while frontier:
        parent = frontier.pop()
        children = [child for child, fields in processes.items() if int(fields[1]) == parent]
        tree.update(children)
        frontier.extend(children)
    return sum(cpu_seconds(processes[member]) for member in tree if member in processes)


class ServerBackends:
    """The PostgreSQL backend processes serving ``engine``'s connections (their pids, from
    ``pg_backend_pid()`` as each connection opens), and their CPU time: the server's work
    for this benchmark alone, even on a server other sessions use at the same time (a sum
    over every ``postgres`` process would count theirs). Background processes (WAL
    writer, checkpointer) are not included. Needs the server on this machine."""

    def __init__(self, engine: sa.Engine) -> None:
        self._pids: set[int] = set()
        sa.event.listen(engine, "connect", self._on_connect)

    def _on_connect(self, dbapi_connection: Any, _record: Any) -> None:
        self._pids.add(dbapi_connection.info.backend_pid)

    def cpu_seconds(self) -> dict[int, float]:
        return {pid: process_cpu_seconds(pid) for pid in self._pids}

    def since(self, before: dict[int, float]) -> float:
        now = self.cpu_seconds()
        return sum(seconds - before.get(pid, 0.0) for pid, seconds in now.items())


def empty_tables(engine: sa.Engine) -> None:
    """Empty the written tables and flush dirty pages, so every run starts alike."""
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "TRUNCATE failed_message_groups, failed_message_retries, failed_messages, "
            "known_endpoints, failed_error_imports"
        )
    with engine.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql("VACUUM ANALYZE")
        with contextlib.suppress(sa.exc.DBAPIError):  # needs a superuser or pg_checkpoint
            conn.exec_driver_sql("CHECKPOINT")


def table_state(engine: sa.Engine) -> tuple[int, int, int, int]:
    """(rows, total attempts, group rows, known endpoints) as stored."""
    with engine.connect() as conn:
        rows, attempts = conn.execute(
            sa.select(
                sa.func.count(),
                sa.func.coalesce(sa.func.sum(failed_messages.c.number_of_processing_attempts), 0),
            )
        ).one()
        groups = conn.execute(sa.select(sa.func.count()).select_from(failed_message_groups))
        endpoints = conn.execute(sa.select(sa.func.count()).select_from(known_endpoints))
        return int(rows), int(attempts), int(groups.scalar_one()), int(endpoints.scalar_one())


class Instruments:
    """While ``active``: SQLAlchemy compiled-cache outcomes per statement kind, and the time
    spent inside ``cursor.execute``/``executemany`` (driver + network + server), summed over
    threads. Compilation happens before the cursor call, so it is not in that time."""

    def __init__(self, engine: sa.Engine) -> None:
        self.backends = ServerBackends(engine)
        self.cache: Counter[str] = Counter()
        self.cursor_seconds = 0.0
        self.active = False
        self._lock = threading.Lock()
        self._local = threading.local()
        sa.event.listen(engine, "before_cursor_execute", self._before)
        sa.event.listen(engine, "after_cursor_execute", self._after)

    def reset(self) -> None:
        self.cache.clear()
        self.cursor_seconds = 0.0

    def _before(self, *_: Any) -> None:
        self._local.started = time.perf_counter()

    def _after(
        self,
        conn: Any,
        cursor: Any,
        statement: str,
        parameters: Any,
        context: Any,
        executemany: bool,
    ) -> None:
        if not self.active:
            return
        seconds = time.perf_counter() - getattr(self._local, "started", time.perf_counter())
        # SQLAlchemy's own words (its SQL log): "cached since ..." (hit), "generated in ..."
        # (miss: compiled, then cached), "no key ..." (uncacheable: compiled every time).
        stats = context._get_cache_stats() if context is not None else "raw sql"
        outcome = {"cached": "hit", "generated": "miss", "no": "no cache key"}.get(
            stats.split(None, 1)[0], stats
        )
        kind = " ".join(statement.split(None, 3)[:3]).lower()
        with self._lock:
            self.cursor_seconds += seconds
            self.cache[f"{kind}: {outcome}"] += 1


def postmaster_pid(backend_pid: int) -> int:
    """The parent of backend ``backend_pid`` (from ``/proc``): the server's postmaster."""
    fields = stat_fields(backend_pid)
    if fields is None:
        raise ProcessLookupError(backend_pid)
    return int(fields[1])


def server_tree_cpu_seconds(postmaster: int) -> float:
    """CPU seconds of the whole server: the postmaster, every live child (backends, WAL
    writer, checkpointer, background writer, autovacuum launcher and workers) and the
    children that exited and were reaped (the postmaster's ``cutime`` + ``cstime``). The
    sum only grows, so a difference over a run counts every server process's work in it,
    other sessions' included (a scratch server, ``--scratch-server``, has none)."""
    fields = stat_fields(postmaster)
    if fields is None:
        raise ProcessLookupError(postmaster)
    total = cpu_seconds(fields, reaped_children=True)
    for child in live_processes().values():
        if int(child[1]) == postmaster:
            total += cpu_seconds(child)
    return total


@dataclass(frozen=True)
class ServerCounters:
    """Cluster-wide counters read before and after a run: the WAL insert position (its
    difference is the WAL written, every session's), ``pg_stat_bgwriter``'s buffer writes
    (PostgreSQL 15-16; backends report theirs within a second or so, the checkpointer at
    the end of each checkpoint) and the whole server's CPU."""

    cpu_seconds: float
    wal_bytes: int  # the WAL insert position, in bytes
    buffers_written: int  # by the checkpointer, the background writer and backends

    @classmethod
    def read(cls, engine: sa.Engine, postmaster: int) -> ServerCounters:
        with engine.connect() as conn:
            lsn = conn.exec_driver_sql("SELECT pg_current_wal_insert_lsn()::text").scalar_one()
            written = conn.exec_driver_sql(
                "SELECT buffers_checkpoint + buffers_clean + buffers_backend FROM pg_stat_bgwriter"
            ).scalar_one()
        high, low = str(lsn).split("/")
        wal = (int(high, 16) << 32) + int(low, 16)
        return cls(server_tree_cpu_seconds(postmaster), int(wal), int(written))


def checkpoint(engine: sa.Engine) -> None:
    """``CHECKPOINT`` (skipped without the right: a superuser or ``pg_checkpoint``)."""
    with engine.connect() as conn, contextlib.suppress(sa.exc.DBAPIError):
        conn.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql("CHECKPOINT")


def measure(
    name: str,
    engine: sa.Engine,
    run: Callable[[], None],
    *,
    warm_up: Callable[[], None],
    messages: int,
    instruments: Instruments,
    note: str = "",
    gc_on: bool = True,
) -> Result:
    """Warm up, empty the tables, then time ``run`` alone, with the garbage collector on
    (as ``controlroom serve`` runs) unless ``gc_on`` is false. After the clock stops, a
    ``CHECKPOINT`` flushes the run's pages: its seconds, and the whole server's CPU, WAL
    and buffer writes over the run and that flush, are the run's background work."""
    empty_tables(engine)
    warm_up()
    empty_tables(engine)
    gc.collect()
    if not gc_on:
        gc.disable()
    instruments.reset()
    with engine.connect() as conn:  # a connection ServerBackends has seen: its parent
        postmaster = postmaster_pid(conn.connection.dbapi_connection.info.backend_pid)  # type: ignore[union-attr]
    counters_before = ServerCounters.read(engine, postmaster)
    instruments.active = True
    try:
        server_started = instruments.backends.cpu_seconds()
        cpu_started = time.process_time()
        started = time.perf_counter()
        run()
        seconds = time.perf_counter() - started
        cpu_seconds = time.process_time() - cpu_started
        server_cpu_seconds = instruments.backends.since(server_started)
    finally:
        instruments.active = False
        gc.enable()
    flush_started = time.perf_counter()
    checkpoint(engine)
    checkpoint_seconds = time.perf_counter() - flush_started
    counters_after = ServerCounters.read(engine, postmaster)
    rows, attempts, groups, endpoints = table_state(engine)
    return Result(
        name,
        seconds,
        messages,
        rows,
        attempts,
        groups,
        endpoints,
        note,
        Counter(instruments.cache),
        instruments.cursor_seconds,
        cpu_seconds,
        server_cpu_seconds,
        all_server_cpu_seconds=counters_after.cpu_seconds - counters_before.cpu_seconds,
        wal_bytes=counters_after.wal_bytes - counters_before.wal_bytes,
        buffers_written=counters_after.buffers_written - counters_before.buffers_written,
        checkpoint_seconds=checkpoint_seconds,
    )


def timed_parse(
    messages: Sequence[Message], *, gc_on: bool = True
) -> tuple[list[FailedAttempt], float]:
    """Parse ``messages``; the wall seconds it took (garbage collector on unless ``gc_on``
    is false)."""
    gc.collect()
    if not gc_on:
        gc.disable()
    try:
        started = time.perf_counter()
        attempts = [
            parse_failed_message(m.headers, m.body, max_body_size_to_store=MAX_BODY_SIZE_TO_STORE)
            for m in messages
        ]
        return attempts, time.perf_counter() - started
    finally:
        gc.enable()


@contextlib.contextmanager
def scratch_database(admin_url: str) -> Iterator[str]:
    """A new empty database next to ``admin_url``'s; dropped on the way out (its
    admin connection checked first: the server may have restarted meanwhile)."""
    admin = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT", pool_pre_ping=True)
    name = f"controlroom_bench_{uuid.uuid4().hex[:12]}"
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
        try:
            yield sa.make_url(admin_url).set(database=name).render_as_string(hide_password=False)
        finally:
            with admin.connect() as conn:
                conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        admin.dispose()


def environment(engine: sa.Engine) -> dict[str, str]:
    """What the figures depend on: load, the server and its settings (autovacuum first,
    ``pgserver.describe_server``), Python, the drivers, the CPUs."""
    with engine.connect() as conn:
        server = describe_server(conn)
    import psycopg

    load = ", ".join(f"{value:.2f}" for value in os.getloadavg())
    return {
        "Load average": f"{load} (1, 5, 15 min) before the runs",
        "PostgreSQL": server,
        "Python": f"{platform.python_version()} ({platform.python_implementation()})",
        "SQLAlchemy / psycopg": f"{sa.__version__} / {psycopg.__version__} "
        f"(libpq {psycopg.pq.version()}, {psycopg.pq.__impl__})",
        "CPUs": f"{os.cpu_count()} ({platform.machine()}, {platform.platform(terse=True)})",
    }


@contextlib.contextmanager
def without_search(engine: sa.Engine) -> Iterator[None]:
    """A probe of what full-text search costs the write path: no terms computed (every
    row gets an empty ``tsvector``) and no GIN index, for the duration; never the
    service's configuration."""
    with engine.begin() as conn:
        conn.exec_driver_sql("DROP INDEX ix_failed_messages_search_vector")
    terms = writer_module.winner_search_terms
    writer_module.winner_search_terms = lambda message: []
    try:
        yield
    finally:
        writer_module.winner_search_terms = terms
        with engine.begin() as conn:
            conn.exec_driver_sql("TRUNCATE failed_messages CASCADE")
            conn.exec_driver_sql(
                "CREATE INDEX ix_failed_messages_search_vector ON failed_messages "
                "USING gin (search_vector) WITH (fastupdate = on)"
            )


COUNTER_TRIGGERS = (
    # The tallies (migration 0012).
    *(("failed_messages", f"failed_messages_tally_{op}") for op in ("insert", "update", "delete")),
    # The group counts (0014).
    ("failed_messages", "failed_messages_count_status"),
    ("failed_message_groups", "failed_message_groups_count_added"),
    ("failed_message_groups", "failed_message_groups_count_removed"),
    # The group rows' copies of their message's status and failure window (0011, 0013).
    ("failed_messages", "failed_messages_copy_to_groups"),
    ("failed_message_groups", "failed_message_groups_copy_message"),
)
"""Every trigger the read side added to the write path; their TRUNCATE triggers stay on."""


@contextlib.contextmanager
def without_counters(engine: sa.Engine) -> Iterator[None]:
    """A probe of what the read side's counters cost the write path: the triggers of the
    tallies, the group counts and the group rows' copies (``COUNTER_TRIGGERS``) disabled
    for the duration (the writer's folds then find nothing to fold; its group-row insert
    still reads the copies from the messages, ``copies.py`` measures that part); never
    the service's configuration. Afterwards the tables are emptied, which empties the
    tallies and the group counts too (their TRUNCATE triggers), so they are right again."""
    with engine.begin() as conn:
        for table, trigger in COUNTER_TRIGGERS:
            conn.exec_driver_sql(f"ALTER TABLE {table} DISABLE TRIGGER {trigger}")
    try:
        yield
    finally:
        with engine.begin() as conn:
            for table, trigger in COUNTER_TRIGGERS:
                conn.exec_driver_sql(f"ALTER TABLE {table} ENABLE TRIGGER {trigger}")
            conn.exec_driver_sql("TRUNCATE failed_messages CASCADE")


# --- report -------------------------------------------------------------------------------
Load = Callable[[sa.Engine], None]


def _no_probe(_engine: sa.Engine) -> contextlib.AbstractContextManager[None]:
    return contextlib.nullcontext()


@dataclass(frozen=True)
class Method:
    """One way of loading the workload, measured once per round."""

    key: str  # short name the ratios use
    name: str
    run: Load
    warm_up: Load
    messages: int  # input messages of the timed load
    note: str
    database: str = "today"  # "today": migrated to head; "previous": to PREVIOUS_REVISION
    probe: Callable[[sa.Engine], contextlib.AbstractContextManager[None]] = _no_probe


Rounds = dict[str, list[Result]]  # method key -> its result in each round, in round order

RATIOS: tuple[tuple[str, str, str], ...] = (
    ("write path (2 at once) / previous schema's write path", "write2", "previous"),
    (
        "today's writer / previous writer, both on today's schema without search",
        "nosearch",
        "prevwriter",
    ),
    ("write path (2 at once) / COPY all tables (share of the ceiling)", "write2", "copyall"),
    ("write path (2 at once) / COPY messages table only", "write2", "copyone"),
    ("write path (2 at once) / naive, commit per message (batching + the rest)", "write2", "naive"),
    (
        "write path (2 at once) / naive, commit per batch (the write path's own SQL)",
        "write2",
        "naivebatch",
    ),
    (
        "naive commit per batch / naive commit per message (what batching commits buys)",
        "naivebatch",
        "naive",
    ),
    ("with search / without search (probe)", "write2", "nosearch"),
    ("with counters / without counters (probe)", "write2", "nocounters"),
)
"""(label, numerator key, denominator key): rates of the same round divided."""


def _median_range(values: Sequence[float], fmt: str) -> str:
    if len(values) == 1:
        return format(values[0], fmt)
    return (
        f"{format(statistics.median(values), fmt)} "
        f"({format(min(values), fmt)}-{format(max(values), fmt)})"
    )


def report(
    console: Console,
    env: dict[str, str],
    methods: Sequence[Method],
    rounds: Rounds,
    *,
    parse_seconds: float,
    messages: int,
    unique: int,
    batch_size: int,
    gc_on: bool,
) -> None:
    info = Table.grid(padding=(0, 2))
    for key, value in env.items():
        info.add_row(f"[bold]{key}[/]", value)
    info.add_row(
        "[bold]Workload[/]",
        f"{messages:,} failed messages: {unique:,} distinct ids + {messages - unique:,} later "
        f"attempts of them; {BODY_BYTES} B JSON bodies; batch size {batch_size}",
    )
    count = len(next(iter(rounds.values())))
    info.add_row(
        "[bold]Rounds[/]",
        f"{count}, every method once per round, the order rotating by one each round; "
        f"garbage collector {'ON (as serve runs)' if gc_on else 'OFF during timed runs'}",
    )
    console.print(info)
    table = Table(
        title="Ingestion into PostgreSQL: median over rounds (min-max); "
        "messages/s = input messages / wall seconds"
    )
    for name in (
        "method",
        "messages/s",
        "ms CPU/msg client",
        "ms CPU/msg PG backends",
        "ms CPU/msg whole server, run + CHECKPOINT",
        "WAL KB/msg",
        "buffers written/msg",
        "CHECKPOINT s",
        "rows",
        "attempts",
        "groups",
        "endpoints",
    ):
        table.add_column(
            name,
            justify="left" if name == "method" else "right",  # type: ignore[arg-type]
            min_width=40 if name == "method" else None,
        )
    table.add_row(
        "parse_failed_message (CPU only, no database, once)",
        f"{messages / parse_seconds:,.0f}",
        f"{1000 * parse_seconds / messages:.2f}",
        *[""] * 9,
    )
    for method in methods:
        results = rounds[method.key]
        last = results[-1]
        table.add_row(
            f"{method.name} [{method.key}]",
            _median_range([r.per_second for r in results], ",.0f"),
            _median_range([1000 * r.cpu_seconds / r.messages for r in results], ".2f"),
            _median_range([1000 * r.server_cpu_seconds / r.messages for r in results], ".2f"),
            _median_range([1000 * r.all_server_cpu_seconds / r.messages for r in results], ".2f"),
            _median_range([r.wal_bytes / 1024 / r.messages for r in results], ".1f"),
            _median_range([r.buffers_written / r.messages for r in results], ".2f"),
            _median_range([r.checkpoint_seconds for r in results], ".2f"),
            f"{last.rows:,}",
            f"{last.attempts:,}",
            f"{last.groups:,}",
            f"{last.endpoints:,}",
        )
    console.print(table)
    for method in methods:
        console.print(f"[dim]\\[{method.key}] {method.note}[/]")
    console.print(
        f"Expected end state: {unique:,} rows holding {messages:,} attempts. The naive "
        "baselines count each message as one attempt and write no groups or endpoints (and may "
        "write a sample only, see their notes). 'PG backends' is the CPU of this run's own "
        "server processes; 'whole server' is every PostgreSQL process (WAL writer, "
        "checkpointer, autovacuum, other sessions' backends on a shared server) over the run "
        "and the CHECKPOINT that flushes its pages after the clock stops. WAL and buffers "
        "are cluster-wide deltas over the same span. Client and server share this machine's "
        "CPUs; other load on it (see the load averages) slows every figure."
    )
    print_ratios(console, rounds)
    load = ", ".join(f"{value:.2f}" for value in os.getloadavg())
    console.print(f"Load average after the runs: {load} (1, 5, 15 min)")
    for method in methods:
        last = rounds[method.key][-1]
        in_cursor = [r.cursor_seconds / r.seconds for r in rounds[method.key]]
        outcomes = ", ".join(f"{key} x{count}" for key, count in sorted(last.cache.items()))
        if outcomes:
            console.print(
                f"[dim]\\[{method.key}] inside cursor calls "
                f"{_median_range([100 * share for share in in_cursor], '.0f')} % of the wall "
                f"time (summed over threads); SQLAlchemy compiled cache, last round: {outcomes}[/]"
            )


def _ms(seconds: float, result: Result) -> str:
    return f"{1000 * seconds / result.messages:.2f}"


def print_ratios(console: Console, rounds: Rounds) -> None:
    """Each ratio of ``RATIOS`` from the two methods' rates in the same round (side by
    side on a machine whose load moves), as the median and range over rounds, with the
    ratio of PostgreSQL (backends) and client CPU per message the same way."""
    for label, top, bottom in RATIOS:
        if top not in rounds or bottom not in rounds:
            continue
        pairs = list(zip(rounds[top], rounds[bottom], strict=True))
        rate = [a.per_second / b.per_second for a, b in pairs]
        pg = [
            (a.server_cpu_seconds / a.messages) / (b.server_cpu_seconds / b.messages)
            for a, b in pairs
            if b.server_cpu_seconds
        ]
        client = [
            (a.cpu_seconds / a.messages) / (b.cpu_seconds / b.messages)
            for a, b in pairs
            if b.cpu_seconds
        ]
        console.print(
            f"[bold]{label}[/]: rate {_median_range(rate, '.2f')}x; CPU per message, "
            f"PG backends {_median_range(pg, '.2f') if pg else '-'}x, client "
            f"{_median_range(client, '.2f') if client else '-'}x "
            f"(per round: {', '.join(f'{value:.2f}' for value in rate)})"
        )


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument(
        "--messages",
        type=int,
        default=DEFAULT_MESSAGES,
        help="failed messages to generate (default %(default)s)",
    )
    parser.add_argument(
        "--repeat-share",
        type=float,
        default=DEFAULT_REPEAT_SHARE,
        help="share of messages that are later attempts of an earlier one (default %(default)s)",
    )
    parser.add_argument(
        "--naive-messages",
        type=int,
        default=DEFAULT_NAIVE_MESSAGES,
        help="messages the naive baseline writes, from the start (default %(default)s; "
        "0: all of them)",
    )
    parser.add_argument("--seed", type=int, default=2, help="generator seed (default 2)")
    parser.add_argument(
        "--counters-rounds",
        type=int,
        default=0,
        help="instead of the full run: only the write path with and without the counters' "
        "triggers (tallies, group counts, group rows' copies), 1 and "
        "concurrent_batches batches at once, this many rounds in alternating order, and the "
        "ratios per round",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="rounds; each runs every method once, the order rotating by one (default %(default)s)",
    )
    parser.add_argument(
        "--gc-off",
        action="store_true",
        help="pause the garbage collector during timed runs (serve runs with it on, "
        "the default here)",
    )
    parser.add_argument(
        "--methods",
        default="",
        help="comma-separated method keys to run (default: all): write1, write2, naive, "
        "naivebatch, copyone, copyall, nocounters, nosearch, prevwriter, previous",
    )
    add_server_arguments(parser)
    args = parser.parse_args(argv)
    if args.messages < 2 * WARM_UP_MESSAGES:
        parser.error(f"--messages must be at least {2 * WARM_UP_MESSAGES}")
    if not 0 <= args.repeat_share < 1:
        parser.error("--repeat-share must be at least 0 and below 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    with admin_server(args, os.environ.get(ADMIN_URL_ENV) or DEFAULT_ADMIN_URL) as admin_url:
        return run(args, admin_url)


def run(args: argparse.Namespace, admin_url: str) -> int:
    """Every measurement of ``args`` on the server of ``admin_url``."""
    console = Console()
    if not console.is_terminal:
        console = Console(width=230)
    ingestion = IngestionSettings()
    batch_size, concurrent = ingestion.batch_size, ingestion.concurrent_batches

    with console.status("generating messages"):
        messages = generate_messages(
            args.messages, repeat_share=args.repeat_share, seed=args.seed, now=datetime.now(UTC)
        )
    with console.status("parsing"):
        attempts, parse_seconds = timed_parse(messages, gc_on=not args.gc_off)
    del messages
    unique = len({attempt.unique_message_id for attempt in attempts})
    columns, final_rows = copy_rows(attempts)
    warm = attempts[:WARM_UP_MESSAGES]
    warm_columns, warm_rows = copy_rows(warm)
    count = len(attempts)
    naive_count = min(args.naive_messages or count, count)
    naive_sample = attempts[:naive_count]
    sample = f"; first {naive_count:,} messages only" if naive_count < count else ""
    states: dict[str, EndState] = {}

    if args.counters_rounds:
        return compare_counters(
            console,
            admin_url,
            [
                (
                    "Controlroom write path, 1 batch at a time",
                    lambda engine: write_path(engine, attempts, batch_size, 1),
                    lambda engine: write_path(engine, warm, batch_size, 1),
                    count,
                    "",
                ),
                (
                    f"Controlroom write path, {concurrent} batches at once",
                    lambda engine: write_path(engine, attempts, batch_size, concurrent),
                    lambda engine: write_path(engine, warm, batch_size, concurrent),
                    count,
                    "",
                ),
            ],
            args.counters_rounds,
        )

    methods = [
        Method(
            "write1",
            "Controlroom write path, 1 batch at a time",
            lambda engine: write_path(engine, attempts, batch_size, 1),
            lambda engine: write_path(engine, warm, batch_size, 1),
            count,
            "fold, conditional upsert, groups, endpoints; 1 transaction per batch",
        ),
        Method(
            "write2",
            f"Controlroom write path, {concurrent} batches at once",
            lambda engine: write_path(engine, attempts, batch_size, concurrent),
            lambda engine: write_path(engine, warm, batch_size, concurrent),
            count,
            f"{concurrent} writer threads (concurrent_batches), as the service runs",
        ),
        Method(
            "naive",
            "naive: ORM merge + commit per message",
            lambda engine: naive_merge(engine, naive_sample),
            lambda engine: naive_merge(engine, warm),
            naive_count,
            "SELECT, then INSERT or UPDATE, then COMMIT, per message" + sample,
        ),
        Method(
            "naivebatch",
            f"naive: ORM merge per message, commit per {batch_size}",
            lambda engine: naive_merge_batched(engine, naive_sample, batch_size),
            lambda engine: naive_merge_batched(engine, warm, batch_size),
            naive_count,
            "the naive SQL with the write path's commits" + sample,
        ),
        Method(
            "copyone",
            "COPY messages table only (psycopg 3 COPY FROM STDIN)",
            lambda engine: copy_load(engine, columns, final_rows),
            lambda engine: copy_load(engine, warm_columns, warm_rows),
            count,
            f"{len(final_rows):,} folded rows, no group rows or endpoints, 1 transaction",
        ),
        Method(
            "copyall",
            "COPY ceiling, all tables (same end state as the write path)",
            lambda engine: copy_end_state(engine, states["all"]),
            lambda engine: copy_end_state(engine, states["warm"]),
            count,
            "the write path's end state (messages, group rows, endpoints) by COPY, "
            "1 transaction; the counters' triggers fire as for the write path",
        ),
        Method(
            "nocounters",
            f"write path WITHOUT counters, {concurrent} batches at once (probe)",
            lambda engine: write_path(engine, attempts, batch_size, concurrent),
            lambda engine: write_path(engine, warm, batch_size, concurrent),
            count,
            "the counters' triggers disabled: what the read side's counters cost",
            probe=without_counters,
        ),
        Method(
            "nosearch",
            f"write path WITHOUT search, {concurrent} batches at once (probe)",
            lambda engine: write_path(engine, attempts, batch_size, concurrent),
            lambda engine: write_path(engine, warm, batch_size, concurrent),
            count,
            "no terms computed, empty tsvector, GIN index dropped: what search costs",
            probe=without_search,
        ),
        Method(
            "prevwriter",
            f"previous writer on today's schema WITHOUT search, {concurrent} at once",
            lambda engine: write_path(engine, attempts, batch_size, concurrent, PreviousWriter),
            lambda engine: write_path(engine, warm, batch_size, concurrent, PreviousWriter),
            count,
            "benchmarks/previous_write_path.py on today's tables, triggers and indexes, GIN "
            "dropped like the probe above: only the writer differs from it",
            probe=without_search,
        ),
        Method(
            "previous",
            f"previous schema's write path, {concurrent} batches at once",
            lambda engine: write_path(engine, attempts, batch_size, concurrent, PreviousWriter),
            lambda engine: write_path(engine, warm, batch_size, concurrent, PreviousWriter),
            count,
            f"baseline: a database migrated to {PREVIOUS_REVISION} only (tsvector generated by "
            "the server, none of the later triggers or indexes) and its writer",
            database="previous",
        ),
    ]
    if args.methods:
        wanted = set(args.methods.split(","))
        methods = [method for method in methods if method.key in wanted]

    rounds: Rounds = {method.key: [] for method in methods}
    with contextlib.ExitStack() as stack:
        engines: dict[str, sa.Engine] = {}
        for database, revision in (("today", None), ("previous", PREVIOUS_REVISION)):
            if not any(method.database == database for method in methods):
                continue
            url = stack.enter_context(scratch_database(admin_url))
            engine = create_store_engine(url, pool_size=max(2, concurrent))
            stack.callback(engine.dispose)
            if revision is None:
                upgrade_database(engine)
            else:
                upgrade_database(engine, revision)
            engines[database] = engine
        today = engines.get("today") or engines["previous"]
        env = environment(today)
        env["Schema"] = (
            "as migrated: b-tree indexes + tsvector column written by the process + GIN "
            f"index; the previous schema's baseline on a second database migrated to "
            f"{PREVIOUS_REVISION}"
        )
        if "today" in engines and any(method.key == "copyall" for method in methods):
            with console.status("the write path's end state, for the all-tables COPY"):
                states["warm"] = end_state_of(engines["today"], warm, batch_size)
                states["all"] = end_state_of(engines["today"], attempts, batch_size)
        instruments = {name: Instruments(engine) for name, engine in engines.items()}
        for engine in engines.values():
            engine.dispose()  # every connection from here on is one ServerBackends sees
        for round_ in range(args.rounds):
            shift = round_ % len(methods)
            for method in [*methods[shift:], *methods[:shift]]:
                engine = engines[method.database]
                with console.status(f"round {round_ + 1}: {method.name}"), method.probe(engine):
                    rounds[method.key].append(
                        measure(
                            method.name,
                            engine,
                            lambda method=method, engine=engine: method.run(engine),
                            warm_up=lambda method=method, engine=engine: method.warm_up(engine),
                            messages=method.messages,
                            instruments=instruments[method.database],
                            note=method.note,
                            gc_on=not args.gc_off,
                        )
                    )
    report(
        console,
        env,
        methods,
        rounds,
        parse_seconds=parse_seconds,
        messages=count,
        unique=unique,
        batch_size=batch_size,
        gc_on=not args.gc_off,
    )
    return 0


def compare_counters(
    console: Console,
    admin_url: str,
    runs: Sequence[tuple[str, Callable[[sa.Engine], None], Callable[[sa.Engine], None], int, str]],
    rounds: int,
) -> int:
    """``--counters-rounds``: each write path of ``runs`` with the read side's counters and
    without them (``without_counters``), ``rounds`` times, the order alternating between
    rounds so that a machine getting busier or quieter favours neither; prints every run
    and the ratio of each pair (with / without: 1.00 costs nothing, 0.90 is 10 % fewer
    messages/s)."""
    table = Table(title="Write path with and without the counters")
    for name in ("round", "method", "counters", "messages/s", "ms CPU/msg client, PG", "load"):
        table.add_column(name, justify="left" if name == "method" else "right")
    ratios: dict[str, list[float]] = {name: [] for name, *_ in runs}
    with scratch_database(admin_url) as url:
        engine = create_store_engine(url, pool_size=4)
        try:
            upgrade_database(engine)
            engine.dispose()
            instruments = Instruments(engine)
            for round_ in range(1, rounds + 1):
                for name, run, warm_up, messages, _note in runs:
                    rates = {}
                    for counted in (True, False) if round_ % 2 else (False, True):
                        probe = contextlib.nullcontext() if counted else without_counters(engine)
                        with console.status(f"round {round_}: {name}"), probe:
                            result = measure(
                                name,
                                engine,
                                lambda run=run: run(engine),
                                warm_up=lambda warm_up=warm_up: warm_up(engine),
                                messages=messages,
                                instruments=instruments,
                            )
                        rates[counted] = result.per_second
                        table.add_row(
                            str(round_),
                            name,
                            "with" if counted else "WITHOUT",
                            f"{result.per_second:,.0f}",
                            f"{_ms(result.cpu_seconds, result)}, "
                            f"{_ms(result.server_cpu_seconds, result)}",
                            f"{os.getloadavg()[0]:.1f}",
                        )
                    ratios[name].append(rates[True] / rates[False])
        finally:
            engine.dispose()
    console.print(table)
    for name, values in ratios.items():
        console.print(
            f"[bold]{name}: with / without counters, per round "
            f"{', '.join(f'{v:.2f}' for v in values)}; median {statistics.median(values):.2f}[/]"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
