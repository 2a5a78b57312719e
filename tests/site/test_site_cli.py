"""``controlroom site serve``: bad settings exit 2 naming the setting, a busy store exits 1
(and whether a store is busy is asked without opening it)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from controlroom.cli import app
from controlroom.site import SiteAgent, SiteSettings

runner = CliRunner()


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("SITE_ID", "TOKEN", "HOST", "STORE_PATH", "CONFIG"):
        monkeypatch.delenv(f"CONTROLROOM_SITE_{name}", raising=False)


def test_a_site_id_is_required() -> None:
    result = runner.invoke(app, ["site", "serve"])
    assert result.exit_code == 2
    assert "site_id" in result.output


def test_a_misspelt_setting_is_refused_or_named_with_the_one_meant(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """In the settings file a name that is no setting is refused; a variable that is no
    setting is ignored with a warning; each names the setting meant."""
    config = tmp_path / "site.toml"
    config.write_text('site_id = "plant-7"\ncentral_urll = "http://127.0.0.1:8080"\n')
    monkeypatch.setenv("CONTROLROOM_SITE_STORE_PAHT", "x")
    result = runner.invoke(app, ["site", "serve", "--config", str(config)])
    assert result.exit_code == 2
    output = " ".join(result.output.split())
    assert "no such setting; did you mean central_url?" in output
    assert (
        "warning: CONTROLROOM_SITE_STORE_PAHT names no setting and is ignored; did you mean "
        "CONTROLROOM_SITE_STORE_PATH?"
    ) in output


@pytest.mark.parametrize("url", ["localhost:18100", "ftp://central.example", "http://"])
def test_a_central_url_that_is_no_http_url_is_refused(url: str) -> None:
    """Fresh-user pass: ``localhost:18100`` (no scheme) started the agent, which then
    failed to deliver telemetry ("unsupported protocol 'localhost://'") for ever."""
    with pytest.raises(ValidationError) as refused:
        SiteSettings(site_id="plant-7", central_url=url)
    [error] = refused.value.errors()
    assert error["loc"] == ("central_url",)
    assert "an http:// or https:// URL" in error["msg"]


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://agent:a-password@127.0.0.1:8080", "no user or password"),
        ("http://127.0.0.1:8080/api", "central's root"),
        ("https://central.example/controlroom/api/", "central's root"),
        # Fresh-user pass (second): posted to ``/?x=1/api/...``, 405 for ever.
        ("http://127.0.0.1:18120?x=1", "no query"),
        ("http://127.0.0.1:0", "a port from 1 to 65535"),
        # Breaker pass: every post went to ``/%00/api/...``, 404 for ever.
        ("http://127.0.0.1:8080/%00", "no escaped control character"),
        ("http://127.0.0.1:8080/a%0Ab", "no escaped control character"),
    ],
)
def test_a_central_url_the_agent_cannot_post_to_as_written_is_refused(url: str, why: str) -> None:
    """Fresh-user pass: ``http://127.0.0.1:18150/api`` started the agent, which then posted
    to ``/api/api/...`` and got 404 for ever; a password in the URL was printed in the
    start-up line (the credentials are ``central_token``)."""
    with pytest.raises(ValidationError) as refused:
        SiteSettings(site_id="plant-7", central_url=url)
    [error] = refused.value.errors()
    assert error["loc"] == ("central_url",)
    assert why in error["msg"]
    assert "a-password" not in str(refused.value)


def test_a_central_url_under_a_path_prefix_is_taken() -> None:
    """Central behind a reverse proxy at a path of its own is a central URL as any."""
    settings = SiteSettings(site_id="plant-7", central_url="https://gw.example/controlroom")
    assert settings.central_url == "https://gw.example/controlroom"


def test_the_agent_token_and_the_central_token_must_differ() -> None:
    """Central refuses a site whose two secrets are one; the agent took them (fresh-user
    pass), so a site configured as the agent allows was refused by central."""
    secret = "s" * 32
    with pytest.raises(ValidationError, match="token and central_token must differ"):
        SiteSettings(site_id="plant-7", token=secret, central_token=secret)


def test_a_non_loopback_agent_needs_a_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONTROLROOM_SITE_SITE_ID", "plant-7")
    result = runner.invoke(app, ["site", "serve", "--host", "0.0.0.0"])
    assert result.exit_code == 2
    assert "without a token" in result.output


def test_a_store_another_agent_holds_exits_1(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    store = tmp_path / "tracking.db"
    holder = SiteAgent(SiteSettings(site_id="plant-7", store_path=store))
    try:
        monkeypatch.setenv("CONTROLROOM_SITE_SITE_ID", "plant-7")
        monkeypatch.setenv("CONTROLROOM_SITE_STORE_PATH", str(store))
        result = runner.invoke(app, ["site", "serve", "--port", "0"])
        assert result.exit_code == 1
        assert "in use by another site agent" in result.output
    finally:
        holder.close()


def test_whether_a_store_is_in_use_is_asked_without_creating_it(tmp_path: Path) -> None:
    """What ``make demo`` asks of its site agents' stores before it publishes anything."""
    from controlroom.site.store import in_use

    store = tmp_path / "sites" / "north" / "tracking.db"
    assert not in_use(store)
    assert not (tmp_path / "sites").exists()
    holder = SiteAgent(SiteSettings(site_id="north", store_path=store))
    try:
        assert in_use(store)
    finally:
        holder.close()
    assert not in_use(store)


