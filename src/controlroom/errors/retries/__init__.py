"""Retries: failed messages sent back to the queues they failed in.

Flow: an operator's request (``requests``) selects messages by id, group, queue or all,
``claims`` them into retry batches (a message is in at most one) and marks them
RetryIssued; the ``processor`` (one process holds its lease) stages each batch and sends
every message in the shape of ``wire``; a consumer's confirmation, ingested like a
failure, resolves the message (``ingest.writer``).
"""
