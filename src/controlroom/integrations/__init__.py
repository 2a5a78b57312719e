"""Python task queues into Controlroom: failed tasks in, retries out.

``envelope`` is the pure wire shape every integration publishes (docs/design.md "Python
task queues"); ``celery`` and ``dramatiq`` hook their workers. An integration runs in the
user's worker process: it imports only the pure wire modules of the error instance,
never the database, the API or the console.
"""
