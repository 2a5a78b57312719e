"""Intake: a failed message from the error queue to its stored row.

Flow: ``pipeline`` takes deliveries from the transport and ``parsing`` turns each into a
``model.FailedAttempt`` (using ``headers``, ``identity``, ``grouping`` and ``bodies``;
pure, no I/O) or a failed import; a unit of work collects a batch and writes external
bodies; ``writer`` folds the batch (``fold``) and writes it in one transaction through the
conditional ``upsert``; the pipeline then acknowledges every delivery of the batch.
``reimport`` re-publishes failed imports. Source: docs/design.md "Error instance: the write
path".
"""
