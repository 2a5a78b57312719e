"""The telemetry contract both halves share: what a site reports about a cached call.

Source: docs/design.md "Site call audit" and "site_calls" (the telemetry contract). Pure, and below
both halves: central (``controlroom.sitecalls``) validates and orders what it receives
with it, the site agent (``controlroom.site``) checks what it will report with the same
rules and sizes its own store by the same widths.

- ``widths``: the characters of each column a reported value lands in;
- ``ordering``: statuses, channels, ranks and the ordering key;
- ``stamps``: a site's stamps to 100 ns as sent, and their two stored columns;
- ``contract``: the packet's pydantic model and the checks of single values.

Imports only the standard library, pydantic and ``controlroom.exceptions``: no database
code, nothing of central's API, console, error instance or site-call half, so a site
embedding the agent loads none of them.
"""
