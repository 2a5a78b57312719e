"""Site call audit: telemetry contract, monotonic upsert, audit log ingest, KPIs and their
history, retention (docs/design.md "Site call audit").

The pure core it shares with the site agent is ``controlroom.telemetry`` (the packet's
contract, widths, ranks and the ordering key). Here, thin I/O on top: ``upsert`` (the
statement), ``writer`` (chunks, budgets, fallback, rejected packets), ``intake`` (the
queue), ``kpis``, ``history``, ``queries``, ``retention``, ``audit_verify`` (the
hash chains' walk).
"""
