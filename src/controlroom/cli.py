"""The ``controlroom`` command: serve, migrate, demo (and ``demo endpoints``, ``demo celery``,
``demo notifications``), import-failed, sweep, audit verify, version, and ``site serve``
(the site agent).

Thin by design: each command loads the settings, opens what it needs, calls the module
that does the work and reports; ``serve`` runs ``controlroom.server``. Each command imports
what it needs when it runs, so ``controlroom --help`` and ``version`` load no API, store or
error instance. Exit codes: 0 done, 1 a dependency failed (database, broker, port), 2 bad
usage or settings.
"""

from __future__ import annotations

import codecs
import contextlib
import json
import logging
import os
import signal
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from typer.core import TyperOption

from controlroom import __version__
from controlroom.demo_sizes import DEFAULT_COUNT, DEFAULT_FAIL_RATIO, MIN_COUNT
from controlroom.exceptions import ConfigurationError, ControlroomError
from controlroom.sitecalls.demo import DEFAULT_CALLS, MIN_CALLS

if TYPE_CHECKING:
    import asyncio
    import socket

    import pydantic
    import pydantic_settings
    import sqlalchemy as sa
    from pydantic import BaseModel
    from rich.progress import Progress

    from controlroom.config import Settings
    from controlroom.demo import DemoMessage
    from controlroom.demo_endpoints import Handled
    from controlroom.demo_run import Helper
    from controlroom.errors.ingest.reimport import ReimportOutcome
    from controlroom.server import Serving
    from controlroom.settings_sources import ListenOverrides
    from controlroom.site import SiteService


def _flag_type(self: TyperOption, ctx: Any) -> str | None:
    """No value column for a flag (``--list``, ``--help``): typer's rich help shows a
    ``<bool>`` there, which reads as a value the flag does not take."""
    return None if self.is_flag else _value_type(self, ctx)


_value_type = TyperOption.display_type_rich
TyperOption.display_type_rich = _flag_type  # type: ignore[method-assign]

app = typer.Typer(
    name="controlroom",
    help="See what failed in a message-driven system, and act on it.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode="markdown",  # docstrings: lines joined, ``code`` shown as code
)
log = logging.getLogger(__name__)
console = Console(soft_wrap=True)
err_console = Console(stderr=True, soft_wrap=True)


def _settings_file(text: str) -> Path:
    """The ``--config`` path as given, refused unless it names a regular file: click's
    own check read an empty path as the current directory ("file '' is a directory"),
    and pydantic-settings skips what is not a regular file (a pipe such as ``<(...)``, a
    device) without a word."""
    if not text:
        raise typer.BadParameter("--config is empty: name a TOML file")
    path = Path(text)
    if not path.exists():
        raise typer.BadParameter(f"'{path}' does not exist")
    if path.is_dir():
        raise typer.BadParameter(f"'{path}' is a directory, not a TOML file")
    if not path.is_file():
        raise typer.BadParameter(
            f"'{path}' is not a regular file (a pipe or a device is not read): write the "
            "settings to a file"
        )
    return path


def _not_empty(param: typer.CallbackParam, path: Path | None) -> Path | None:
    """click takes an empty variable (``CONTROLROOM_CONFIG=``) for none: refused, as a
    settings file that is named but cannot be read is."""
    variable = param.envvar if isinstance(param.envvar, str) else None
    if path is None and variable is not None and os.environ.get(variable) == "":
        raise typer.BadParameter(f"{variable} is empty: unset it, or name a TOML file")
    return path


def _listen_host(host: str | None) -> str | None:
    """``--host`` checked as the settings check ``CONTROLROOM_HOST``
    (``settings_sources.check_listen_host``), so that a refusal names the option given."""
    if host is not None:
        from controlroom.settings_sources import check_listen_host

        try:
            check_listen_host(host)
        except ValueError as exc:
            raise typer.BadParameter(str(exc)) from None
    return host


HostOption = Annotated[
    str | None, typer.Option(help="Address to listen on.", callback=_listen_host)
]


ConfigOption = Annotated[
    Path | None,
    typer.Option(
        "--config",
        envvar="CONTROLROOM_CONFIG",  # read here too, so a missing file is refused alike
        help="TOML settings file.",
        parser=_settings_file,
        callback=_not_empty,
    ),
]


# --- commands -----------------------------------------------------------------------------
@app.command()
def serve(
    host: HostOption = None,
    port: Annotated[int | None, typer.Option(help="Port to listen on.", min=0, max=65535)] = None,
    config: ConfigOption = None,
) -> None:
    """Serve the API and ingest the error and site-call telemetry queues, in one process,
    until Ctrl+C/SIGTERM.

    Settings come from the environment, then the --config file: `CONTROLROOM_HOST` and
    `CONTROLROOM_PORT` (below --host and --port), `CONTROLROOM_DATA_DIR` (embedded
    database, queue and bodies), `CONTROLROOM_DATABASE_URL` (PostgreSQL),
    `CONTROLROOM_BROKER_URL` (RabbitMQ), `CONTROLROOM_ERROR_QUEUE`,
    `CONTROLROOM_AUTH_TOKENS`, `CONTROLROOM_SITES`, `CONTROLROOM_CONFIG`, and every other
    setting as `CONTROLROOM_<NAME>`, nested with `__` (README "Configuration")."""
    import asyncio

    settings = _load(config, host=host, port=port)
    _refuse_an_open_api(settings)
    _refuse_a_cgroup_workers_cannot_join(settings)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # alembic names each of its plugins as it sets them up, at INFO: nothing an operator
    # acts on, seven lines before every start. Its migration lines stay.
    logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)
    from controlroom.runtime.demo_logs import quiet_demo_logs

    quiet_demo_logs()  # only under controlroom demo run
    with _exit_on_failure():
        code = asyncio.run(_serve(settings))
    raise typer.Exit(code)


