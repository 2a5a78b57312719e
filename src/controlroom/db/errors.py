"""The one place that classifies store errors: transient, the input's fault, or fatal.

Every other module lets driver errors reach ``classify_store_error``; nothing else decides
what is transient. Each provider classifies its own driver's errors
(``Provider.classify_error``); what is common to all is decided here. Rule source:
docs/design.md "Transient failures".

Only what the store raised is ever the input's fault (``ErrorKind.DATA``): a driver or
server refusal, or ``UnstorableValue``, which ``name_driver_refusals`` raises for the
driver's text-encoding refusals. Any other exception, a ``ValueError`` of our own code
included, is a bug (``FATAL``): a caller gives its batch back rather than keep the
batch's messages as failed imports (docs/design.md "Failed imports": a reason of their own).
"""

from __future__ import annotations

import sqlalchemy as sa

from controlroom.db.providers import loaded_providers
from controlroom.exceptions import BodyStoreError, ErrorKind, UnstorableValue


def classify_store_error(exc: BaseException) -> ErrorKind:
    """Classify an exception raised by the store (SQLAlchemy or driver level)."""
    if isinstance(exc, BodyStoreError):
        return ErrorKind.TRANSIENT
    if isinstance(exc, UnstorableValue):
        return ErrorKind.DATA
    if isinstance(exc, sa.exc.DBAPIError):
        if exc.connection_invalidated:
            return ErrorKind.TRANSIENT
        return classify_store_error(exc.orig) if exc.orig is not None else ErrorKind.FATAL
    if isinstance(exc, sa.exc.TimeoutError):  # connection pool exhausted
        return ErrorKind.TRANSIENT
    # Only the providers loaded so far: a driver's exception can only arise once its
    # provider made the engine that raised it (``create_store_engine`` asks the registry
    # for it), so a provider not yet loaded has nothing to classify, and asking every one
    # would import each database's driver (psycopg) into processes that never use it.
    for provider in loaded_providers():
        kind = provider.classify_error(exc)
        if kind is not None:
            return kind
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return ErrorKind.TRANSIENT
    return ErrorKind.FATAL


def name_driver_refusals(context: sa.engine.ExceptionContext) -> BaseException | None:
    """The engines' ``handle_error`` hook: a ``UnicodeError`` raised while a statement
    was sent (the driver cannot encode a text parameter; neither sqlite3 nor psycopg
    wraps it in its own error class) becomes ``UnstorableValue``, chained to it; any
    other exception is left as it is (``None``). SQLAlchemy calls the hook only for
    exceptions raised inside statement execution, so ours never reach it."""
    original = context.original_exception
    if isinstance(original, UnicodeError):
        return UnstorableValue(f"the database driver cannot send a value: {original}")
    return None


def name_failure(exc: BaseException) -> str:
    """What failed, in one line safe for an open route: the exception's type, then each
    cause's (``BodyStoreError <- NotADirectoryError (Not a directory)``), with an OS
    error's text (never its file name) and a driver error's code
    (``OperationalError <- OperationalError [SQLITE_READONLY]``). Never a message's data,
    a statement, a host or a path."""
    names: list[str] = []
    seen: BaseException | None = exc
    while seen is not None and len(names) < 4:
        name = type(seen).__name__
        if isinstance(seen, OSError) and seen.strerror:
            name += f" ({seen.strerror})"
        code = next((c for p in loaded_providers() if (c := p.error_code(seen)) is not None), None)
        if code:
            name += f" [{code}]"
        names.append(name)
        seen = seen.__cause__
    return " <- ".join(names)


def is_transient(exc: BaseException) -> bool:
    """True when the whole operation should be retried (tenacity predicate)."""
    return classify_store_error(exc) is ErrorKind.TRANSIENT


def store_error_advice(exc: BaseException) -> str | None:
    """What an operator can do about ``exc`` (a store error, SQLAlchemy's wrapper or the
    driver's own) when the deployment is at fault (``Provider.advice``); else ``None``."""
    inner = exc.orig if isinstance(exc, sa.exc.StatementError) and exc.orig is not None else exc
    return next((a for p in loaded_providers() if (a := p.advice(inner)) is not None), None)


def describe_store_error(exc: BaseException) -> str:
    """``exc`` as one line an operator or a sender may read: the driver's exception type
    and the first line of its own message. Never the statement and parameters
    SQLAlchemy adds to the text of its wrappers, nor their documentation link; a
    server's detail lines (which may quote a row) are left out too."""
    inner = exc.orig if isinstance(exc, sa.exc.StatementError) and exc.orig is not None else exc
    lines = str(inner).strip().splitlines()
    name = type(inner).__name__
    return f"{name}: {lines[0]}" if lines else name
