"""Every kind of event log item Controlroom writes (docs/design.md "Event log"), in one
list: the writers name theirs from it (``events.record_event`` refuses any other), and
the settings check each notification rule's ``event_types`` against it, so a misspelt
kind is refused at start rather than accepted and never matched (docs/design.md
"Notification rules"). No imports of Controlroom's own: ``config`` reads it too.
"""

from __future__ import annotations

import enum


class EventType(enum.StrEnum):
    """An event log item's ``event_type``, as stored and served (ServiceControl's name
    where it has one)."""

    # Failed messages and their groups
    FAILED_MESSAGES_ARCHIVED = "FailedMessagesArchived"
    FAILED_MESSAGES_UNARCHIVED = "FailedMessagesUnArchived"
    FAILED_MESSAGE_GROUP_ARCHIVED = "FailedMessageGroupArchived"
    FAILED_MESSAGE_GROUP_UNARCHIVED = "FailedMessageGroupUnarchived"
    GROUP_COMMENT_CHANGED = "GroupCommentChanged"
    GROUP_COMMENT_DELETED = "GroupCommentDeleted"
    FAILURE_GROUP_APPEARED = "FailureGroupAppeared"
    GROUP_FAILURES_PASSED_THRESHOLD = "GroupFailuresPassedThreshold"
    ENDPOINT_FAILURES_PASSED_THRESHOLD = "EndpointFailuresPassedThreshold"
    # Retries
    RETRY_OPERATION_REQUESTED = "RetryOperationRequested"
    RETRY_OPERATION_COMPLETED = "RetryOperationCompleted"
    RETRY_BATCH_GIVEN_UP = "RetryBatchGivenUp"
    RETRY_MESSAGES_UNSENDABLE = "RetryMessagesUnsendable"
    # Failed imports, retention, endpoints
    MESSAGE_FAILED_TO_IMPORT = "MessageFailedToImport"
    FAILED_IMPORTS_REIMPORTED = "FailedImportsReimported"
    RETENTION_SWEEP_COMPLETED = "RetentionSweepCompleted"
    MONITORING_ENABLED_FOR_ENDPOINT = "MonitoringEnabledForEndpoint"
    MONITORING_DISABLED_FOR_ENDPOINT = "MonitoringDisabledForEndpoint"
    # Intakes
    INTAKE_STALLED = "IntakeStalled"
    INTAKE_RECOVERED = "IntakeRecovered"
    # Sites and site calls
    SITE_REACHABLE = "SiteReachable"
    SITE_UNREACHABLE = "SiteUnreachable"
    SITE_PINNED = "SitePinned"
    SITE_UNPINNED = "SiteUnpinned"
    SITE_CALL_RETRY_RELAYED = "SiteCallRetryRelayed"
    SITE_CALL_DISCARD_RELAYED = "SiteCallDiscardRelayed"
    PARKED_SITE_CALLS_PASSED_THRESHOLD = "ParkedSiteCallsPassedThreshold"
    STUCK_SITE_CALLS_PASSED_THRESHOLD = "StuckSiteCallsPassedThreshold"
    REJECTED_TELEMETRY_RESUBMITTED = "RejectedTelemetryResubmitted"
    # Notifications
    NOTIFICATION_RETRIED = "NotificationRetried"
    NOTIFICATION_DISCARDED = "NotificationDiscarded"