@app.command()
def migrate(config: ConfigOption = None) -> None:
    """Create or upgrade the database schema (idempotent), as the owner of
    `CONTROLROOM_MIGRATION_DATABASE_URL` when set: then `CONTROLROOM_DATABASE_URL`'s user is
    made the service role, which may only insert into and read the audit log."""
    from controlroom.db.engine import create_store_engine
    from controlroom.db.migrate import secure_audit_log, upgrade_database

    settings = _load(config)
    with _exit_on_failure():
        engine = create_store_engine(settings.effective_migration_database_url)
        try:
            before, after = upgrade_database(engine)
            _write_missing_search_terms(engine)
            role = secure_audit_log(
                engine,
                retention_days=settings.audit.retention_days,
                service_url=settings.effective_database_url
                if settings.migration_database_url
                else None,
            )
        finally:
            engine.dispose()
    database = _describe_database(settings.effective_migration_database_url)
    if before == after:
        console.print(f"Schema of {database} is up to date (revision {after}).")
    elif before is None:
        console.print(f"Schema of {database} created at revision {after}.")
    else:
        console.print(f"Schema of {database} upgraded from revision {before} to {after}.")
    if role is not None:
        console.print(
            f"The user of CONTROLROOM_DATABASE_URL is in role [bold]{escape(role)}[/]: it may "
            "only insert into and read the audit log."
        )


demo_app = typer.Typer(
    help="Run the whole demo: publish, then serve with site agents, endpoints and sinks, "
    "as make demo does (run); publish realistic failed messages and site-call telemetry "
    "only (no subcommand); play the endpoints that receive the retries (endpoints); run a "
    "Celery shop failing tasks (celery); run the notification outbox's webhook and SMTP "
    "sinks (notifications).",
    invoke_without_command=True,
)
app.add_typer(demo_app, name="demo")


@demo_app.callback()
def demo(
    ctx: typer.Context,
    count: Annotated[
        int, typer.Option(help="Messages to publish (one of each variety first).", min=MIN_COUNT)
    ] = DEFAULT_COUNT,
    seed: Annotated[
        int | None, typer.Option(help="Seed of the generator; random when not given.")
    ] = None,
    site_calls: Annotated[
        int,
        typer.Option(
            help="Cached calls whose telemetry to publish (one of each scenario first).",
            min=MIN_CALLS,
        ),
    ] = DEFAULT_CALLS,
    next_steps: Annotated[
        bool,
        typer.Option(help="End by naming the commands to run next (make demo runs them itself)."),
    ] = True,
    refuse_if_serving: Annotated[
        bool,
        typer.Option(
            "--refuse-if-serving",
            help="Publish nothing, exit 1, when a `controlroom serve` runs on this data "
            "directory (make demo: a demo already running).",
        ),
    ] = False,
    config: ConfigOption = None,
) -> None:
    """Publish realistic NServiceBus failed messages to the configured error queue, and
    site-call telemetry to the telemetry queue; `controlroom demo endpoints` then plays the
    endpoints that receive the retries."""
    import asyncio

    if ctx.invoked_subcommand is not None:
        _refuse_options_given(ctx)
        return
    import random
    from datetime import UTC, datetime

    from controlroom.demo import generate_demo_messages
    from controlroom.sitecalls.demo import generate_demo_telemetry

    settings = _load(config)
    if refuse_if_serving:
        _refuse_if_served(settings)
    seed = seed if seed is not None else random.SystemRandom().randrange(1_000_000)
    now = datetime.now(UTC)
    messages = generate_demo_messages(count, seed=seed, now=now)
    telemetry = generate_demo_telemetry(site_calls, seed=seed, now=now)
    with _exit_on_failure():
        asyncio.run(_publish_demo(settings, messages, telemetry))
    console.print(
        f"Published {len(messages)} failed messages (seed {seed}) to queue "
        f"[bold]{settings.error_queue}[/] on {_describe_transport(settings)}.\n"
        "Some are the same message failing again (one row, several attempts); one is "
        "deliberately broken (no NServiceBus.FailedQ) and becomes a failed import, which "
        "`controlroom import-failed` re-imports.\n"
        f"Published {len(telemetry)} telemetry packets of {site_calls} site calls (three "
        f"sites, two nodes each) to queue [bold]{settings.telemetry_queue}[/]."
    )
    from controlroom.runtime.serve_lock import is_served

    if next_steps and is_served(settings.data_dir):
        console.print(
            f"The controlroom serve running on {escape(str(settings.data_dir))} ingests them "
            "now; its console shows them as they arrive.",
            highlight=False,
        )
    elif next_steps:
        console.print(
            "Next: `controlroom serve` ingests them and serves the console on "
            f"http://{settings.host}:{settings.port}/ ; `controlroom demo endpoints` beside "
            "it plays the endpoints, so a retry from the console ends Resolved (or fails "
            "again); `controlroom site demo` runs two live site agents, which `serve` "
            "relays to when started with `CONTROLROOM_SITES` set to the JSON it prints; "
            "`controlroom demo notifications` runs a webhook and an SMTP sink, which "
            "`serve` sends notifications to when started with `CONTROLROOM_NOTIFICATIONS` "
            "set to the JSON its `--print-settings` prints. `make demo` runs all of them."
        )


def _refuse_if_served(settings: Settings) -> None:
    """Exit 1 when a ``serve`` runs on ``settings.data_dir`` (``runtime.serve_lock``)."""
    from controlroom.runtime.serve_lock import is_served

    if is_served(settings.data_dir):
        err_console.print(
            f"[red]error:[/] a controlroom serve is running on {escape(str(settings.data_dir))} "
            "(another make demo?); nothing published. Stop it first, or give this demo its "
            "own CONTROLROOM_DATA_DIR and CONTROLROOM_PORT.",
            highlight=False,
        )
        raise typer.Exit(1)


def _refuse_options_given(ctx: typer.Context) -> None:
    """Exit 2 when ``controlroom demo`` got options of its own (values other than their
    defaults, on its command line) before a subcommand: they would be ignored, not
    applied. A value from the environment (``CONTROLROOM_CONFIG``) was not given to it."""
    given = [
        f"--{param.name.replace('_', '-')}"
        for param in ctx.command.params
        if param.name
        and ctx.params.get(param.name) != param.default
        and _source(ctx, param.name) != "ENVIRONMENT"
    ]
    if given:
        raise typer.BadParameter(
            f"{', '.join(given)} is an option of `controlroom demo` alone, not of "
            f"`controlroom demo {ctx.invoked_subcommand}`"
        )


def _source(ctx: typer.Context, name: str) -> str | None:
    """Where ``name``'s value came from (``ParameterSource``'s name: ``COMMANDLINE``,
    ``ENVIRONMENT``, ``DEFAULT``...), by name: typer ships its own copy of click, whose
    enum is not public."""
    source = ctx.get_parameter_source(name)
    return None if source is None else source.name


