"""``controlroom serve`` with the write path as it was before migration 0009: the
baseline of the end-to-end benchmark (``benchmarks/serve.py``). Benchmark code only.

Run as ``python benchmarks/previous_serve.py serve [options]`` against a PostgreSQL
database the benchmark migrated to ``previous_write_path.PREVIOUS_REVISION`` (0004: the
server computes the generated ``search_vector``). Before handing over to the CLI it
patches five names of the service, and nothing else:

- ``controlroom.errors.ingest.pipeline.FailedMessageBatchWriter`` becomes
  ``previous_write_path.PreviousWriter`` (the seed's counting rule, no ``WHERE`` on the
  update, group rows by ``executemany``), so the ingestion service builds it;
- ``controlroom.server.upgrade_database`` and ``write_missing_search_terms`` do nothing:
  serve would otherwise migrate the database to head (and write the terms migration 0009
  introduced) before ingesting, and the baseline must keep the previous schema;
- ``controlroom.server._warn_of_audit_log_exposure`` and ``_warn_of_vacuum_settings`` do
  nothing: they read tables that came after the previous schema (audit log, counters).

Everything else is today's serve: transport, batcher, parsing, the rest of the process.
The previous writer does not retry transient errors, keep external bodies from the
retention sweeper, nor write confirmed retries or failed imports; the benchmark's
messages need none of these (its end state check would show a failed import).
"""

from __future__ import annotations

import sys
from typing import Any

import sqlalchemy as sa
from previous_write_path import PreviousWriter

from controlroom import cli, server
from controlroom.errors.ingest import pipeline


class PreviousServeWriter(PreviousWriter):
    """``PreviousWriter`` built with the arguments the ingestion service passes its writer."""

    def __init__(self, engine: sa.Engine, **_service_arguments: Any) -> None:
        super().__init__(engine)


def patch_service() -> None:
    """Swap in the previous writer and keep serve from migrating; raises
    ``AttributeError`` when a patched name moved (the launcher must follow it)."""
    for module, name in (
        (pipeline, "FailedMessageBatchWriter"),
        (server, "upgrade_database"),
        (server, "write_missing_search_terms"),
        (server, "_warn_of_audit_log_exposure"),
        (server, "_warn_of_vacuum_settings"),
    ):
        if not hasattr(module, name):
            raise AttributeError(f"{module.__name__}.{name} is gone; update {__file__}")
    pipeline.FailedMessageBatchWriter = PreviousServeWriter  # type: ignore[misc]
    server.upgrade_database = lambda *args, **kwargs: None  # type: ignore[assignment]
    server.write_missing_search_terms = lambda *args, **kwargs: 0  # type: ignore[assignment]
    # Start-up checks of tables that came after the previous schema (audit log, counters).
    server._warn_of_audit_log_exposure = lambda *args, **kwargs: None
    server._warn_of_vacuum_settings = lambda *args, **kwargs: None


if __name__ == "__main__":
    patch_service()
    sys.exit(cli.app(sys.argv[1:], prog_name="controlroom"))
