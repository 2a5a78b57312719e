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
from controlroom.settings_sources import how_to_give

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


@pytest.mark.parametrize(
    ("values", "read"),
    [
        ({"sitecalls": {"retention_days": "P365D"}}, lambda s: s.sitecalls.retention_days == 365),
        (
            {"notifications": {"retention_days": "P1Y"}},
            lambda s: s.notifications.retention_days == 365,
        ),
        ({"kpi": {"history_days": "P2W"}}, lambda s: s.kpi.history_days == 14),
    ],
)
def test_a_setting_in_days_takes_iso_8601_of_whole_days(
    values: dict[str, Any], read: Callable[[Settings], bool]
) -> None:
    """Fresh-user pass (sixth): ``P365D`` for a retention in days was "Input should be a
    valid integer", though the README says a duration is ISO 8601."""
    assert read(Settings(**values))


@pytest.mark.parametrize("value", ["5d", "PT12H", "P1DT1H"])
def test_a_setting_in_days_that_is_no_whole_number_of_days_is_refused_saying_so(
    value: str,
) -> None:
    with pytest.raises(ValidationError) as refused:
        Settings(sitecalls={"retention_days": value})
    [error] = refused.value.errors()
    assert error["loc"] == ("sitecalls", "retention_days")
    assert error["type"] == "days_parsing"
    assert how_to_give(error["loc"], error["type"], "CONTROLROOM_") == (
        "a number of days (365) or ISO 8601 in whole days (P365D, P1Y, P2W)"
    )


def test_the_agents_settings_in_seconds_and_days_take_iso_8601_and_name_the_forms() -> None:
    """Fresh-user pass (sixth): ``CONTROLROOM_SITE_BACKOFF_CAP=5m`` said only "Input
    should be a valid number"."""
    from controlroom.site import SiteSettings

    settings = SiteSettings(
        site_id="plant-7", backoff_cap="PT5M", notification_retention_days="P7D"
    )
    assert (settings.backoff_cap, settings.notification_retention_days) == (300.0, 7.0)
    with pytest.raises(ValidationError) as refused:
        SiteSettings(site_id="plant-7", backoff_cap="5m")
    [error] = refused.value.errors()
    assert error["type"] == "time_delta_parsing"


def test_iso_8601_in_lower_case_is_read_as_in_upper_case() -> None:
    """Breaker pass (fifth): ``pt1h`` passed the form check and was then refused with
    "invalid digit in duration"."""
    settings = Settings(error_retention_period="p1d", ingestion={"stop_grace_seconds": "pt1m"})
    assert settings.error_retention_period == timedelta(days=1)
    assert settings.ingestion.stop_grace_seconds == 60.0


@pytest.mark.parametrize("value", ["\u0661\u0662", "1_000"])
def test_seconds_are_ascii_digits_in_every_duration_setting(value: str) -> None:
    """Breaker pass (fifth): Arabic-Indic digits were 12 s in a timedelta setting and
    refused in a setting in seconds; ``1_000`` the other way round."""
    for given in ({"kpi": {"interval": value}}, {"ingestion": {"stop_grace_seconds": value}}):
        with pytest.raises(ValidationError):
            Settings(**given)