@demo_app.command("endpoints")
def demo_endpoints(
    seed: Annotated[
        int | None, typer.Option(help="Seed of which retries fail again; random when not given.")
    ] = None,
    fail_ratio: Annotated[
        float, typer.Option(help="Share of retried messages that fail again.", min=0, max=1)
    ] = DEFAULT_FAIL_RATIO,
    config: ConfigOption = None,
) -> None:
    """Play the demo's endpoints (Sales, Billing, Shipping, Warehouse, Legacy.Fulfillment)
    until Ctrl+C/SIGTERM: take the messages Controlroom retries to their queues, confirm
    most and fail some again. It consumes those queues: use a demo broker only."""
    import asyncio
    import random

    from controlroom.demo import demo_endpoint_queues

    settings = _load(config)
    seed = seed if seed is not None else random.SystemRandom().randrange(1_000_000)
    console.print(
        f"Demo endpoints {', '.join(demo_endpoint_queues())} are consuming their queues on "
        f"{_describe_transport(settings)}: of the messages retried to them, about "
        f"{fail_ratio:.0%} fail again (seed {seed}), the rest are confirmed. "
        "Press Ctrl+C to stop."
    )
    with _exit_on_failure():
        asyncio.run(_run_demo_endpoints(settings, seed, fail_ratio))


@demo_app.command("run")
def demo_run(config: ConfigOption = None) -> None:
    """What `make demo` runs: publish the demo (as `controlroom demo`), then run `serve`, the
    site demo, the demo endpoints and the notification sinks side by side until Ctrl+C.
    Every port they take (CONTROLROOM_PORT and 11-15 past it) and the site agents' stores
    (under CONTROLROOM_DATA_DIR, as all the demo writes) are checked first; when any of
    them exits, the others are stopped."""
    import subprocess

    from controlroom.demo_run import (
        PORT_CHOSEN_BY,
        controlroom_argv,
        demo_listeners,
        first_store_in_use,
        first_taken_port,
        supervise,
    )

    settings = _load(config)
    _refuse_an_open_api(settings)  # its serve would, after the demo published
    _refuse_if_served(settings)
    held = first_store_in_use(settings.data_dir)
    if held is not None:
        err_console.print(
            f"[red]error:[/] the tracking store {escape(str(held))} of the demo's site "
            "agents is in use by another process (a controlroom site demo?); nothing "
            "published. Stop it first, or give this demo its own CONTROLROOM_DATA_DIR.",
            highlight=False,
        )
        raise typer.Exit(1)
    with _exit_on_failure():
        taken = first_taken_port(demo_listeners(settings.host, settings.port))
    if taken is not None:
        host, port, what = taken
        err_console.print(
            f"[red]error:[/] port {port} on {escape(host)} is in use by another process; "
            f"this demo would take it for {what} (it takes its port and 11-15 past it): "
            f"give it another with {PORT_CHOSEN_BY}.",
            highlight=False,
        )
        raise typer.Exit(1)
    env = {"CONTROLROOM_CONFIG": str(config)} if config is not None else {}
    published = subprocess.run(
        controlroom_argv("demo", "--no-next-steps", "--refuse-if-serving"),
        env={**os.environ, **env},
        check=False,
    )
    if published.returncode != 0:
        raise typer.Exit(published.returncode)
    helpers = demo_helpers(settings, env)
    raise typer.Exit(supervise(helpers, lambda line: err_console.print(line, highlight=False)))


def demo_helpers(settings: Settings, env: dict[str, str]) -> list[Helper]:
    """The processes `demo run` runs side by side, serve first (the site agents and the
    sinks find it up), with ``env`` added to serve's and the endpoints' environment (the
    demo's ``CONTROLROOM_CONFIG``). Serve is given its whole stop before it is killed:
    the batches' grace (``ingestion.stop_grace_seconds``) and the margin its workers get
    (``workers.STOP_MARGIN_SECONDS``), and as long again for its HTTP server and tasks."""
    from controlroom.demo_run import Helper, central_address, central_url, controlroom_argv
    from controlroom.runtime.demo_logs import QUIET_ENV
    from controlroom.workers import STOP_MARGIN_SECONDS

    central = central_url(settings.host, settings.port)
    serve_stop = settings.ingestion.stop_grace_seconds + 2 * STOP_MARGIN_SECONDS
    return [
        Helper(
            "controlroom serve",
            controlroom_argv("serve"),
            {**env, **demo_central_environment(settings.port), QUIET_ENV: "1"},
            listens_on=central_address(settings.host, settings.port),
            stop_seconds=serve_stop,
        ),
        Helper(  # its agents' stores under the demo's data directory, as all it writes
            "the site demo",
            controlroom_argv(
                "site", "demo", "--central-url", central, "--data-dir", str(settings.data_dir)
            ),
        ),
        Helper("the demo endpoints", controlroom_argv("demo", "endpoints"), env),
        Helper(
            "the notification sinks",
            controlroom_argv("demo", "notifications", "--central-url", central),
        ),
    ]


DEMO_FIRST_PASS_DELAY_SECONDS = 10
"""How long the demo's serve waits before its first reconciliation pass: the site agents
start after it and listen within a few seconds."""


def demo_central_environment(port: int) -> dict[str, str]:
    """What `demo run` gives its serve on ``port``: the sites the site demo runs, their
    secrets included (else central refuses the agents' telemetry and they its pulls), and
    the notification outbox of the demo's sinks, as ``CONTROLROOM_*`` variables."""
    import json

    from controlroom.demo_notifications import demo_notification_settings
    from controlroom.site.demo import demo_sites

    return {
        "CONTROLROOM_SITES": json.dumps(demo_sites(central_port=port), separators=(",", ":")),
        "CONTROLROOM_NOTIFICATIONS": json.dumps(
            demo_notification_settings(port), separators=(",", ":")
        ),
        # The site agents start after serve: a first pass at once would find them down.
        "CONTROLROOM_RECONCILIATION__FIRST_PASS_DELAY": f"PT{DEMO_FIRST_PASS_DELAY_SECONDS}S",
    }