@pytest.mark.parametrize(
    "store_path",
    # Fresh-user pass (fourth): a directory not made yet, written with its slash, became
    # the store's file; a file on the way ended in a 47-line traceback.
    # Breaker pass (fifth): /dev/null was taken.
    [
        "",
        "  ",
        "{tmp}",
        "{tmp}/not-yet/",
        "{tmp}/a-file/tracking.db",
        "{tmp}/a-file/x/t.db",
        "~",
        "/dev/null",
    ],
)
def test_a_store_path_that_names_no_file_is_refused(tmp_path: Path, store_path: str) -> None:
    """Fresh-user pass (third): an empty ``CONTROLROOM_SITE_STORE_PATH`` printed a 58-line
    traceback; a directory failed as "the database: unable to open database file"."""
    (tmp_path / "a-file").write_text("")
    with pytest.raises(ValidationError) as refused:
        SiteSettings(site_id="plant-7", store_path=store_path.format(tmp=tmp_path))
    [error] = refused.value.errors()
    assert error["loc"] == ("store_path",)
    assert "a file" in error["msg"]


def test_a_store_path_under_an_unknown_users_home_is_refused() -> None:
    """Fresh-user pass (fifth): ``~nouser/x.db`` ended in a traceback (``RuntimeError``)."""
    with pytest.raises(ValidationError) as refused:
        SiteSettings(site_id="plant-7", store_path="~no-such-user-here/x.db")
    [error] = refused.value.errors()
    assert error["loc"] == ("store_path",)
    assert "home" in error["msg"]


def test_a_store_path_under_home_is_under_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fresh-user pass (fourth): ``~/x/t.db`` made a directory named ``~`` where the
    agent ran."""
    monkeypatch.setenv("HOME", str(tmp_path))
    settings = SiteSettings(site_id="plant-7", store_path="~/x/t.db")
    assert settings.store_path == tmp_path / "x" / "t.db"


def test_a_store_no_file_can_be_made_for_is_refused_in_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Fresh-user pass (fourth): ``/proc/x.db`` ended in a traceback (``FileNotFoundError``
    of its lock file)."""
    monkeypatch.setenv("CONTROLROOM_SITE_SITE_ID", "plant-7")
    monkeypatch.setenv("CONTROLROOM_SITE_STORE_PATH", "/proc/controlroom-test/x.db")
    result = runner.invoke(app, ["site", "serve", "--port", "0"])
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    assert "the tracking store /proc/controlroom-test/x.db cannot be made" in " ".join(
        result.output.split()
    ), result.output


def test_the_agents_start_line_writes_an_ipv6_address_as_a_url_does(tmp_path: Path) -> None:
    """Fresh-user pass (third): ``--host ::1`` printed ``http://::1:8090/...``."""
    import os
    import subprocess
    import sys

    command = ["site", "serve", "--host", "::1", "--port", "0"]
    process = subprocess.Popen(
        [str(Path(sys.executable).parent / "controlroom"), *command],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={
            **os.environ,
            "CONTROLROOM_SITE_SITE_ID": "plant-7",
            "CONTROLROOM_SITE_STORE_PATH": str(tmp_path / "tracking.db"),
            "COLUMNS": "200",
        },
    )
    try:
        assert process.stdout is not None
        first = process.stdout.readline().decode()
    finally:
        # SIGTERM, not SIGINT: a test run's workers may leave SIGINT ignored in children,
        # and this one may come before the agent routes the signals itself.
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    assert "serving http://[::1]:" in first, first
