"""The one place that classifies store errors: transient, the input's fault, or fatal.

Every other module lets driver errors reach ``classify_store_error``; nothing else decides
what is transient. Each provider classifies its own driver's errors
(``Provider.classify_error``); what is common to all is decided here. Rule source: STYLE.md
(psycopg's error choke point) and DESIGN.md "Transient failures".
"""

from __future__ import annotations

import sqlalchemy.exc

from controlroom.db.providers import PROVIDERS
from controlroom.exceptions import BodyStoreError, ErrorKind


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
    for provider in PROVIDERS.values():
        kind = provider.classify_error(exc)
        if kind is not None:
            return kind
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return ErrorKind.TRANSIENT
    if isinstance(exc, ValueError):  # driver-side encoding refusals, e.g. NUL in text
        return ErrorKind.DATA
    return ErrorKind.FATAL


def is_transient(exc: BaseException) -> bool:
    """True when the whole operation should be retried (tenacity predicate)."""
    return classify_store_error(exc) is ErrorKind.TRANSIENT
