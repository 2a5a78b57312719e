"""The widths, in characters, of the columns a reported value lands in.

Source: docs/design.md "site_calls" and "Audit log"; docs/decisions.md "Telemetry is
refused, never truncated". Defined
here once: central's tables (``controlroom.db.tables``) and the site's tracking store
(``controlroom.site.store``) declare their columns with them, and the contract
(``controlroom.telemetry.contract``) refuses a longer value, never truncating it.
"""

from __future__ import annotations

from typing import Final

UUID_LEN: Final = 36
"""A GUID in its canonical "D" form, lower case: every id column."""

# A call's state (central's ``site_calls``, the site's ``tracked_operations``).
CHANNEL_WIDTH: Final = 32
TARGET_WIDTH: Final = 256
"""A call's target; its audit events carry the same value."""
SITE_WIDTH: Final = 64
"""A site's name (``source_site``), also central's name of a site it pulls from."""
NODE_WIDTH: Final = 64
STATUS_WIDTH: Final = 32
LAST_ERROR_WIDTH: Final = 1024

# An audit event (central's ``audit_log``); its target, site and node use the widths above.
ACTOR_WIDTH: Final = 256
ACTION_WIDTH: Final = 64
OUTCOME_WIDTH: Final = 16
CATEGORY_WIDTH: Final = 32

# A notification (central's ``notifications``, docs/design.md "Notification outbox"); a
# site's notification is held to them before it leaves the site. Its target (a recipient
# list's or webhook's name) and last error use the widths above.
SUBJECT_WIDTH: Final = 256
NOTIFICATION_SOURCE_WIDTH: Final = 128
"""``site:<id>`` or ``rule:<name>``."""
NOTIFICATION_BODY_WIDTH: Final = 65_536
"""Characters of a notification's body (an e-mail's text, a webhook's ``body``)."""
SOURCE_EVENT_ID_WIDTH: Final = 200
"""The id of the event a rule made the notification from (unique per rule)."""
