"""The command's manners: a bad port from the environment or a taken one is one line
naming ``--port``/``CONTROLROOM_PORT``; ``--help`` shows flags without a value; ``serve
--help`` names the environment variables; a second ``make demo`` refuses before it
publishes into a running one's data; the demo's site agents follow ``CONTROLROOM_PORT``
(docs/decisions.md "Configuration errors fit on one line")."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import signal
from pathlib import Path

import pytest
from typer.testing import CliRunner

from controlroom import server
from controlroom.cli import app
from controlroom.config import Settings, load_settings
from controlroom.runtime.sockets import listen
from controlroom.site.demo import demo_ports, demo_sites

runner = CliRunner()
MAKEFILE = Path(__file__).parents[1] / "Makefile"
COMMANDS = [
    ["serve"],
    ["migrate"],
    ["demo"],
    ["demo", "endpoints"],
    ["import-failed"],
    ["sweep"],
    ["audit", "verify"],
    ["site", "serve"],
    ["site", "demo"],
]


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in ("CONTROLROOM_CONFIG", "CONTROLROOM_DATABASE_URL", "CONTROLROOM_BROKER_URL"):
        monkeypatch.delenv(name, raising=False)
    for name in ("CONTROLROOM_HOST", "CONTROLROOM_PORT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CONTROLROOM_DATA_DIR", str(tmp_path / "data"))
    return tmp_path / "data"


def lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.strip()]


def test_a_port_out_of_range_in_the_environment_is_one_line_naming_it(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CONTROLROOM_PORT", "80808")
    for command in (["serve"], ["demo"], ["migrate"]):
        result = runner.invoke(app, command)
        assert result.exit_code == 2, result.output
        assert "Traceback" not in result.output
        assert len(lines(result.output)) == 1, result.output
        assert "CONTROLROOM_PORT" in result.output
        assert "65535" in result.output


def test_a_taken_port_names_the_option_and_the_variable(data_dir: Path) -> None:
    with listen("127.0.0.1", 0) as taken:
        port = taken.getsockname()[1]
        result = runner.invoke(app, ["serve", "--port", str(port)])
    assert result.exit_code == 1, result.output
    assert len(lines(result.output)) == 1, result.output
    assert "--port" in result.output and "CONTROLROOM_PORT" in result.output


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_help_shows_flags_without_a_value(command: list[str]) -> None:
    result = runner.invoke(app, [*command, "--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert "<bool>" not in result.output


def test_serve_help_names_the_environment_variables() -> None:
    result = runner.invoke(app, ["serve", "--help"], terminal_width=200)
    for name in (
        "CONTROLROOM_HOST",
        "CONTROLROOM_PORT",
        "CONTROLROOM_DATA_DIR",
        "CONTROLROOM_DATABASE_URL",
        "CONTROLROOM_BROKER_URL",
        "CONTROLROOM_CONFIG",
    ):
        assert name in result.output, name


def test_help_names_every_demo() -> None:
    """``controlroom --help`` and ``demo --help`` name each demo a user can run, ``run``
    (what ``make demo`` runs) first."""
    top = runner.invoke(app, ["--help"], terminal_width=200)
    assert top.exit_code == 0, top.output
    for demo in ("run", "endpoints", "celery", "notifications"):
        assert f"({demo})" in top.output, demo
    listed = runner.invoke(app, ["demo", "--help"], terminal_width=200)
    assert listed.exit_code == 0, listed.output
    for demo in ("run", "endpoints", "celery", "notifications"):
        assert re.search(rf"^\W*{demo}\s", listed.output, re.MULTILINE), demo


def test_the_demo_refuses_to_publish_into_a_running_serves_data(data_dir: Path) -> None:
    settings = Settings(data_dir=data_dir, ingest_on_serve=False)
    seen: list[server.Serving] = []

    async def main() -> tuple[int, str]:
        stop = asyncio.Event()
        with listen("127.0.0.1", 0) as listener:
            running = asyncio.create_task(
                server.run(settings, listener=listener, stop=stop, on_serving=seen.append)
            )
            try:
                async with asyncio.timeout(60):
                    while not seen:
                        await asyncio.sleep(0.01)
                result = await asyncio.to_thread(
                    runner.invoke, app, ["demo", "--no-next-steps", "--refuse-if-serving"]
                )
                depth = await queue_depth(settings)
            finally:
                stop.set()
                await running
        assert depth == 0  # nothing published into the running one's queue
        return result.exit_code, result.output

    code, output = asyncio.run(main())
    assert code == 1, output
    assert "Published" not in output
    assert "serve is running" in output and "CONTROLROOM_DATA_DIR" in output
    # Once it has stopped, the demo publishes.
    after = runner.invoke(app, ["demo", "--no-next-steps", "--refuse-if-serving"])
    assert after.exit_code == 0, after.output and "Published" in after.output


async def queue_depth(settings: Settings) -> int:
    from controlroom.client import open_transport

    async with open_transport(settings) as transport:
        return (await transport.queue_depth(settings.error_queue)).messages


def test_make_demo_runs_demo_run_and_names_no_fixed_port() -> None:
    demo = MAKEFILE.read_text().partition("\ndemo:")[2].partition("\n\n")[0]
    assert "controlroom demo run" in demo
    assert "8091" not in MAKEFILE.read_text() and "8092" not in MAKEFILE.read_text()


def test_the_demo_sites_follow_the_central_port() -> None:
    assert demo_ports(8080) == (8091, 8092, 8093)
    assert demo_ports(8081) == (8092, 8093, 8094)
    north, south, targets = demo_ports(65530)  # past the last port: below it instead
    assert all(0 < port <= 65535 for port in (north, south, targets))
    assert len({north, south, targets, 65530}) == 4
    urls = [site["base_url"] for site in demo_sites(central_port=8081)]
    assert urls == ["http://127.0.0.1:8092", "http://127.0.0.1:8093"]
    printed = runner.invoke(
        app, ["site", "demo", "--print-sites", "--central-url", "http://127.0.0.1:8081"]
    )
    assert printed.exit_code == 0, printed.output
    assert json.loads(printed.output) == demo_sites(central_port=8081)
    assert re.fullmatch(r"\[.*\]\n", printed.output)


def test_the_readme_says_how_to_make_a_rabbitmq_vhost_and_grant_it() -> None:
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    assert "rabbitmqctl add_vhost controlroom" in readme
    assert "rabbitmqctl set_permissions -p controlroom controlroom" in readme


def test_the_readme_says_a_webhooks_secret_is_required() -> None:
    """Where the README describes a webhook's settings (the settings table and the TOML
    example), its ``secret`` is said to be required: serve refuses a webhook without one."""
    readme = (Path(__file__).parents[1] / "README.md").read_text().splitlines()
    row = next(
        line for line in readme if line.startswith("| `CONTROLROOM_NOTIFICATIONS__WEBHOOKS`")
    )
    assert '"secret"' in row and "required" in row, row
    example = next(line for line in readme if line.startswith('secret = "whsec_'))
    assert "required" in example, example


@pytest.mark.parametrize(
    "data", ["controlroom-data", "controlroom-data-*", "controlroom-celery", "controlroom-site"]
)
def test_the_demos_data_is_ignored_by_git_and_removed_by_make_clean(data: str) -> None:
    """The data directories the README's demos use (``make demo``, a second one beside it;
    the Celery demo's) and a site agent's default store."""
    root = Path(__file__).parents[1]
    assert f"{data}/" in (root / ".gitignore").read_text().splitlines()
    clean = MAKEFILE.read_text().partition("\nclean:")[2].partition("\n\n")[0]
    assert data in clean.split()


def test_the_readmes_notification_settings_load_as_they_are(tmp_path: Path) -> None:
    """Fresh-user pass: the README's notification example, copied whole into a file, was
    refused (its rule named a site the example did not configure)."""
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    block = next(
        block.partition("\n")[2]
        for block in readme.split("```")[1::2]
        if block.startswith("toml") and "[[notifications.rules]]" in block
    )
    config = tmp_path / "notifications.toml"
    config.write_text(block)

    settings = load_settings(config)

    assert [rule.name for rule in settings.notifications.rules]


def test_signals_that_arrive_together_are_one_stop_said_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Fresh-user pass (sixth): ``timeout 12 controlroom serve`` (SIGTERM to serve and to
    its process group, both queued before the first was handled) printed "Stopping" twice."""
    from controlroom.cli import _first_signal_stops

    caplog.set_level(logging.INFO, logger="controlroom.cli")
    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    stop = asyncio.Event()
    on_signal = _first_signal_stops(stop, [], 30.0)

    async def twice() -> None:
        on_signal()
        on_signal()

    try:
        asyncio.run(twice())
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
    assert stop.is_set()
    # A log line, stamped as serve's others (fresh user, session 32: a bare line between them).
    stopping = [r for r in caplog.records if r.getMessage().startswith("Stopping:")]
    assert [r.name for r in stopping] == ["controlroom.cli"]
