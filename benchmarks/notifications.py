"""Notification dispatch benchmark on PostgreSQL: notifications delivered per second to a
local webhook receiver by one and by two ``controlroom serve`` processes, beside the
receiver alone in the same run, and the dispatcher's database work per notification.

What it does (``benchmarks/README.md`` has the figures and how to read them):

1. Starts a scratch PostgreSQL cluster (initdb + pg_ctl, ``pg_stat_statements`` loaded)
   and a webhook receiver in this process (``http.server``, threads; answers 204).
2. **Baseline**: ``--count`` POSTs of a notification-sized body to the receiver from an
   ``httpx`` client, ``--concurrency`` at once: what the receiver takes alone.
3. For 1, then 2 ``serve`` processes: empties the table, enqueues ``--count`` due webhook
   notifications, resets ``pg_stat_statements`` and reads the server's CPU time, starts
   the processes and waits until every notification is Delivered. The rate is counted at
   the receiver, first delivery to last (a process's start-up is not in it); the receiver
   checks each id arrived exactly once.
4. Per notification: statements the server ran (``pg_stat_statements`` calls) and ms of
   server CPU (user + system of the postmaster's processes, live and reaped).

Run: ``.venv/bin/python benchmarks/notifications.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import sqlalchemy as sa
from pgserver import (
    STATEMENTS_SETTINGS,
    enable_statements,
    reset_statements,
    scratch_server,
    statement_calls,
)

from controlroom.db.engine import create_store_engine
from controlroom.db.migrate import upgrade_database
from controlroom.db.tables import notifications
from controlroom.db.transactions import begin_write
from controlroom.notifications.store import NewNotification, enqueue

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
CONTROLROOM = Path(sys.executable).with_name("controlroom")
TICKS = os.sysconf("SC_CLK_TCK")


class Receiver:
    """Counts POSTs by ``webhook-id`` and stamps the first and last."""

    def __init__(self) -> None:
        self.ids: Counter[str] = Counter()
        self.first = self.last = 0.0
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("content-length", "0")))
                now = time.perf_counter()
                with receiver.lock:
                    receiver.ids[self.headers.get("webhook-id", "")] += 1
                    receiver.first = receiver.first or now
                    receiver.last = now
                self.send_response(204)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        class Server(ThreadingHTTPServer):
            request_queue_size = 512
            daemon_threads = True

        self.server = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def reset(self) -> None:
        with self.lock:
            self.ids.clear()
            self.first = self.last = 0.0

    def rate(self) -> float:
        total = sum(self.ids.values())
        return (total - 1) / (self.last - self.first) if total > 1 else 0.0


async def receiver_alone(url: str, count: int, concurrency: int) -> None:
    body = json.dumps({"subject": "s" * 40, "body": "b" * 200}).encode()
    gate = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=30) as client:

        async def one(n: int) -> None:
            async with gate:
                await client.post(url, content=body, headers={"webhook-id": str(n)})

        await asyncio.gather(*(one(n) for n in range(count)))


def server_cpu_ms(engine: sa.Engine) -> float:
    """User + system CPU ms of the server's postmaster and its processes, live and reaped."""
    with engine.connect() as conn:
        data = conn.execute(sa.text("SHOW data_directory")).scalar_one()
    postmaster = int(Path(data, "postmaster.pid").read_text().split()[0])
    ticks = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid, ppid = int(stat.parent.name), int(fields[1])
        if pid == postmaster:
            ticks += sum(int(value) for value in fields[11:15])  # utime stime cutime cstime
        elif ppid == postmaster:
            ticks += int(fields[11]) + int(fields[12])
    return ticks * 1000 / TICKS


def statements(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return statement_calls(conn)


def fill(engine: sa.Engine, count: int) -> None:
    now = datetime.now(UTC)
    with begin_write(engine) as conn:
        conn.execute(sa.delete(notifications))
        for n in range(count):
            enqueue(conn, NewNotification("rule:bench", "Webhook", "ops", f"n {n}", "b"), now=now)


def delivered(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return conn.execute(
            sa.select(sa.func.count()).where(notifications.c.status == "Delivered")
        ).scalar_one()


def run_serve(
    processes: int, url: str, engine: sa.Engine, receiver: Receiver, count: int, scratch: Path
) -> dict[str, float]:
    fill(engine, count)
    receiver.reset()
    with engine.connect() as conn:
        reset_statements(conn)
    cpu = server_cpu_ms(engine)
    env = {
        **os.environ,
        "CONTROLROOM_DATABASE_URL": url,
        "CONTROLROOM_INGEST_ON_SERVE": "false",
        "CONTROLROOM_NOTIFICATIONS__WEBHOOKS": json.dumps(
            [{"name": "ops", "url": receiver.url, "secret": SECRET}]
        ),
        "CONTROLROOM_NOTIFICATIONS__DISPATCH_INTERVAL_SECONDS": "0.2",
    }
    started = []
    for n in range(processes):
        env_n = {**env, "CONTROLROOM_DATA_DIR": str(scratch / f"data-{processes}-{n}")}
        started.append(
            subprocess.Popen(
                [str(CONTROLROOM), "serve", "--port", "0"],
                env=env_n,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
    try:
        while delivered(engine) < count:
            time.sleep(0.2)
    finally:
        for process in started:
            process.terminate()
        for process in started:
            process.wait(timeout=60)
    cpu = server_cpu_ms(engine) - cpu
    twice = sum(1 for times in receiver.ids.values() if times > 1)
    assert len(receiver.ids) == count and twice == 0, (len(receiver.ids), twice)
    return {
        "rate": receiver.rate(),
        "queries": statements(engine) / count,
        "cpu_ms": cpu / count,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--count", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    receiver = Receiver()
    started = time.perf_counter()
    asyncio.run(receiver_alone(receiver.url, args.count, args.concurrency))
    alone = args.count / (time.perf_counter() - started)
    print(f"receiver alone (httpx, {args.concurrency} at once): {alone:,.0f}/s")
    with (
        scratch_server(STATEMENTS_SETTINGS) as admin,
        tempfile.TemporaryDirectory() as scratch,
    ):
        engine = create_store_engine(admin)
        with engine.connect() as conn:
            enable_statements(conn)
        upgrade_database(engine)
        for processes in (1, 2):
            result = run_serve(processes, admin, engine, receiver, args.count, Path(scratch))
            print(
                f"{processes} serve: {result['rate']:,.0f}/s "
                f"({result['rate'] / alone:.2f} x the receiver alone), "
                f"{result['queries']:.1f} statements and {result['cpu_ms']:.2f} ms server CPU "
                "per notification"
            )
        engine.dispose()


if __name__ == "__main__":
    main()
