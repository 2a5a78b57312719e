"""The notification outbox: central stores notifications and dispatches them (e-mail,
webhooks), with retry, park, operator Retry/Discard, KPIs and retention (docs/design.md
"Notification outbox").

``lifecycle`` (pure: states, widths, backoff, the verdict of an attempt), ``store`` (the
table: enqueue, claims, outcomes, operator actions, reads), ``channels`` (webhook and
SMTP senders), ``dispatcher`` (the background task of ``serve``).
"""
