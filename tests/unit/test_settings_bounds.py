"""A retention or a KPI window is refused at start past a century (``config.CENTURY_DAYS``):
a stamp computed from a longer one leaves the calendar, and the sweep or KPI read that
computes it would fail at every run instead."""

from __future__ import annotations

import typing
from collections.abc import Iterator
from datetime import timedelta
from typing import Annotated, Any

import pytest
from pydantic import BaseModel, TypeAdapter, ValidationError

from controlroom.config import CENTURY_DAYS, Settings
from controlroom.site.config import SiteSettings

TOO_LONG = timedelta(days=CENTURY_DAYS + 1)


@pytest.mark.parametrize(
    ("values", "where"),
    [
        ({"error_retention_period": TOO_LONG}, "error_retention_period"),
        ({"error_retention_period": timedelta(0)}, "error_retention_period"),
        ({"event_log_retention_period": TOO_LONG}, "event_log_retention_period"),
        ({"sitecalls": {"retention_days": CENTURY_DAYS + 1}}, "sitecalls.retention_days"),
        ({"sitecalls": {"tombstone_days": CENTURY_DAYS + 1}}, "sitecalls.tombstone_days"),
        (
            {"sitecalls": {"rejected_retention_days": CENTURY_DAYS + 1}},
            "sitecalls.rejected_retention_days",
        ),
        ({"audit": {"retention_days": CENTURY_DAYS + 1}}, "audit.retention_days"),
        ({"kpi": {"history_days": CENTURY_DAYS + 1}}, "kpi.history_days"),
        ({"kpi": {"interval": TOO_LONG}}, "kpi.interval"),
        ({"kpi": {"stuck_threshold": TOO_LONG}}, "kpi.stuck_threshold"),
    ],
)
def test_a_retention_past_a_century_is_refused_naming_it(
    values: dict[str, Any], where: str
) -> None:
    with pytest.raises(ValidationError) as refused:
        Settings(**values)
    assert where in str(refused.value)


def test_a_century_itself_is_accepted() -> None:
    settings = Settings(error_retention_period=timedelta(days=CENTURY_DAYS))
    assert settings.error_retention_period == timedelta(days=CENTURY_DAYS)


@pytest.mark.parametrize(
    ("model", "values", "where"),
    [
        (Settings, {"ingestion": {"workers": True}}, ("ingestion", "workers")),
        (Settings, {"kpi": {"interval": False}}, ("kpi", "interval")),
        (Settings, {"notifications": {"max_attempts": True}}, ("notifications", "max_attempts")),
        (SiteSettings, {"site_id": "plant-7", "port": True}, ("port",)),
    ],
)
def test_true_or_false_is_no_number_in_any_table(
    model: type[Settings] | type[SiteSettings], values: dict[str, Any], where: tuple[str, ...]
) -> None:
    """Every table of central's and the site agent's settings refuses a boolean for a
    number; a boolean setting still takes one."""
    with pytest.raises(ValidationError) as refused:
        model(**values)
    [error] = refused.value.errors()
    assert (error["loc"], error["type"]) == (where, "number_not_boolean")
    smtp = Settings(notifications={"smtp": {"host": "mail", "starttls": True}}).notifications.smtp
    assert smtp is not None and smtp.starttls is True


def _durations(
    model: type[BaseModel], prefix: str = ""
) -> Iterator[tuple[str, type[BaseModel], str]]:
    """Every setting of ``model`` and its tables that is a duration: seconds (a float) or
    a ``timedelta``, as (dotted name, table, field)."""
    for name, field in model.model_fields.items():
        kinds = (field.annotation, *typing.get_args(field.annotation))
        for kind in kinds:
            for table in (kind, *typing.get_args(kind)):
                if isinstance(table, type) and issubclass(table, BaseModel):
                    yield from _durations(table, f"{prefix}{name}.")
        if float in kinds or timedelta in kinds:
            yield f"{prefix}{name}", model, name


DURATIONS = sorted({*_durations(Settings), *_durations(SiteSettings)})


@pytest.mark.parametrize(("setting", "table", "field"), DURATIONS, ids=[d[0] for d in DURATIONS])
def test_no_duration_may_pass_a_century(setting: str, table: type[BaseModel], field: str) -> None:
    """A duration past a century overflows the stamps and timers computed from it (a
    lease's expiry, a purge's cutoff, a sleep): refused at start, never failing at every
    run. Days are counted in days, the rest in seconds."""
    info = table.model_fields[field]
    days = field.endswith("_days")
    too_long: float | timedelta = CENTURY_DAYS + 1 if days else (CENTURY_DAYS + 1) * 86_400.0
    if timedelta in (info.annotation, *typing.get_args(info.annotation)):
        too_long = timedelta(days=CENTURY_DAYS + 1)
    with pytest.raises(ValidationError):
        TypeAdapter(Annotated[info.annotation, info]).validate_python(too_long)


