"""A Python task's arguments read from its message body (pure, no I/O), for the console
and the API.

A failed Celery or Dramatiq task (``Controlroom.TaskQueue``, docs/design.md "Python task
queues") keeps its task message's body byte for byte. Two JSON shapes are read:

- Celery, message protocol 2: ``[args, kwargs, embed]`` (a list, a dict, and a dict of
  callbacks, errbacks, chain and chord, or null);
- Dramatiq: ``{"queue_name", "actor_name", "args", "kwargs", "options", "message_id",
  "message_timestamp"}`` (the names Dramatiq's JSON encoder writes; ``kwargs`` may be
  absent in older messages).

Any other body (pickle, msgpack, protocol 1, JSON of another shape) has no arguments here
and is shown as a body is.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

_DRAMATIQ_KEYS = frozenset({"queue_name", "actor_name", "args"})


@dataclass(frozen=True, slots=True)
class TaskArguments:
    """A task's positional ``args`` and keyword ``kwargs``, each value pretty-printed as
    JSON (two-space indents, non-ASCII kept)."""

    args: tuple[str, ...]
    kwargs: tuple[tuple[str, str], ...]


def task_call(kind: str | None, text: str) -> tuple[list[Any], dict[str, Any]] | None:
    """``(args, kwargs)`` of a ``kind`` (``celery`` or ``dramatiq``) task whose body is
    ``text``, as JSON values; ``None`` when ``kind`` is neither or the body is not that
    task queue's JSON shape."""
    if kind not in ("celery", "dramatiq"):
        return None
    try:
        body = json.loads(text)
    except (ValueError, RecursionError):  # not JSON, or nested deeper than the parser goes
        return None
    return _celery(body) if kind == "celery" else _dramatiq(body)


def task_arguments(kind: str | None, text: str) -> TaskArguments | None:
    """``task_call``'s arguments, each value pretty-printed; ``None`` as ``task_call``."""
    found = task_call(kind, text)
    if found is None:
        return None
    args, kwargs = found
    return TaskArguments(
        tuple(_pretty(value) for value in args),
        tuple((str(name), _pretty(value)) for name, value in kwargs.items()),
    )


def _celery(body: Any) -> tuple[list[Any], dict[str, Any]] | None:
    if not isinstance(body, list) or len(body) != 3:
        return None
    args, kwargs, embed = body
    if not isinstance(args, list) or not isinstance(kwargs, dict):
        return None
    if embed is not None and not isinstance(embed, dict):
        return None
    return args, kwargs


def _dramatiq(body: Any) -> tuple[list[Any], dict[str, Any]] | None:
    if not isinstance(body, dict) or not _DRAMATIQ_KEYS.issubset(body):
        return None
    args, kwargs = body["args"], body.get("kwargs") or {}
    if not isinstance(args, list) or not isinstance(kwargs, dict):
        return None
    return args, kwargs


def _pretty(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False)
