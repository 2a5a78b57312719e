"""A list's p95 through real HTTP against ``controlroom serve`` while it drains a backlog,
and idle, with intake in serve's process (``--workers 0``) or in a worker process at a
lower CPU priority (``--workers 1``). The embedded default (SQLite, embedded queue).

The backlog is published before serve starts; the reader (one keep-alive client,
serial) reads the newest page of ``/api/errors`` for ``--seconds`` from the moment serve
answers (draining), then again once every message is stored (idle). Prints one line:
both p95s, the requests made, and how many messages were stored by the end of the
draining window (the drain's pace beside the reader).

    python benchmarks/workers_http.py --workers 1 --messages 15000
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from controlroom.config import Settings
from controlroom.transport import create_transport

PORT = 18123
PAGE = "/api/errors?per_page=50&sort=time_of_failure&direction=desc"


def failed_headers(message_id: str) -> dict[str, str | None]:
    """The NServiceBus headers of one failed message of endpoint Sales."""
    return {
        "NServiceBus.MessageId": message_id,
        "NServiceBus.FailedQ": "Sales",
        "NServiceBus.ProcessingEndpoint": "Sales",
        "NServiceBus.ContentType": "application/json",
        "NServiceBus.ExceptionInfo.ExceptionType": "System.InvalidOperationException",
        "NServiceBus.ExceptionInfo.Message": "The order could not be placed.",
    }


async def publish(settings: Settings, count: int) -> None:
    transport = create_transport(settings)
    await transport.start()
    try:
        for n in range(count):
            body = b'{"n": %d, "text": "some body"}' % n
            await transport.publish(settings.error_queue, failed_headers(f"b-{n}"), body)
    finally:
        await transport.close()


async def p95_ms(client: httpx.AsyncClient, seconds: float) -> tuple[float, int]:
    latencies: list[float] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        started = time.perf_counter()
        (await client.get(PAGE)).raise_for_status()
        latencies.append(time.perf_counter() - started)
    latencies.sort()
    return latencies[int(len(latencies) * 0.95)] * 1000, len(latencies)


async def stored(client: httpx.AsyncClient) -> int:
    return int((await client.get("/api/errors?per_page=1")).headers["Total-Count"])


async def measure(workers: int, messages: int, seconds: float, data: Path) -> str:
    settings = Settings(data_dir=data)
    await publish(settings, messages)
    env = {
        **os.environ,
        "CONTROLROOM_DATA_DIR": str(data),
        "CONTROLROOM_INGESTION__WORKERS": str(workers),
        "CONTROLROOM_PORT": str(PORT),
    }
    serve = subprocess.Popen(
        [str(Path(sys.executable).with_name("controlroom")), "serve"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{PORT}", timeout=30) as client:
            while True:
                try:
                    await client.get("/api/health")
                    break
                except httpx.TransportError:
                    await asyncio.sleep(0.2)
            draining = await p95_ms(client, seconds)
            by_then = await stored(client)
            while await stored(client) < messages:
                await asyncio.sleep(0.5)
            idle = await p95_ms(client, seconds)
    finally:
        serve.send_signal(signal.SIGTERM)
        serve.wait(60)
    return (
        f"workers={workers}: draining p95 {draining[0]:.1f} ms ({draining[1]} requests, "
        f"{by_then} of {messages} stored by then), idle p95 {idle[0]:.1f} ms "
        f"({idle[1]} requests)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--messages", type=int, default=15_000)
    parser.add_argument("--seconds", type=float, default=8.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as data:
        print(asyncio.run(measure(args.workers, args.messages, args.seconds, Path(data))))


if __name__ == "__main__":
    main()
