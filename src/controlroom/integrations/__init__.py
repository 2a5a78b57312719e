"""Python task queues into Controlroom: failed tasks in, retries out.

``envelope`` is the pure wire shape every integration publishes (docs/design.md "Python
task queues"); ``celery`` and ``dramatiq`` hook their workers. An integration runs in the
user's worker process: it imports only the pure wire modules of the error instance,
never the database, the API or the console.
"""

from __future__ import annotations


class WorkerDied(Exception):
    """The failure of a task whose worker process died while holding it, redelivered by
    the broker until the integration's limit of worker deaths (docs/decisions.md "A task
    that kills its worker is counted in the message and reported at a limit"). It is
    never raised: the integration reports it, with no traceback, as the failure."""

    def __init__(self, deaths: int) -> None:
        super().__init__(f"the worker process died {deaths} times while holding the task")
        self.deaths = deaths
