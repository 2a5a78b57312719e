"""A duration setting given as a number of seconds in text (an environment variable, a
JSON string, a TOML string) is that many seconds (README "Configuration": a duration is
ISO 8601 or a number of seconds). Pydantic reads only ISO 8601 and its own forms from
text: "3600" was refused with a hint that named "3600" as the form to use."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from pydantic import ValidationError

from controlroom.config import Settings

WEBHOOK = {
    "name": "ops-chat",
    "url": "https://hooks.example.org/controlroom",
    "secret": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
}
RULE = {
    "name": "intake",
    "event_types": ["IntakeStalled"],
    "channel": "Webhook",
    "target": "ops-chat",
}


@pytest.mark.parametrize(
    ("variable", "value", "read", "expected"),
    [
        (
            "CONTROLROOM_ERROR_RETENTION_PERIOD",
            "3600",
            lambda s: s.error_retention_period,
            timedelta(hours=1),
        ),
        ("CONTROLROOM_KPI__INTERVAL", " 60 ", lambda s: s.kpi.interval, timedelta(minutes=1)),
        (
            "CONTROLROOM_RECONCILIATION__FIRST_PASS_DELAY",
            "0",
            lambda s: s.reconciliation.first_pass_delay,
            timedelta(0),
        ),
        (
            "CONTROLROOM_NOTIFICATIONS__BACKOFF_BASE",
            "1.5",
            lambda s: s.notifications.backoff_base,
            timedelta(seconds=1.5),
        ),
        ("CONTROLROOM_KPI__INTERVAL", "PT2M", lambda s: s.kpi.interval, timedelta(minutes=2)),
    ],
)
def test_a_number_of_seconds_in_text_is_a_duration(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, read, expected: timedelta
) -> None:
    monkeypatch.setenv(variable, value)

    assert read(Settings()) == expected


def test_a_rules_window_in_seconds_as_a_json_string(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONTROLROOM_NOTIFICATIONS__WEBHOOKS", json.dumps([WEBHOOK]))
    monkeypatch.setenv("CONTROLROOM_NOTIFICATIONS__RULES", json.dumps([RULE | {"window": "300"}]))

    assert Settings().notifications.rules[0].window == timedelta(minutes=5)


@pytest.mark.parametrize("value", ["-5", "nan", "inf", "1e400", "3600s", "0x10"])
def test_text_that_is_no_positive_number_of_seconds_is_still_refused(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("CONTROLROOM_ERROR_RETENTION_PERIOD", value)

    with pytest.raises(ValidationError) as refused:
        Settings()
    assert "error_retention_period" in str(refused.value)


@pytest.mark.parametrize(
    ("values", "read"),
    [
        ({"audit": {"request_budget": "PT1H"}}, lambda s: s.audit.request_budget == 3600.0),
        ({"audit": {"ingest_budget": "PT30S"}}, lambda s: s.audit.ingest_budget == 30.0),
        (
            {"ingestion": {"max_backoff_seconds": "PT1M30S"}},
            lambda s: s.ingestion.max_backoff_seconds == 90.0,
        ),
        ({"audit": {"request_budget": "45"}}, lambda s: s.audit.request_budget == 45.0),
    ],
)
def test_a_setting_in_seconds_takes_an_iso_8601_duration_too(
    values: dict[str, Any], read: Callable[[Settings], bool]
) -> None:
    """Fresh-user pass (fourth): README says a duration is ISO 8601 or a number of
    seconds, and ``CONTROLROOM_AUDIT__REQUEST_BUDGET=PT1H`` was "Input should be a valid
    number"."""
    assert read(Settings(**values))


@pytest.mark.parametrize("text", ["PT1H1H", "P1Y2Y", "P", "PT", "P1H", "PT1D", "P1DT", "P1.5.5D"])
@pytest.mark.parametrize("setting", ["error_retention_period", "ingestion"])
def test_a_malformed_iso_8601_duration_is_refused(text: str, setting: str) -> None:
    """Breaker pass (third): ``PT1H1H`` was read as two hours and ``P1Y2Y`` as three
    years (the parser added repeated parts up)."""
    values: dict[str, Any] = (
        {"error_retention_period": text}
        if setting == "error_retention_period"
        else {"ingestion": {"max_backoff_seconds": text}}
    )
    with pytest.raises(ValidationError) as refused:
        Settings(**values)
    assert "ISO 8601" in str(refused.value)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("P30D", 30 * 86_400),
        ("PT12H", 43_200),
        ("P1DT2H", 93_600),
        ("PT0.5S", 0.5),
        (" PT1H ", 3_600),  # breaker pass (fourth): taken in seconds, refused as a period
    ],
)
def test_a_well_formed_iso_8601_duration_is_read(text: str, seconds: float) -> None:
    settings = Settings(error_retention_period=text)
    assert settings.error_retention_period == timedelta(seconds=seconds)


@pytest.mark.parametrize(
    ("values", "read"),
    [
        (
            {"ingestion": {"stop_grace_seconds": "PT30S"}},
            lambda s: s.ingestion.stop_grace_seconds == 30.0,
        ),
        (
            {"ingestion": {"linger_seconds": "PT0.5S"}},
            lambda s: s.ingestion.linger_seconds == 0.5,
        ),
        (
            {"notifications": {"claim_seconds": "PT5M"}},
            lambda s: s.notifications.claim_seconds == 300.0,
        ),
    ],
)
def test_every_setting_in_seconds_takes_iso_8601(
    values: dict[str, Any], read: Callable[[Settings], bool]
) -> None:
    """Fresh-user pass (fifth): ``stop_grace_seconds`` and ``claim_seconds`` were
    "Input should be a valid number" for ``PT30S``."""
    assert read(Settings(**values))
