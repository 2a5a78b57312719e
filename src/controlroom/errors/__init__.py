"""The error instance: failed messages from the error queue, stored one row per message."""
