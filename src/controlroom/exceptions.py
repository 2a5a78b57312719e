"""One exception tree with one root, and the one place that classifies store errors.

Every other module raises these or lets driver errors reach ``classify_store_error``;
nothing else decides what is transient. Rule source: STYLE.md (psycopg's error choke
point) and DESIGN.md "Transient failures".
"""

from __future__ import annotations

import enum
import sqlite3

import psycopg
import sqlalchemy.exc


class ControlroomError(Exception):
    """Root of every error Controlroom raises on purpose."""


class ConfigurationError(ControlroomError):
    """The settings cannot work (e.g. a non-loopback bind without tokens)."""


class UnsupportedProviderError(ConfigurationError):
    """The database URL names a provider Controlroom does not support."""


class MessageRejected(ControlroomError):
    """A message cannot be ingested for a reason of its own; it becomes a failed import.

    ``reason`` is a short operator-facing sentence naming the header or part at fault.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class BodyStoreError(ControlroomError):
    """External body storage failed; the batch must not commit."""


class ErrorKind(enum.Enum):
    """What to do about a failed store operation."""

    TRANSIENT = "transient"  # retry the whole batch
    DATA = "data"  # the input is at fault: isolate the message, keep it as a failed import
    FATAL = "fatal"  # neither: surface it


# SQLSTATE classes and codes that mean "try again": connection exceptions, serialization
# failure, deadlock, lock timeouts, admin shutdown, too many connections.
_TRANSIENT_SQLSTATE_PREFIXES = ("08", "40", "57P", "53")
_TRANSIENT_SQLSTATE_CODES = {"55P03", "57014"}
# Data exceptions (value too long, bad encoding, NUL) and program limits the input hit
# (a tsvector over 1 MB): the input is at fault, not the store.
_DATA_SQLSTATE_PREFIXES = ("22", "54")
_TRANSIENT_SQLITE_MARKERS = ("database is locked", "database is busy", "disk i/o error")


def classify_store_error(exc: BaseException) -> ErrorKind:
    """Classify an exception raised by the store (SQLAlchemy or driver level)."""
    if isinstance(exc, BodyStoreError):
        return ErrorKind.TRANSIENT
    if isinstance(exc, sqlalchemy.exc.DBAPIError):
        if exc.connection_invalidated:
            return ErrorKind.TRANSIENT
        return classify_store_error(exc.orig) if exc.orig is not None else ErrorKind.FATAL
    if isinstance(exc, sqlalchemy.exc.TimeoutError):  # connection pool exhausted
        return ErrorKind.TRANSIENT
    if isinstance(exc, psycopg.DataError) and exc.sqlstate is None:
        return ErrorKind.DATA  # refused by psycopg itself, e.g. a NUL in a text parameter
    if isinstance(exc, psycopg.Error):
        return _classify_sqlstate(exc.sqlstate, isinstance(exc, psycopg.OperationalError))
    if isinstance(exc, sqlite3.Error):
        return _classify_sqlite(exc)
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return ErrorKind.TRANSIENT
    if isinstance(exc, ValueError):  # driver-side encoding refusals, e.g. NUL in PG text
        return ErrorKind.DATA
    return ErrorKind.FATAL


def _classify_sqlstate(sqlstate: str | None, operational: bool) -> ErrorKind:
    if sqlstate is None:
        # No server answer at all: the connection failed or was lost.
        return ErrorKind.TRANSIENT if operational else ErrorKind.FATAL
    if sqlstate.startswith(_TRANSIENT_SQLSTATE_PREFIXES) or sqlstate in _TRANSIENT_SQLSTATE_CODES:
        return ErrorKind.TRANSIENT
    if sqlstate.startswith(_DATA_SQLSTATE_PREFIXES):
        return ErrorKind.DATA
    return ErrorKind.FATAL


def _classify_sqlite(exc: sqlite3.Error) -> ErrorKind:
    text = str(exc).lower()
    if any(marker in text for marker in _TRANSIENT_SQLITE_MARKERS):
        return ErrorKind.TRANSIENT
    if isinstance(exc, (sqlite3.DataError, sqlite3.IntegrityError)):
        return ErrorKind.DATA
    return ErrorKind.FATAL


def is_transient(exc: BaseException) -> bool:
    """True when the whole operation should be retried (tenacity predicate)."""
    return classify_store_error(exc) is ErrorKind.TRANSIENT