@demo_app.command("celery")
def demo_celery(config: ConfigOption = None) -> None:
    """Run a small Celery shop whose tasks fail in a few realistic ways, with Controlroom's
    Celery integration installed, until Ctrl+C/SIGTERM: its failures reach the error
    queue, and the ones retried from the console run again on its worker (some succeed,
    some fail again). Needs RabbitMQ (CONTROLROOM_BROKER_URL) and Celery
    (pip install 'controlroom[celery]')."""
    settings = _load(config)
    if not settings.broker_url:
        console.print(
            "[red]controlroom demo celery needs RabbitMQ: set CONTROLROOM_BROKER_URL "
            "(e.g. amqp://guest:guest@127.0.0.1:5672/), as for serve[/red]"
        )
        raise typer.Exit(2)
    try:
        from controlroom import demo_celery
    except ImportError as exc:
        console.print(f"[red]controlroom demo celery needs Celery: {exc}[/red]")
        raise typer.Exit(2) from exc
    console.print(
        f"A Celery shop is failing tasks into {settings.error_queue!r} on "
        f"{_describe_transport(settings)}; its worker consumes {demo_celery.QUEUE!r} and "
        "runs what you retry. Press Ctrl+C to stop."
    )
    demo_celery.run(settings.broker_url, settings.error_queue)


_DEMO_CENTRAL_HELP = (
    "[default: where serve listens: CONTROLROOM_HOST (loopback for an any-address) and "
    "CONTROLROOM_PORT, else http://127.0.0.1:8080]"
)


def _demo_central(central_url: str | None) -> str:
    """``central_url``, else the URL of the central a by-hand demo serves: where serve
    listens, ``CONTROLROOM_HOST`` (loopback for an any-address) and ``CONTROLROOM_PORT``
    (README "A first look"), as ``make demo`` passes it. A given URL
    is checked as the agent's ``central_url`` is, and its port must be given (the demo's
    ports follow it); refused naming ``--central-url``."""
    if central_url is None:
        from controlroom.demo_run import central_url as served_at

        settings = _load(None)
        return served_at(settings.host, settings.port)
    from urllib.parse import urlsplit

    from controlroom.site.config import central_url_problem

    problem = central_url_problem(central_url)
    if problem is None and urlsplit(central_url).port is None:
        problem = "it must name central's port (the demo's ports follow it)"
    if problem is not None:
        raise typer.BadParameter(problem, param_hint="--central-url")
    return central_url


@demo_app.command("notifications")
def demo_notification_sinks(
    central_url: Annotated[
        str | None,
        typer.Option(
            help=f"Central's URL: the sinks' ports follow its port. {_DEMO_CENTRAL_HELP}",
            show_default=False,
        ),
    ] = None,
    print_settings: Annotated[
        bool,
        typer.Option(
            "--print-settings",
            help="Print only the JSON of CONTROLROOM_NOTIFICATIONS central needs for these "
            "sinks, and exit (make demo passes it to serve).",
        ),
    ] = False,
) -> None:
    """A webhook sink and an SMTP sink for the notification outbox's demo, printing what
    they receive, until Ctrl+C: the webhook `pager` is answered 500, so its notifications
    park for an operator's Retry or Discard. Their ports are 14 and 15 past the port of
    --central-url (8094 and 8095 for 8080)."""
    import asyncio
    import json

    from controlroom.demo_notifications import (
        demo_notification_settings,
        run_sinks,
        sink_ports,
    )
    from controlroom.site.demo import central_port_of

    central_port = central_port_of(_demo_central(central_url))
    outbox = json.dumps(demo_notification_settings(central_port), separators=(",", ":"))
    if print_settings:
        typer.echo(outbox)  # bare, for a shell to capture
        return
    hook, smtp = sink_ports(central_port)
    console.print(
        f"Notification sinks: webhooks on port {hook} (ops-chat accepted, pager answered "
        f"500), e-mail (SMTP) on port {smtp}. Press Ctrl+C to stop.",
        highlight=False,
    )
    with _exit_on_failure(), contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run_sinks(central_port, lambda line: console.print(line, highlight=False)))


@app.command("import-failed")
def import_failed(
    failed_import_id: Annotated[
        str | None, typer.Option("--id", help="Re-import only this failed import.")
    ] = None,
    list_only: Annotated[
        bool,
        typer.Option(
            "--list", help="List the failed imports (id, time, queue, reason); send nothing."
        ),
    ] = False,
    config: ConfigOption = None,
) -> None:
    """Put failed imports back on the error queue, to be ingested again (applies pending
    migrations first); with --list, show them instead."""
    import asyncio

    from controlroom.errors.ingest.reimport import list_failed_import_ids

    settings = _load(config)
    with _exit_on_failure(), _working_store(settings) as engine:
        if list_only:
            _print_failed_imports(engine)
            return
        _refuse_a_queue_no_serve_reads(settings, engine)
        ids = [failed_import_id] if failed_import_id else list_failed_import_ids(engine)
        outcomes = asyncio.run(_reimport(settings, engine, ids)) if ids else []
    _report_reimport(settings, failed_import_id, outcomes)


def _refuse_a_queue_no_serve_reads(settings: Settings, engine: sa.Engine) -> None:
    """Exit 1, nothing published, when what this command publishes would wait where no
    serve of this store looks: a serve of the store runs on this data directory consuming
    another broker, or, on the embedded queue, no serve of the store ever ran on this data
    directory (``runtime.serve_lock``)."""
    from controlroom.db.engine import store_identity
    from controlroom.runtime.serve_lock import has_served, serving_broker
    from controlroom.transport import create_transport

    store = store_identity(engine)
    running = serving_broker(settings.data_dir, store=store)
    ours = create_transport(settings).destination
    if running is not None and running != ours:
        err_console.print(
            f"[red]error:[/] a controlroom serve of this store consumes {escape(running)}; "
            f"this command would publish to {escape(ours)}, where it never looks. Give it "
            "the serve's CONTROLROOM_BROKER_URL; nothing was published.",
            highlight=False,
        )
        raise typer.Exit(1)
    if not settings.broker_url and not has_served(settings.data_dir, store=store):
        err_console.print(
            "[red]error:[/] no controlroom serve of this store "
            f"({escape(_describe_database(settings.effective_database_url))}) has run on the "
            f"data directory {escape(str(settings.data_dir.absolute()))}, whose embedded queue "
            "this command would publish to. Give it the serve's CONTROLROOM_DATA_DIR and "
            "CONTROLROOM_DATABASE_URL (a relative path is read from the working directory), "
            "or its CONTROLROOM_BROKER_URL; nothing was published.",
            highlight=False,
        )
        raise typer.Exit(1)


