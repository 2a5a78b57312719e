"""The read side: what operators see and the set-based actions they take on stored rows.

``queries`` (lists, search, summaries), ``groups`` (aggregates per classifier, comments),
``endpoints`` (known endpoints, the monitored flag) and ``operations`` (archive,
unarchive, resolve by id, group or range). The HTTP routes in ``controlroom.api`` are
thin layers over these.
"""
