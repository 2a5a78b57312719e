"""The read side: what operators see and the set-based actions they take on stored rows.

``filters`` (what a read selects and orders by), ``lists`` (pages of failed messages),
``counts`` (totals, exact or estimated, and the tallied counts), ``search`` (full text),
``messages`` (one message and its body), ``facets``, ``summaries`` (a list's rows and
pages), ``groups`` (aggregates per classifier, comments), ``endpoints`` (known
endpoints, the monitored flag) and ``operations`` (archive, unarchive, resolve by id,
group or range). The HTTP routes in ``controlroom.api`` are thin layers over these.
"""