@app.command()
def sweep(config: ConfigOption = None) -> None:
    """Delete Resolved and Archived failed messages older than the retention period, now
    (``serve`` also does it every hour)."""
    from controlroom.errors.ingest.bodies import FileSystemBodyStore
    from controlroom.errors.retention import RetentionSweeper

    settings = _load(config)
    with _exit_on_failure(), _working_store(settings) as engine:
        sweeper = RetentionSweeper(
            engine,
            FileSystemBodyStore(settings.body_dir),
            retention_period=settings.error_retention_period,
            event_retention_period=settings.event_log_retention_period,
        )
        result = sweeper.sweep_once()
    if result is None:
        err_console.print(
            "[red]error:[/] another process holds the retention lease and is sweeping right "
            "now; nothing done (try again when it has finished)."
        )
        raise typer.Exit(1)
    console.print(
        f"Deleted {result.deleted} Resolved or Archived failed messages last changed before "
        f"{result.cutoff.isoformat()}."
    )
    if result.body_failures:
        err_console.print(
            f"[yellow]warning:[/] the bodies of {result.body_failures} deleted messages could "
            "not be deleted (see the log); the next sweep tries again."
        )


audit_app = typer.Typer(
    help="The append-only audit log of site calls and notifications.", no_args_is_help=True
)
app.add_typer(audit_app, name="audit")


@audit_app.command("verify")
def audit_verify(config: ConfigOption = None) -> None:
    """Walk the audit log's hash chains: exit 0 when intact, 1 naming the first event
    where a chain breaks. The result shows on the console's audit log page."""
    from controlroom.db.engine import create_store_engine
    from controlroom.sitecalls.audit_verify import (
        count_audit_events,
        describe_break,
        record_verification,
        verify_audit_log,
    )

    settings = _load(config)
    with _exit_on_failure():
        engine = create_store_engine(settings.effective_database_url)
        try:
            total = count_audit_events(engine)
            with _progress() as progress:
                task = progress.add_task("Verifying the audit log's hash chains", total=total)
                result = verify_audit_log(
                    engine, progress=lambda done: progress.update(task, completed=done)
                )
                progress.update(task, completed=result.events)
            record_verification(engine, result)
        finally:
            engine.dispose()
    if result.broken is not None:
        err_console.print(
            f"[red]broken:[/] {escape(describe_break(result.broken))}", highlight=False
        )
        raise typer.Exit(1)
    console.print(
        f"[green]intact:[/] {result.events} audit event{'' if result.events == 1 else 's'} "
        f"in {result.chains} monthly chain{'' if result.chains == 1 else 's'}."
    )


@app.command()
def version() -> None:
    """Print the version."""
    console.print(f"controlroom {__version__}")


# --- settings and errors ------------------------------------------------------------------
def _load(config: Path | None, host: str | None = None, port: int | None = None) -> Settings:
    """The settings, with command-line values (those given) over every other source."""
    from controlroom.config import Settings, load_settings

    return _settings_or_refuse(
        lambda: load_settings(config, **_listen_overrides(host, port)),
        Settings,
        "CONTROLROOM_",
        config,
        besides=("SITE_",),
    )


_Settings = TypeVar("_Settings", bound="BaseModel")


def _settings_or_refuse(
    load: Callable[[], _Settings],
    model: type[_Settings],
    prefix: str,
    config: Path | None,
    besides: tuple[str, ...] = (),
) -> _Settings:
    """``load()``'s settings of ``model`` (central's or the site agent's), after a warning
    per variable under ``prefix`` that names no setting; exit 2 with a one-line refusal
    for a nested variable that names no table, a setting, a file or a variable that does
    not parse, never a traceback."""
    import tomllib

    import pydantic
    import pydantic_settings

    from controlroom.settings_sources import unknown_variables

    warnings, refusals = unknown_variables(model, prefix, besides=besides)
    for line in warnings:
        err_console.print(f"[yellow]warning:[/] {escape(line)}", highlight=False)
    if refusals:
        for line in refusals:
            err_console.print(f"[red]error:[/] {escape(line)}", highlight=False)
        raise typer.Exit(2)
    try:
        return load()
    except pydantic.ValidationError as exc:
        _refuse_settings(exc, prefix, config, model)
    except tomllib.TOMLDecodeError as exc:
        bom = config is not None and config.read_bytes().startswith(codecs.BOM_UTF8)
        _refuse_toml(config, exc, _BOM_REFUSED if bom else None)
    except UnicodeDecodeError as exc:
        _refuse_toml(config, exc, "it is not UTF-8")
    except pydantic_settings.SettingsError as exc:
        _refuse_unparsed(exc, prefix)


def _refuse_settings(
    exc: pydantic.ValidationError, prefix: str, config: Path | None, model: type[BaseModel]
) -> NoReturn:
    """Exit 2 with one line per invalid setting of ``model``, naming where it was given
    (``settings_sources.given_in``), or per failed check across the settings; never the
    value, which may be a secret."""
    from controlroom.settings_sources import (
        given_in,
        how_to_give,
        misspelt_required,
        no_such_setting,
    )

    errors = exc.errors()
    meant = misspelt_required(model, errors)
    for error in errors:
        if error["type"] == "missing" and tuple(error["loc"]) in meant:
            continue
        where = given_in(error["loc"], prefix, config, given=error["type"] == "extra_forbidden")
        setting = ".".join(str(part) for part in error["loc"])
        what = "settings" if where is None else f"setting {setting} ({where})"
        how = how_to_give(error["loc"], error["type"], prefix)
        if error["type"] == "extra_forbidden":
            said = no_such_setting(model, error["loc"])
        elif error["type"] == "value_error":
            said = str(error["ctx"]["error"])
        elif error["type"] in ("time_delta_parsing", "time_delta_type"):
            said = "it is no duration"  # pydantic's reason ('"day" identifier ...') misleads
        else:
            said = error["msg"]
        reason = said + (f"; {how}" if how else "")  # our validators' own sentence, unprefixed
        err_console.print(
            f"[red]error:[/] invalid {escape(what)}: {escape(reason)}", highlight=False
        )
    raise typer.Exit(2) from exc


