"""The error instance: failed messages from the error queue, stored one row per message.

Three flows, one sub-package each:

- ``ingest``: a delivery from the error queue becomes a failed-message row. Wire contract
  (``headers``, ``identity``, ``grouping``, ``bodies``) and ``parsing`` are pure; ``fold``
  and the ``upsert`` guards are pure SQL expressions; ``writer`` runs one transaction per
  batch; ``pipeline`` batches deliveries and acknowledges them after the commit;
  ``reimport`` puts failed imports back on the queue.
- ``retries``: an operator's retry request claims messages into batches (``requests``,
  ``claims``); the ``processor`` sends them back to the queues they failed in, in the
  shape of ``wire``.
- ``read``: what the API serves (``lists``, ``counts``, ``search``, ``messages``,
  ``facets``, ``groups``, ``endpoints``) and the operator's set-based actions on stored
  rows (``operations``: archive, unarchive, resolve).

``retention`` sweeps Resolved and Archived rows past the retention period.
"""
