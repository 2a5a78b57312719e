"""A real Dramatiq worker on ``tests.integrations.dramatiq_app``, one thread, until
SIGTERM; prints ``ready`` once it consumes (run as a subprocess by the tests). It boots as
the ``dramatiq`` command's worker process does (``process_boot``, then ``Worker``), in
one process the test can SIGKILL."""

from __future__ import annotations

import logging
import os
import signal
import threading

from dramatiq import Worker

from tests.integrations.dramatiq_app import broker


def main() -> None:
    logging.basicConfig(level=os.environ.get("DRAMATIQ_TEST_LOG_LEVEL", "WARNING"))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    broker.emit_after("process_boot")
    worker = Worker(broker, worker_threads=1, worker_timeout=100)
    worker.start()
    print("ready", flush=True)
    stop.wait()
    worker.stop(timeout=10_000)


if __name__ == "__main__":
    main()
