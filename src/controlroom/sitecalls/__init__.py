"""Site call audit: telemetry contract, monotonic upsert, audit log ingest, KPIs and their
history, retention (DESIGN.md "Site call audit", issue 10).

Pure core: ``contract`` (the telemetry packet, widths), ``ordering`` (ranks and the
ordering key). Thin I/O on top: ``upsert`` (the statement), ``writer`` (chunks, budgets,
fallback, rejected packets), ``intake`` (the queue), ``kpis``, ``history``, ``queries``,
``retention``.
"""
