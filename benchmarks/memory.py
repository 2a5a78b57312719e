"""Memory per in-flight byte: ``controlroom serve`` draining large messages, its peak
resident set against its idle footprint measured in the same run.

For each transport (the embedded queue, RabbitMQ on a scratch vhost) and each workload
(``--count`` messages of ``--size-mib`` MiB; one body of ``--large-mib`` MiB):

1. **Idle**: ``controlroom serve`` on an empty queue, in a fresh data dir (SQLite, the
   embedded default store), until ``/api/health`` answers 200 and ``--settle-seconds``
   more; its ``VmHWM`` (peak resident set, startup included) is the idle footprint.
2. **Drain**: the messages are published first (JSON bodies, ``application/json``, so
   each is validated as UTF-8, its prefix kept inline and tokenized for search and the
   whole written to the body store), then serve starts on them in another fresh data
   dir and drains them; its ``VmHWM`` once ``controlroom_ingested_messages_total`` counts
   them all is the peak.
3. Prints, per run: idle and peak RSS, what the drain added (peak - idle), the most it
   may hold in flight (``ingestion.max_inflight_bytes`` or, for a message larger than
   that, the message: it is taken alone), and the ratio added / in flight, beside its
   target (at most 2: docs/decisions.md "What ingestion holds is bounded by bytes").

Run: ``.venv/bin/python benchmarks/memory.py`` (``--help`` for sizes; ``--transport
embedded`` skips RabbitMQ). RabbitMQ: ``CONTROLROOM_BENCH_RABBITMQ_URL`` (default
``amqp://guest:guest@127.0.0.1:5672/``; the vhost is made with ``rabbitmqctl``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import aio_pika
import httpx
from rich.console import Console
from rich.table import Table
from serve import (
    DEFAULT_RABBITMQ_URL,
    RABBITMQ_URL_ENV,
    _stop,
    free_port,
    peak_rss_bytes,
    read_metrics,
    scratch_vhost,
)

from controlroom.config import IngestionSettings
from controlroom.errors.ingest import headers as h
from controlroom.transport import EmbeddedQueue

MIB = 1024 * 1024
QUEUE = "error"
TARGET_RATIO = 2.0  # peak - idle, per byte in flight, at most
RECORD = b'{"id":%d,"customer":"customer-%d","note":"order line %d of a large export"},'


@dataclass(frozen=True, slots=True)
class Workload:
    name: str
    count: int
    size: int  # bytes of each body

    def in_flight(self, budget: int) -> int:
        """The most bytes serve may hold unacknowledged: as many whole messages as fit in
        ``budget``, or one message when it alone is larger (it is taken alone)."""
        return max(self.size, budget // self.size * self.size)


@dataclass(slots=True)
class Run:
    transport: str
    workload: Workload
    idle: int
    peak: int
    budget: int

    @property
    def added(self) -> int:
        return self.peak - self.idle

    @property
    def ratio(self) -> float:
        return self.added / max(self.budget, self.workload.in_flight(self.budget))


def body_of(index: int, size: int) -> bytes:
    """A JSON export of order lines, ``size`` bytes of ASCII, different for each ``index``
    (cut to size: its JSON may end mid-record, which ingestion does not mind)."""
    record = RECORD % (index, index, index)
    lines = record * (size // len(record) + 1)
    return (b'{"export":%d,"lines":[' % index + lines)[: size - 2] + b"]}"


def headers_of(index: int) -> dict[str, str | None]:
    now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S:%f Z")
    return {
        h.MESSAGE_ID: str(uuid.uuid4()),
        h.FAILED_Q: "Sales.Export@host",
        h.PROCESSING_ENDPOINT: "Sales.Export",
        h.TIME_OF_FAILURE: now,
        h.CONTENT_TYPE: "application/json",
        h.ENCLOSED_MESSAGE_TYPES: "Sales.Messages.LargeExport, Sales.Messages",
        h.EXCEPTION_TYPE: "System.InvalidOperationException",
        h.EXCEPTION_MESSAGE: f"export {index} could not be written",
        h.EXCEPTION_STACK_TRACE: "at Sales.Export.Handle(LargeExport message)",
    }


async def publish_embedded(path: Path, workload: Workload) -> None:
    async with EmbeddedQueue(path) as queue:
        for index in range(workload.count):
            await queue.publish(QUEUE, headers_of(index), body_of(index, workload.size))


async def publish_rabbitmq(url: str, workload: Workload) -> None:
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        await channel.declare_queue(QUEUE, durable=True)
        for index in range(workload.count):
            headers = headers_of(index)
            await channel.default_exchange.publish(
                aio_pika.Message(
                    body_of(index, workload.size),
                    headers=dict(headers),
                    delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                    message_id=headers[h.MESSAGE_ID],
                ),
                routing_key=QUEUE,
            )


@contextlib.contextmanager
def serving(broker_url: str, data_dir: Path) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """``controlroom serve`` on ``data_dir`` (SQLite) and ``broker_url`` (empty: the
    embedded queue in the data dir); yields (process, port); stops it on the way out."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONTROLROOM_")}
    env.update(
        CONTROLROOM_DATA_DIR=str(data_dir),
        CONTROLROOM_BROKER_URL=broker_url,
        CONTROLROOM_ERROR_QUEUE=QUEUE,
        CONTROLROOM_PORT=str(port),
    )
    log = open(data_dir.parent / f"{data_dir.name}.log", "wb")  # noqa: SIM115
    process = subprocess.Popen(
        [str(Path(sys.executable).with_name("controlroom")), "serve"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=data_dir.parent,
    )
    try:
        yield process, port
    finally:
        _stop(process)
        log.close()


def wait_healthy(process: subprocess.Popen[bytes], port: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    with httpx.Client(timeout=10) as client:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise SystemExit(f"serve exited with code {process.returncode}")
            with contextlib.suppress(httpx.TransportError):
                if client.get(f"http://127.0.0.1:{port}/api/health").status_code == 200:
                    return
            time.sleep(0.2)
    raise SystemExit("serve did not become healthy")


def wait_drained(process: subprocess.Popen[bytes], port: int, count: int) -> None:
    with httpx.Client(timeout=30) as client:
        while True:
            if process.poll() is not None:
                raise SystemExit(f"serve exited with code {process.returncode}")
            metrics = read_metrics(client, f"http://127.0.0.1:{port}/metrics")
            if metrics is not None and metrics[0] >= count:
                return
            time.sleep(0.5)


def measure(transport: str, broker_url: str, workload: Workload, root: Path, settle: float) -> Run:
    """Idle footprint, then the peak while draining ``workload`` (see the module)."""
    idle_dir = root / f"{transport}-{workload.name}-idle"
    idle_dir.mkdir()
    with serving(broker_url, idle_dir) as (process, port):
        wait_healthy(process, port)
        time.sleep(settle)
        idle = peak_rss_bytes(process.pid)
    drain_dir = root / f"{transport}-{workload.name}-drain"
    drain_dir.mkdir()
    if broker_url:
        asyncio.run(publish_rabbitmq(broker_url, workload))
    else:
        asyncio.run(publish_embedded(drain_dir / "queue.db", workload))
    with serving(broker_url, drain_dir) as (process, port):
        wait_drained(process, port, workload.count)
        peak = peak_rss_bytes(process.pid)
    return Run(transport, workload, idle, peak, IngestionSettings().max_inflight_bytes)


def report(console: Console, runs: Sequence[Run]) -> None:
    table = Table(title="serve's peak resident set per byte in flight")
    for column in (
        "transport",
        "workload",
        "idle RSS MB",
        "peak RSS MB",
        "added MB",
        "in flight at most MB",
        "added / in flight",
        f"target <= {TARGET_RATIO:g}",
    ):
        table.add_column(column, justify="right")
    for run in runs:
        in_flight = max(run.budget, run.workload.in_flight(run.budget))
        table.add_row(
            run.transport,
            run.workload.name,
            f"{run.idle / 1e6:.0f}",
            f"{run.peak / 1e6:.0f}",
            f"{run.added / 1e6:.0f}",
            f"{in_flight / 1e6:.0f}",
            f"{run.ratio:.2f}",
            "met" if run.ratio <= TARGET_RATIO else "[red]missed[/]",
        )
    console.print(table)
    console.print(
        f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; in flight at most: "
        "ingestion.max_inflight_bytes, or the message when it alone is larger"
    )


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=40, help="messages of --size-mib")
    parser.add_argument("--size-mib", type=int, default=8, help="MiB of each body")
    parser.add_argument("--large-mib", type=int, default=100, help="MiB of the one large body")
    parser.add_argument("--transport", choices=["embedded", "rabbitmq", "both"], default="both")
    parser.add_argument("--workload", choices=["many", "large", "both"], default="both")
    parser.add_argument(
        "--settle-seconds", type=float, default=3.0, help="idle time before the idle reading"
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    console = Console(width=150)
    workloads = []
    if args.workload in ("many", "both"):
        workloads.append(
            Workload(f"{args.count} x {args.size_mib} MiB", args.count, args.size_mib * MIB)
        )
    if args.workload in ("large", "both"):
        workloads.append(Workload(f"1 x {args.large_mib} MiB", 1, args.large_mib * MIB))
    transports = ["embedded", "rabbitmq"] if args.transport == "both" else [args.transport]
    runs = []
    rabbitmq_url = os.environ.get(RABBITMQ_URL_ENV) or DEFAULT_RABBITMQ_URL
    with tempfile.TemporaryDirectory(prefix="controlroom-bench-memory-") as root:
        for transport in transports:
            for workload in workloads:
                with console.status(f"{transport}: {workload.name}"):
                    if transport == "embedded":
                        run = measure(transport, "", workload, Path(root), args.settle_seconds)
                    else:
                        with scratch_vhost(rabbitmq_url) as broker_url:
                            run = measure(
                                transport, broker_url, workload, Path(root), args.settle_seconds
                            )
                console.print(
                    f"{transport}, {workload.name}: idle {run.idle / 1e6:.0f} MB, "
                    f"peak {run.peak / 1e6:.0f} MB, ratio {run.ratio:.2f}"
                )
                runs.append(run)
    report(console, runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
