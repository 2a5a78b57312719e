"""One exception tree with one root, and the kinds of store failure.

The store's errors are classified in one place, ``controlroom.db.errors``. Rule source:
docs/design.md "Transient failures".
"""

from __future__ import annotations

import enum


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


class UnstorableValue(ControlroomError):
    """The database driver could not send a value of the input (text it cannot encode, e.g.
    an unpaired surrogate): the input's fault. Raised in place of the driver's bare
    ``UnicodeError`` by the engine's error hook (``db.errors.name_driver_refusals``), so
    that no ``ValueError`` of our own code can pass for bad data."""


class DependencyUnreachable(ControlroomError):
    """The store or the broker was still unreachable when the wait at start ended
    (``runtime.startup``); the text is one line naming it and the last reason."""


class BodyStoreError(ControlroomError):
    """External body storage failed; the batch must not commit."""


class ErrorKind(enum.Enum):
    """What to do about a failed store operation."""

    TRANSIENT = "transient"  # retry the whole batch
    DATA = "data"  # the input is at fault: isolate the message, keep it as a failed import
    FATAL = "fatal"  # neither: surface it
