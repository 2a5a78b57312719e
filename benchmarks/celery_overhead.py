"""What ``controlroom.integrations.celery.install`` adds to a worker's handling of a task
that succeeds (docs/design.md "Python task queues": at most 1 ms).

A real worker (``-P solo``) drains a queue of ``--tasks`` no-op tasks sent before it
starts, three ways, alternated over ``--rounds`` rounds in the same run (the order
rotating from round to round):

- ``baseline``: Celery's defaults (the message acknowledged before the task runs);
- ``acks_late``: Celery's defaults with ``task_acks_late`` (what ``install`` turns on);
- ``installed``: ``install(app)``.

The worker itself stamps the first ``task_received`` and the last ``task_success``, in
wall time (``time.perf_counter_ns``) and in its own CPU time (``time.process_time_ns``:
all of a solo worker's work, and much less moved than wall time by other processes on a
busy machine); per task = (last - first) / (tasks - 1). The figures are medians over the
rounds, and the ratio of each to the baseline of the same run.

Needs RabbitMQ (``CONTROLROOM_BENCH_RABBITMQ_URL``, default
``amqp://guest:guest@127.0.0.1:5672/``); a scratch vhost is made and deleted with
``rabbitmqctl``.

    .venv/bin/python benchmarks/celery_overhead.py [--tasks 3000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HOST_URL = os.environ.get("CONTROLROOM_BENCH_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/")
MODES = ("baseline", "acks_late", "installed")

APP = """
import os, time
from pathlib import Path
from celery import Celery, signals

app = Celery("bench", broker=os.environ["BENCH_BROKER"])
app.conf.update(task_default_queue=os.environ["BENCH_QUEUE"], worker_prefetch_multiplier=4,
                worker_hijack_root_logger=False, task_ignore_result=True)
MODE = os.environ["BENCH_MODE"]
if MODE == "acks_late":
    app.conf.task_acks_late = True
if MODE == "installed":
    from controlroom.integrations.celery import install
    install(app, error_queue=os.environ["BENCH_QUEUE"] + "-error")

TOTAL = int(os.environ["BENCH_TASKS"])
OUT = Path(os.environ["BENCH_OUT"])
stamps = {"first": 0, "first_cpu": 0, "done": 0}

@app.task(name="bench.noop")
def noop(n):
    return n

@signals.task_received.connect
def received(**_):
    if not stamps["first"]:
        stamps["first"] = time.perf_counter_ns()
        stamps["first_cpu"] = time.process_time_ns()

@signals.task_success.connect
def succeeded(**_):
    stamps["done"] += 1
    if stamps["done"] == TOTAL:
        cpu, wall = time.process_time_ns(), time.perf_counter_ns()
        OUT.write_text(f"{stamps['first']} {wall} {stamps['first_cpu']} {cpu}")
"""


def run_once(url: str, mode: str, tasks: int, workdir: Path) -> tuple[float, float]:
    """(wall, CPU) seconds per task of one worker draining ``tasks`` tasks in ``mode``."""
    from celery import Celery

    queue = f"bench-{uuid.uuid4().hex[:8]}"
    out = workdir / f"{queue}.txt"
    with Celery("producer", broker=url) as producer, producer.producer_or_acquire() as publisher:
        for n in range(tasks):
            producer.send_task("bench.noop", args=(n,), queue=queue, producer=publisher)
    env = os.environ | {
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(workdir)]),
        "BENCH_BROKER": url,
        "BENCH_QUEUE": queue,
        "BENCH_MODE": mode,
        "BENCH_TASKS": str(tasks),
        "BENCH_OUT": str(out),
    }
    command = [sys.executable, "-m", "celery", "-A", "bench_app", "worker", "-P", "solo"]
    command += ["-Q", queue, "-l", "ERROR", "--without-heartbeat", "--without-mingle"]
    command += ["--without-gossip", "-n", f"{queue}@%h"]
    worker = subprocess.Popen(
        command, cwd=workdir, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 600
        while not out.exists():
            if worker.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the {mode} worker ended before draining its queue")
            time.sleep(0.2)
    finally:
        worker.terminate()
        worker.wait(60)
    first, last, first_cpu, last_cpu = (int(part) for part in out.read_text().split())
    return (last - first) / 1e9 / (tasks - 1), (last_cpu - first_cpu) / 1e9 / (tasks - 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    ctl = shutil.which("rabbitmqctl")
    if ctl is None:
        sys.exit("rabbitmqctl not found: this benchmark needs a local RabbitMQ")
    vhost = f"controlroom_bench_{uuid.uuid4().hex[:8]}"
    subprocess.run([ctl, "add_vhost", vhost], check=True, capture_output=True)
    subprocess.run(
        [ctl, "set_permissions", "-p", vhost, "guest", ".*", ".*", ".*"],
        check=True,
        capture_output=True,
    )
    url = HOST_URL.rstrip("/") + "/" + vhost
    results: dict[str, list[tuple[float, float]]] = {mode: [] for mode in MODES}
    try:
        with tempfile.TemporaryDirectory() as scratch:
            workdir = Path(scratch)
            (workdir / "bench_app.py").write_text(APP)
            for round_ in range(args.rounds):
                shift = round_ % len(MODES)  # each mode leads a round: no order effect
                for mode in MODES[shift:] + MODES[:shift]:
                    wall, cpu = run_once(url, mode, args.tasks, workdir)
                    results[mode].append((wall, cpu))
                    print(
                        f"round {round_ + 1} {mode:>9}: {wall * 1e6:8.1f} µs wall, "
                        f"{cpu * 1e6:8.1f} µs CPU per task",
                        flush=True,
                    )
    finally:
        subprocess.run([ctl, "delete_vhost", vhost], capture_output=True)
    print(f"\n{args.tasks} tasks per run, median of {args.rounds} rounds (-P solo):")
    for index, kind in ((0, "wall"), (1, "CPU of the worker")):
        base = statistics.median(r[index] for r in results["baseline"])
        for mode in MODES:
            median = statistics.median(r[index] for r in results[mode])
            print(
                f"  {kind:>17} {mode:>9}: {median * 1e6:8.1f} µs per task, "
                f"{median / base:5.2f}x baseline, {(median - base) * 1e6:+7.1f} µs"
            )


if __name__ == "__main__":
    main()
