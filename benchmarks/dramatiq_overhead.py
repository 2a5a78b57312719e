"""What ``ControlroomMiddleware`` adds to a Dramatiq worker's handling of a task that
succeeds (docs/design.md "Python task queues": at most 1 ms a task).

Each round runs two variants, the order alternating between rounds: a real Dramatiq
``Worker`` (one worker thread, RabbitMQ broker, Dramatiq's default middleware) drains
``--messages`` messages of an actor that does nothing, once with the middleware added
(``with``) and once without (``without``). The messages are enqueued before the clock
starts; the clock runs from ``Worker.start`` until the actor has run for the last one.
Per task: elapsed / messages, and the process's CPU time (all its threads; less
disturbed by a busy machine than the wall clock) / messages. A warm-up drain of each
variant runs first, untimed. The figures: each variant's per-task median and range over
rounds, and the difference and ratio of the two variants **of the same round** (median
and range). The middleware's cost on this path is the consumer tap (it keeps each
delivery's body and properties) and two hooks; a retry's confirmation is not on it.

Run: ``.venv/bin/python benchmarks/dramatiq_overhead.py [--messages 5000] [--rounds 5]``.
Broker: ``CONTROLROOM_BENCH_RABBITMQ_URL`` (default
``amqp://guest:guest@127.0.0.1:5672/``); the queues are scratch names, deleted at the end.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import threading
import time
import uuid

import dramatiq
import pika
from dramatiq import Message, Worker
from dramatiq.brokers.rabbitmq import RabbitmqBroker

from controlroom.integrations.dramatiq import ControlroomMiddleware

RABBITMQ_URL_ENV = "CONTROLROOM_BENCH_RABBITMQ_URL"
DEFAULT_RABBITMQ_URL = "amqp://guest:guest@127.0.0.1:5672/"


def drain(
    url: str, messages: int, *, with_middleware: bool, queues: list[str]
) -> tuple[float, float]:
    """(wall seconds, process CPU seconds) a fresh one-thread worker takes to run
    ``messages`` enqueued tasks."""
    queue = f"bench-dramatiq-{uuid.uuid4().hex[:8]}"
    queues.append(queue)
    broker = RabbitmqBroker(url=url)
    if with_middleware:
        error_queue = f"bench-error-{uuid.uuid4().hex[:8]}"
        queues.append(error_queue)
        broker.add_middleware(ControlroomMiddleware(error_queue=error_queue))
    done = threading.Event()
    ran = 0

    def noop(n: int) -> None:
        nonlocal ran
        ran += 1
        if ran == messages:
            done.set()

    dramatiq.actor(noop, broker=broker, actor_name="noop", queue_name=queue, max_retries=0)
    for n in range(messages):
        broker.enqueue(
            Message(queue_name=queue, actor_name="noop", args=(n,), kwargs={}, options={})
        )
    broker.emit_after("process_boot")
    worker = Worker(broker, worker_threads=1, worker_timeout=100)
    started, cpu = time.perf_counter(), time.process_time()
    worker.start()
    if not done.wait(600):
        raise RuntimeError(f"the worker ran {ran} of {messages} tasks in 10 minutes")
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    worker.stop()
    broker.close()
    return elapsed, cpu


def delete_queues(url: str, queues: list[str]) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        channel = connection.channel()
        for queue in queues:
            for name in (queue, f"{queue}.DQ", f"{queue}.XQ"):
                channel.queue_delete(name)
    finally:
        connection.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    url = os.environ.get(RABBITMQ_URL_ENV) or DEFAULT_RABBITMQ_URL
    queues: list[str] = []
    per_task: dict[str, list[float]] = {"without": [], "with": []}
    cpu_per_task: dict[str, list[float]] = {"without": [], "with": []}
    try:
        for variant in ("without", "with"):  # warm-up, untimed: imports, first connections
            drain(url, min(args.messages, 500), with_middleware=variant == "with", queues=queues)
        for round_number in range(args.rounds):
            order = ["without", "with"] if round_number % 2 == 0 else ["with", "without"]
            for variant in order:
                seconds, cpu = drain(
                    url, args.messages, with_middleware=variant == "with", queues=queues
                )
                per_task[variant].append(seconds / args.messages * 1000)
                cpu_per_task[variant].append(cpu / args.messages * 1000)
                print(
                    f"round {round_number + 1} {variant:>7}: {per_task[variant][-1]:.4f} "
                    f"ms/task, CPU {cpu_per_task[variant][-1]:.4f} ms/task"
                )
    finally:
        delete_queues(url, queues)

    def describe(values: list[float], digits: int = 4) -> str:
        return (
            f"median {statistics.median(values):.{digits}f} "
            f"(range {min(values):.{digits}f}-{max(values):.{digits}f})"
        )

    def paired(figures: dict[str, list[float]]) -> tuple[list[float], list[float]]:
        pairs = list(zip(figures["with"], figures["without"], strict=True))
        return [w - wo for w, wo in pairs], [w / wo for w, wo in pairs]

    differences, ratios = paired(per_task)
    cpu_differences, cpu_ratios = paired(cpu_per_task)
    print(
        f"\nDramatiq {dramatiq.__version__}, Python {platform.python_version()}, "
        f"{os.cpu_count()} CPUs; {args.messages} tasks a drain, {args.rounds} rounds"
    )
    print(f"without the middleware, ms/task: {describe(per_task['without'])}")
    print(f"with the middleware,    ms/task: {describe(per_task['with'])}")
    print(f"added, ms/task (same round):     {describe(differences)}")
    print(f"ratio with/without (same round): {describe(ratios, 3)}")
    print(f"CPU without, ms/task:            {describe(cpu_per_task['without'])}")
    print(f"CPU with, ms/task:               {describe(cpu_per_task['with'])}")
    print(f"CPU added, ms/task (same round): {describe(cpu_differences)}")
    print(f"CPU ratio (same round):          {describe(cpu_ratios, 3)}")


if __name__ == "__main__":
    main()