def _refuse_unparsed(exc: pydantic_settings.SettingsError, prefix: str) -> NoReturn:
    """Exit 2 naming the environment variable whose value must be JSON (a list or a table
    given whole) and does not parse, with where the parser stopped; never the value."""
    from controlroom.settings_sources import unparsed_variable

    cause = exc.__cause__
    variable = unparsed_variable(exc, prefix)
    if variable is None or not isinstance(cause, json.JSONDecodeError):
        reason = f": {cause}" if cause else ""
        err_console.print(f"[red]error:[/] invalid setting: {escape(str(exc) + reason)}")
        raise typer.Exit(2) from exc
    setting = variable[len(prefix) :].lower().replace("__", ".")
    forms = "(a list as [...], a table as {...}, strings in double quotes)"
    said = (
        f"it is empty: unset it, or give its JSON {forms}"
        if not cause.doc.strip()
        else f"its value is not JSON {forms}: {cause.msg} at line {cause.lineno} "
        f"column {cause.colno}"
    )
    err_console.print(
        f"[red]error:[/] invalid setting {escape(setting)} ({escape(variable)}): {escape(said)}",
        highlight=False,
    )
    raise typer.Exit(2) from exc


def _listen_overrides(host: str | None, port: int | None) -> ListenOverrides:
    """``host`` and ``port`` where the command line gave them (``None``: not given)."""
    given: ListenOverrides = {}
    if host is not None:
        given["host"] = host
    if port is not None:
        given["port"] = port
    return given


_BOM_REFUSED = (
    "it begins with a byte order mark (U+FEFF), which TOML does not allow: save it as "
    "UTF-8 without one"
)


def _refuse_toml(config: Path | None, exc: Exception, why: str | None = None) -> NoReturn:
    """Exit 2 naming the settings file that does not parse, with ``why`` or the parser's
    place."""
    err_console.print(
        f"[red]error:[/] {escape(str(config))} is not valid TOML: {escape(why or str(exc))}"
    )
    raise typer.Exit(2) from exc


@contextlib.contextmanager
def _exit_on_failure() -> Iterator[None]:
    """Report a failed dependency in one line and exit 1, instead of a traceback."""
    import sqlalchemy as sa

    from controlroom.db.errors import describe_store_error, store_error_advice

    try:
        yield
    except ControlroomError as exc:
        err_console.print(f"[red]error:[/] {escape(str(exc))}")
        raise typer.Exit(1) from exc
    except sa.exc.SQLAlchemyError as exc:  # the driver's line, not SQLAlchemy's wrapping
        advice = store_error_advice(exc)
        said = describe_store_error(exc) + (f" ({advice})" if advice else "")
        err_console.print(f"[red]error:[/] the database: {escape(said)}")
        raise typer.Exit(1) from exc


@contextlib.contextmanager
def _working_store(settings: Settings) -> Iterator[sa.Engine]:
    """The store of a command that works on it (pending migrations applied first), with
    the notification rules applied to every event it writes, as in serve
    (``notifications.rules.rules_applied``: docs/design.md "Notification rules");
    disposed at the end."""
    from controlroom.db.engine import create_store_engine
    from controlroom.db.migrate import require_writable, upgrade_database
    from controlroom.notifications.rules import rules_applied

    engine = create_store_engine(settings.effective_database_url)
    try:
        upgrade_database(engine)
        require_writable(engine)
        with rules_applied(engine, settings.notifications):
            yield engine
    finally:
        engine.dispose()


def _describe_database(url: str) -> str:
    from controlroom.db.engine import shown_url

    return shown_url(url)


def _describe_transport(settings: Settings) -> str:
    from controlroom.transport.rabbitmq import redact_url

    if settings.broker_url:
        return f"RabbitMQ {redact_url(settings.broker_url)}"
    return f"the embedded queue {settings.embedded_queue_path}"


def _refuse_an_open_api(settings: Settings) -> None:
    """Exit 2 naming the problem, before anything starts, when serve would refuse to serve
    an open API beyond loopback (``api.auth.ensure_serving_is_protected``)."""
    from controlroom.api.auth import ensure_serving_is_protected

    try:
        ensure_serving_is_protected(settings)
    except ConfigurationError as exc:
        err_console.print(f"[red]error:[/] {escape(str(exc))}")
        raise typer.Exit(2) from exc


def _refuse_a_cgroup_workers_cannot_join(settings: Settings) -> None:
    """Exit 2 naming the cgroup, before anything starts, when intake's workers could not
    join it (``workers.cgroup_problem``)."""
    from controlroom.workers import cgroup_problem

    cgroup = settings.ingestion.cpu_cgroup
    if cgroup is not None and (problem := cgroup_problem(cgroup)) is not None:
        err_console.print(
            "[red]error:[/] invalid setting ingestion.cpu_cgroup "
            f"(CONTROLROOM_INGESTION__CPU_CGROUP): {escape(problem)}"
        )
        raise typer.Exit(2)


# --- serve --------------------------------------------------------------------------------
async def _serve(settings: Settings) -> int:
    """Run the service (``server.run``) until SIGINT/SIGTERM. Returns the exit code: 0
    after a signal, 1 when a part stopped on its own (the server logged which and why)."""
    import asyncio

    from controlroom import server

    stop = asyncio.Event()
    routed: list[signal.Signals] = []
    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    on_signal = _first_signal_stops(stop, routed, settings.ingestion.stop_grace_seconds)

    def on_serving(serving: Serving) -> None:
        routed.extend(_route_signals(on_signal))
        _announce(settings, serving)

    try:
        await server.run(settings, stop=stop, on_serving=on_serving)
    except server.PartStopped:
        return 1
    finally:
        _restore_signals(routed)
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
    return 0


def _first_signal_stops(
    stop: asyncio.Event, routed: list[signal.Signals], grace_seconds: float
) -> Callable[[], None]:
    """The handler of serve's SIGINT and SIGTERM: the first logs what the stop does and
    sets ``stop``, and hands both signals to ``_ends_at_once``, so that a second one ends
    the process at once, SIGINT as SIGTERM (Python's own SIGINT handler would wait for
    the writes in the threads to finish). Signals that arrived together (``timeout``
    sends SIGTERM to serve and to its process group) are one stop, said once."""

    def on_signal() -> None:
        if stop.is_set():
            return
        _restore_signals(routed)
        routed.clear()
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, _ends_at_once)
        log.info(
            "Stopping: the intakes finish the batches in hand, retrying a busy store for up "
            "to %g s (ingestion.stop_grace_seconds); a second Ctrl+C or SIGTERM ends serve at "
            "once, leaving what the intakes hold to their queues, to be delivered again",
            grace_seconds,
        )
        stop.set()

    return on_signal