@pytest.mark.parametrize("version", ["\uff16.\uff11\uff15.\uff10", "\u0666.\u0661\u0665.\u0660"])
def test_the_servicecontrol_version_is_ascii_digits(version: str) -> None:
    """Breaker pass: digits of other scripts matched ``\\d`` and every /api answer then
    failed (a header value is Latin-1), /api/health too."""
    with pytest.raises(ValidationError):
        Settings(servicecontrol_api_version=version)


def _integers(model: type[BaseModel], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Every integer setting of ``model`` and its tables, as (dotted name, field)."""
    for name, field in model.model_fields.items():
        kinds = (field.annotation, *typing.get_args(field.annotation))
        for kind in kinds:
            for table in (kind, *typing.get_args(kind)):
                if isinstance(table, type) and issubclass(table, BaseModel):
                    yield from _integers(table, f"{prefix}{name}.")
        if int in kinds and bool not in kinds:
            yield f"{prefix}{name}", field


INTEGERS = sorted({*_integers(Settings), *_integers(SiteSettings)}, key=lambda integer: integer[0])


@pytest.mark.parametrize(("setting", "field"), INTEGERS, ids=[i[0] for i in INTEGERS])
def test_every_integer_setting_has_an_upper_bound(setting: str, field: Any) -> None:
    """Breaker pass: an alert threshold of 10**19 passed to SQLite overflowed its integer
    and failed every batch; an exact-count limit of 2**63 - 1 failed every search. Each
    integer setting is at most 2**53 (a double holds it exactly; both stores' integers
    do)."""
    too_big = 2**53 + 1
    with pytest.raises(ValidationError):
        TypeAdapter(Annotated[field.annotation, field]).validate_python(too_big)


@pytest.mark.parametrize(
    "token", [" " * 16, "abcdefgh ijklmnopq ", "abcdefgh\nijklmnopq", "\u00e9" * 18]
)
def test_a_token_no_authorization_header_could_carry_is_refused(token: str) -> None:
    """Breaker pass: tokens of spaces, with a space or a line break inside, or outside
    ASCII were taken, and the exact token sent as ``Authorization: Bearer`` then got 401."""
    with pytest.raises(ValidationError) as refused:
        Settings(auth_tokens=[{"name": "rita", "token": token, "role": "reader"}])
    assert "visible ASCII" in str(refused.value)
    with pytest.raises(ValidationError):
        SiteSettings(site_id="plant-7", token=token)


@pytest.mark.parametrize(
    ("values", "where"),
    [
        ({"kpi": {"sample_seconds": 0.000001}}, "sample_seconds"),
        ({"ingestion": {"report_interval_seconds": 0.0001}}, "report_interval_seconds"),
        ({"notifications": {"dispatch_interval_seconds": 0.000001}}, "dispatch_interval"),
        ({"notifications": {"purge_interval_seconds": 0.000001}}, "purge_interval_seconds"),
        ({"sitecalls": {"purge_interval_seconds": 0.000001}}, "purge_interval_seconds"),
        ({"reconciliation": {"interval": "PT0.001S"}}, "reconciliation.interval"),
        ({"reconciliation": {"probe_interval": "PT0.001S"}}, "reconciliation.probe_interval"),
    ],
)
def test_a_loop_that_runs_without_work_has_a_shortest_period(
    values: dict[str, Any], where: str
) -> None:
    """Breaker pass: a KPI sample every microsecond wrote 26,625 rows in 10 s; dispatch
    and purge intervals of a microsecond kept an idle serve at 75 % of a core. Fresh-user
    pass (sixth): a probe interval of a millisecond pulled a site that was down in a loop
    (96 % of a core, a warning every 50 ms)."""
    with pytest.raises(ValidationError) as refused:
        Settings(**values)
    assert where in str(refused.value)


@pytest.mark.parametrize("budget", ["ingest_budget", "row_budget", "request_budget"])
def test_a_telemetry_budget_no_write_could_meet_is_refused(budget: str) -> None:
    """Breaker pass (second): ``1e-300`` was taken (the check was only "greater than 0"),
    and every telemetry batch was given back for ever."""
    with pytest.raises(ValidationError) as refused:
        Settings(audit={budget: 1e-300})
    [error] = refused.value.errors()
    assert error["loc"] == ("audit", budget)
    assert "0.1" in error["msg"]


def test_a_back_off_too_short_to_let_the_store_recover_is_refused() -> None:
    """Breaker pass (third): ``ingestion.max_backoff_seconds = 1e-300`` was taken, and a
    store that failed was asked again in a busy loop by every intake, the retry processor
    and the dispatcher."""
    with pytest.raises(ValidationError) as refused:
        Settings(ingestion={"max_backoff_seconds": 1e-300})
    [error] = refused.value.errors()
    assert error["loc"] == ("ingestion", "max_backoff_seconds")
    assert "0.01" in error["msg"]
