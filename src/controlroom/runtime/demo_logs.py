"""The demo's quieter logs (README "Quick start"): ``controlroom demo run`` sets
``CONTROLROOM_DEMO_QUIET_LOGS=1`` for its ``serve``, whose log then leaves out what a
demo user need not read: alembic's and httpx's INFO lines (each migration, each request
to a site or a sink) and the access-log lines of the console's static files. A ``serve``
without it logs as before."""

from __future__ import annotations

import logging
import os

QUIET_ENV = "CONTROLROOM_DEMO_QUIET_LOGS"
_QUIET_LOGGERS = ("alembic", "httpx")


def quiet_demo_logs() -> None:
    """Quiet the loggers of the module docstring when ``CONTROLROOM_DEMO_QUIET_LOGS`` is
    ``1`` (in this process; serve's workers call it too); else do nothing."""
    if os.environ.get(QUIET_ENV) != "1":
        return
    for name in _QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    logging.getLogger("uvicorn.access").addFilter(_not_a_static_file)


def _not_a_static_file(record: logging.LogRecord) -> bool:
    """Keep an access-log line unless it is a static file served (uvicorn's access record
    args: client, method, path, HTTP version, status)."""
    args = record.args
    if isinstance(args, tuple) and len(args) == 5:
        _client, method, path, _version, status = args
        static = method == "GET" and str(path).startswith("/static/")
        return not (static and isinstance(status, int) and status < 400)
    return True