def _ends_at_once(signum: int, _frame: object) -> None:
    """A second SIGINT or SIGTERM during serve's stop: say what is left, then end as the
    signal's default action does (the exit status says which)."""
    log.warning(
        "%s again: serve ends now; what the intakes hold goes back to their queues (the "
        "embedded queue's when a process next opens it), and intake's cgroup, if any, to "
        "the next serve of this data directory",
        signal.Signals(signum).name,
    )
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _route_signals(callback: Callable[[], object]) -> list[signal.Signals]:
    """Make SIGINT and SIGTERM call ``callback``; returns the signals it could route.

    Loop signal handlers exist on POSIX only; elsewhere Ctrl+C still ends the process,
    without the orderly shutdown.
    """
    import asyncio

    loop = asyncio.get_running_loop()
    routed = []
    for signum in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(signum, callback)
            routed.append(signum)
    return routed


def _restore_signals(routed: list[signal.Signals]) -> None:
    import asyncio

    loop = asyncio.get_running_loop()
    for signum in routed:
        loop.remove_signal_handler(signum)


def _announce(settings: Settings, serving: Serving) -> None:
    url = serving.url
    # One address per line, ending it: a terminal that makes links of them takes no
    # punctuation along.
    console.print(f"Controlroom is serving {url}")
    for name, path in (
        ("console", "/"),
        ("API docs", "/docs"),
        ("health", "/api/health"),
        ("metrics", "/metrics"),
    ):
        console.print(f"  {name} {url}{path}")
    console.print(f"Store: {_describe_database(settings.effective_database_url)}")
    doing = "Ingesting" if serving.ingesting else "Not ingesting (ingest_on_serve is off);"
    console.print(
        f"{doing} queues [bold]{settings.error_queue}[/] and "
        f"[bold]{settings.telemetry_queue}[/] on {_describe_transport(settings)}; "
        f"what ingestion does is logged every "
        f"{settings.ingestion.report_interval_seconds:g} s while it has work"
    )
    console.print("Press Ctrl+C to stop.")


# --- demo and import-failed ---------------------------------------------------------------
def _progress(*, disable: bool = False) -> Progress:
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        disable=disable,
    )


def _write_missing_search_terms(engine: sa.Engine) -> None:
    """Search terms for rows stored before migration 0009, with a progress bar."""
    from controlroom.errors.ingest.search_backfill import (
        count_rows_without_search_terms,
        write_missing_search_terms,
    )

    pending = count_rows_without_search_terms(engine)
    if not pending:
        return
    with _progress() as progress:
        task = progress.add_task("Writing search terms of stored messages", total=pending)
        write_missing_search_terms(
            engine, progress=lambda done, total: progress.update(task, completed=done, total=total)
        )


async def _publish_demo(
    settings: Settings, messages: list[DemoMessage], telemetry: list[dict[str, Any]]
) -> None:
    import json

    from controlroom.client import open_transport, publish_failed_message

    async with open_transport(settings) as transport:
        with _progress() as progress:
            task = progress.add_task("Publishing failed messages", total=len(messages))
            for message in messages:
                await publish_failed_message(
                    transport, message.headers, message.body, error_queue=settings.error_queue
                )
                progress.advance(task)
            task = progress.add_task("Publishing site-call telemetry", total=len(telemetry))
            for packet in telemetry:
                await transport.publish(
                    settings.telemetry_queue,
                    {},
                    json.dumps(packet).encode(),
                    content_type="application/json",
                )
                progress.advance(task)


async def _until_signalled(work: Coroutine[Any, Any, None]) -> None:
    """Run ``work`` until it ends or SIGINT/SIGTERM cancels it (``_route_signals``: routed
    by the loop, so a SIGINT a shell's ``&`` left ignored stops it too)."""
    import asyncio

    running = asyncio.create_task(work)
    signals = _route_signals(running.cancel)
    try:
        with contextlib.suppress(asyncio.CancelledError):
            await running
    finally:
        _restore_signals(signals)


async def _run_demo_endpoints(settings: Settings, seed: int, fail_ratio: float) -> None:
    """Run the demo endpoints until SIGINT/SIGTERM, printing what each message came to."""

    from controlroom.client import open_transport
    from controlroom.demo_endpoints import DemoEndpoints

    async with open_transport(settings) as transport:
        endpoints = DemoEndpoints(
            transport,
            error_queue=settings.error_queue,
            seed=seed,
            fail_ratio=fail_ratio,
            on_handled=_print_handled,
        )
        await _until_signalled(endpoints.run())


_HANDLED_STYLE = {  # by demo_endpoints.Outcome
    "confirmed": "[green]confirmed[/]",
    "failed again": "[red]failed again[/], back on the error queue",
    "not a retry": "processed (not a retry: nothing to confirm)",
}


def _print_handled(handled: Handled) -> None:
    message_type = (handled.message_type or "message").rpartition(".")[2]
    console.print(
        f"{escape(handled.queue)}: retry of {escape(message_type)} "
        f"{handled.unique_message_id or ''} {_HANDLED_STYLE[handled.outcome]}",
        highlight=False,
    )


async def _reimport(settings: Settings, engine: sa.Engine, ids: list[str]) -> list[ReimportOutcome]:
    """Re-import ``ids`` with a progress bar; one that cannot go back or fails is reported
    on its own line and kept, and the rest proceed (``reimport.reimport_many``)."""
    from controlroom.client import open_transport
    from controlroom.errors.ingest.reimport import reimport_many

    async with open_transport(settings) as transport:
        # One named import (--id) gets its answer, not a bar of one.
        with _progress(disable=len(ids) == 1) as progress:
            task = progress.add_task("Re-importing failed imports", total=len(ids))
            report = await reimport_many(
                engine,
                transport,
                ids,
                error_queue=settings.error_queue,
                by="controlroom import-failed",
                on_each=lambda _id, _outcome: progress.advance(task),
            )
            for failed_import_id, reason in report.kept:
                progress.console.print(
                    f"[yellow]kept[/] {escape(failed_import_id)}: {escape(reason)}",
                    highlight=False,
                )
    return report.outcomes


