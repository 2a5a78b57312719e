"""The demo's sizes and ratio, which ``controlroom demo``'s options show as defaults and
bounds: kept apart from the demo's generators (``demo.py``, ``demo_endpoints.py``) so
that the CLI reads them without loading the error instance."""

DEFAULT_COUNT = 50
MIN_COUNT = 12
"""Messages in the showcase: the smallest ``count`` that still holds every variety."""

DEFAULT_FAIL_RATIO = 0.25
"""Share of retried messages that fail again: most are confirmed, about one in four not."""