def _print_failed_imports(engine: sa.Engine) -> None:
    """Every failed import, newest first, one line each: id, time (UTC), queue, reason."""
    from controlroom.errors.ingest.reimport import count_failed_imports, list_failed_imports

    with engine.connect() as conn:
        page = list_failed_imports(conn, offset=0, limit=count_failed_imports(conn) or 1)
    if not page.items:
        console.print("No failed imports.")
        return
    for item in page.items:
        console.print(
            f"{escape(item.id)}  {item.failed_at.isoformat()}  {escape(item.queue)}  "
            f"{escape(item.reason)}",
            markup=True,
            highlight=False,
        )
    noun = "failed import" if page.total == 1 else "failed imports"
    them = "it" if page.total == 1 else "them"
    console.print(f"{page.total} {noun}; `controlroom import-failed` re-imports {them}.")


def _report_reimport(
    settings: Settings, requested_id: str | None, outcomes: list[ReimportOutcome]
) -> None:
    """Summarise; exit 1 when the requested import does not exist or one was kept
    (unreadable, or its publish failed)."""
    from controlroom.errors.ingest.reimport import ReimportOutcome

    if requested_id is not None and outcomes == [ReimportOutcome.GONE]:
        err_console.print(f"[red]error:[/] no failed import with id {escape(requested_id)}")
        raise typer.Exit(1)
    if not outcomes:
        console.print("No failed imports.")
        return
    console.print(
        f"Re-published {outcomes.count(ReimportOutcome.REPUBLISHED)} of {len(outcomes)} "
        f"failed imports to queue [bold]{settings.error_queue}[/]. `controlroom serve` "
        "ingests them again; one whose cause is not fixed comes back as a failed import."
    )
    if ReimportOutcome.UNREADABLE in outcomes or ReimportOutcome.FAILED in outcomes:
        raise typer.Exit(1)


# --- the site agent -----------------------------------------------------------------------
site_app = typer.Typer(
    help="The site agent: a site's store-and-forward buffer of cached calls.",
    no_args_is_help=True,
)
app.add_typer(site_app, name="site")


@site_app.command("serve")
def site_serve(
    host: HostOption = None,
    port: Annotated[int | None, typer.Option(help="Port to listen on.", min=0, max=65535)] = None,
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            envvar="CONTROLROOM_SITE_CONFIG",
            help="TOML settings of the agent.",
            parser=_settings_file,
            callback=_not_empty,
        ),
    ] = None,
) -> None:
    """Serve a site agent (pull contract, Retry/Discard, cached HTTP calls), attempt its
    buffered calls and deliver its telemetry to central, until Ctrl+C/SIGTERM."""
    import asyncio

    from controlroom.runtime.addresses import url_host
    from controlroom.runtime.sockets import listen
    from controlroom.site import SiteAgent, SiteService, load_site_settings
    from controlroom.site.config import SiteSettings
    from controlroom.site.service import ensure_agent_is_protected

    settings = _settings_or_refuse(
        lambda: load_site_settings(config, **_listen_overrides(host, port)),
        SiteSettings,
        "CONTROLROOM_SITE_",
        config,
    )
    try:
        ensure_agent_is_protected(settings)
    except ConfigurationError as exc:  # a settings problem: exit 2, before anything starts
        err_console.print(f"[red]error:[/] {escape(str(exc))}")
        raise typer.Exit(2) from exc
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    with _exit_on_failure():
        listener = listen(settings.host, settings.port, chosen_by="--port or CONTROLROOM_SITE_PORT")
        try:
            agent = SiteAgent(settings)
        except ControlroomError:
            listener.close()
            raise
        try:
            service = SiteService(agent)
            bound_host, bound_port = listener.getsockname()[:2]
            shown_host = url_host(bound_host)
            console.print(
                f"Site agent [bold]{escape(settings.site_id)}[/] serving "
                f"http://{escape(shown_host)}:{bound_port}/site/tracking/changes; store "
                f"{settings.store_path}; telemetry to {settings.central_url or '(nowhere yet)'}"
            )
            asyncio.run(_run_site(service, listener))
        finally:
            agent.close()
            listener.close()


async def _run_site(service: SiteService, listener: socket.socket) -> None:
    signals = _route_signals(service.stop)
    try:
        await service.run(listener)
    finally:
        _restore_signals(signals)


@site_app.command("demo")
def site_demo(
    central_url: Annotated[
        str | None,
        typer.Option(
            help=f"Central's base URL, where telemetry goes. {_DEMO_CENTRAL_HELP}",
            show_default=False,
        ),
    ] = None,
    data_dir: Annotated[
        Path | None,
        typer.Option(
            help="Where the agents keep their tracking stores, under sites/ "
            "[default: CONTROLROOM_DATA_DIR, else ./controlroom-data]",
            show_default=False,
        ),
    ] = None,
    every: Annotated[
        float, typer.Option(help="Seconds between two calls of one agent (about).", min=0.1)
    ] = 3.0,
    print_sites: Annotated[
        bool,
        typer.Option(
            "--print-sites",
            help="Print only the JSON of CONTROLROOM_SITES central needs for these agents, "
            "and exit (make demo passes it to serve).",
        ),
    ] = False,
) -> None:
    """Two local site agents (north, south) making live cached calls to flaky HTTP
    targets (one recovers, one parks until an operator retries it, one answers 400),
    until Ctrl+C. Their ports follow central's: 11, 12 and 13 past the port of
    --central-url (8091-8093 for 8080). Central needs them as sites: see `make demo`."""
    import asyncio
    import json

    from controlroom.site.demo import central_port_of, demo_ports, demo_sites, run_site_demo

    central_url = _demo_central(central_url)
    data_dir = data_dir or _load(None).data_dir
    central_port = central_port_of(central_url)
    sites = json.dumps(demo_sites(central_port=central_port), separators=(",", ":"))
    if print_sites:
        typer.echo(sites)  # bare, for a shell to capture
        return
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    north, south, targets = demo_ports(central_port)
    console.print(
        f"Site agents north (port {north}) and south (port {south}) are calling flaky "
        f"targets (port {targets}), their stores under {escape(str(data_dir / 'sites'))}; "
        f"telemetry goes to {escape(central_url)}. Central "
        f"reconciles and relays with\n  CONTROLROOM_SITES='{sites}'\nPress Ctrl+C to stop.",
        highlight=False,
    )
    with _exit_on_failure(), contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_until_signalled(run_site_demo(data_dir, central_url, every=every)))
