"""``controlroom demo run`` (what ``make demo`` runs) is all or nothing: every port it
takes is checked before anything is published, a taken one refused in one line naming
it and ``CONTROLROOM_PORT``, and so are its site agents' tracking stores, kept under its
data directory; a helper that dies stops the whole demo, saying which
(docs/decisions.md "make demo is all or nothing")."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from typer.testing import CliRunner

from controlroom.cli import app, demo_helpers
from controlroom.config import Settings
from controlroom.demo_run import (
    Helper,
    central_address,
    central_url,
    demo_listeners,
    first_taken_port,
    supervise,
)
from controlroom.runtime.sockets import listen
from controlroom.site.store import TrackingStore
from controlroom.workers import STOP_MARGIN_SECONDS

runner = CliRunner()
MAKEFILE = Path(__file__).parents[1] / "Makefile"


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in ("CONTROLROOM_CONFIG", "CONTROLROOM_DATABASE_URL", "CONTROLROOM_BROKER_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("CONTROLROOM_HOST", raising=False)
    monkeypatch.setenv("CONTROLROOM_DATA_DIR", str(tmp_path / "data"))
    return tmp_path / "data"


def free_demo_port() -> int:
    """A central port whose demo ports (it and 11-15 past it) are all free now."""
    for _ in range(200):
        with listen("127.0.0.1", 0) as probe:
            port = probe.getsockname()[1]
        if port + 15 <= 65535 and first_taken_port(demo_listeners("127.0.0.1", port)) is None:
            return port
    raise AssertionError("no free run of demo ports")


def test_the_demo_takes_its_port_and_11_to_15_past_it() -> None:
    ports = [port for _, port, _ in demo_listeners("127.0.0.1", 8080)]
    assert ports == [8080, 8091, 8092, 8093, 8094, 8095]


@pytest.mark.parametrize("past", [0, 11, 12, 13, 14, 15])
def test_a_taken_demo_port_is_refused_in_one_line_before_anything_is_published(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch, past: int
) -> None:
    port = free_demo_port()
    monkeypatch.setenv("CONTROLROOM_PORT", str(port))
    with listen("127.0.0.1", port + past):
        result = runner.invoke(app, ["demo", "run"])
    assert result.exit_code == 1, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    assert f"port {port + past} " in lines[0] and "CONTROLROOM_PORT" in lines[0]
    # Another process holds it (not the demo's own part named), and demo run has no --port.
    assert "in use by another process" in lines[0] and "--port" not in lines[0]
    assert "Published" not in result.output
    assert not data_dir.exists() or not any(data_dir.rglob("*.db"))


def test_an_open_api_beyond_loopback_is_refused_before_anything_is_published(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fresh-user pass (fifth): ``CONTROLROOM_HOST=::`` without tokens published 50
    messages, then its serve refused to serve an open API, and the demo stopped."""
    monkeypatch.setenv("CONTROLROOM_PORT", str(free_demo_port()))
    monkeypatch.setenv("CONTROLROOM_HOST", "::")
    result = runner.invoke(app, ["demo", "run"])
    assert result.exit_code == 2, result.output
    assert "refusing to serve on [::]:" in result.output
    assert "Published" not in result.output
    assert not (data_dir / "queue.db").exists()  # nothing published


def test_a_site_agents_store_in_use_is_refused_in_one_line_before_anything_is_published(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A site agent of another process (a `controlroom site demo` of this data directory)
    holds the store the demo's agent north would open: refused before publishing, not
    found out when the demo's site agents die after serve started."""
    monkeypatch.setenv("CONTROLROOM_PORT", str(free_demo_port()))
    store_path = data_dir / "sites" / "north" / "tracking.db"
    store = TrackingStore.open(store_path)
    try:
        result = runner.invoke(app, ["demo", "run"])
    finally:
        store.close()
    assert result.exit_code == 1, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    assert "in use by another" in lines[0] and "CONTROLROOM_DATA_DIR" in lines[0]
    assert str(store_path) in result.output.replace("\n", "")
    assert "Published" not in result.output
    assert not (data_dir / "queue.db").exists()  # nothing published


def python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def sleeper(pid_file: Path) -> Helper:
    """A helper that writes its pid to ``pid_file`` and sleeps until stopped."""
    return Helper(
        "the sleeper",
        python(
            "import os, pathlib, time;"
            f"pathlib.Path({str(pid_file)!r}).write_text(str(os.getpid()));"
            "time.sleep(600)"
        ),
    )


def test_a_helper_that_exits_stops_the_others_and_is_named(tmp_path: Path) -> None:
    pid_file = tmp_path / "sleeper.pid"
    said: list[str] = []
    code = supervise(
        [
            sleeper(pid_file),
            Helper(
                "the quitter",
                python(
                    "import pathlib, time\n"
                    f"while not pathlib.Path({str(pid_file)!r}).exists(): time.sleep(0.05)\n"
                    "raise SystemExit(3)"
                ),
            ),
        ],
        said.append,
    )
    assert code == 1
    # The end of the stop said too, as after a signal (fresh-user pass, sixth).
    assert said == [
        "demo: the quitter exited (exit status 3); stopping the demo.",
        "demo: stopped.",
    ]
    pid = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):  # stopped and reaped
        os.kill(pid, 0)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGHUP, signal.SIGTERM])
def test_a_signal_to_the_demo_stops_every_helper(tmp_path: Path, signum: int) -> None:
    """Ctrl+C (SIGINT), and SIGHUP too (its terminal closed): no helper is left running
    alone."""
    pid_file = tmp_path / "sleeper.pid"

    def signal_once_started() -> None:
        while not pid_file.exists():
            time.sleep(0.05)
        os.kill(os.getpid(), signum)

    threading.Thread(target=signal_once_started, daemon=True).start()
    said: list[str] = []
    code = supervise([sleeper(pid_file)], said.append)
    assert code == 0
    with pytest.raises(ProcessLookupError):  # stopped and reaped
        os.kill(int(pid_file.read_text()), 0)
    # The operator sees the stop begin and end (Ctrl+C alone printed nothing).
    name = signal.Signals(signum).name
    assert said == [f"demo: {name} received; stopping the demo.", "demo: stopped."]


SIGNAL_RECORDER = """
import os, pathlib, signal, sys, time
record = pathlib.Path(sys.argv[1])
def on_signal(signum, _frame):
    with record.open("a") as out:
        out.write(signal.Signals(signum).name + "\\n")
for sig in (signal.SIGINT, signal.SIGTERM):
    signal.signal(sig, on_signal)
record.with_suffix(".pid").write_text(str(os.getpid()))
while not record.exists():
    time.sleep(0.05)
time.sleep(1)  # a second signal within a stop's first second is seen
"""

SUPERVISOR = """
import sys
from controlroom.demo_run import Helper, supervise
helper = Helper("the recorder", [sys.executable, "-c", sys.argv[1], sys.argv[2]])
raise SystemExit(supervise([helper], print))
"""


def test_ctrl_c_in_the_demos_terminal_gives_each_helper_one_signal(tmp_path: Path) -> None:
    """The terminal sends Ctrl+C's SIGINT to its whole foreground process group; the
    helpers get only the demo's SIGTERM, so serve's stop is a first signal's (it drains),
    never a second's (it leaves what the intakes hold)."""
    record = tmp_path / "signals"
    supervisor = subprocess.Popen(
        [sys.executable, "-c", SUPERVISOR, SIGNAL_RECORDER, str(record)],
        start_new_session=True,  # a group of its own, as a terminal's foreground job
    )
    try:
        deadline = time.monotonic() + 60
        while not record.with_suffix(".pid").exists():
            assert time.monotonic() < deadline, "the helper did not start"
            time.sleep(0.05)
        os.killpg(supervisor.pid, signal.SIGINT)  # what Ctrl+C does
        assert supervisor.wait(60) == 0
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
            supervisor.wait()
    assert record.read_text().split() == ["SIGTERM"]


def test_each_helper_is_given_its_own_stop_seconds(tmp_path: Path) -> None:
    """A helper whose stop takes longer than another's bound is waited for (serve's holds
    its grace and margin, below); one that ignores SIGTERM is killed when its bound
    passes."""
    stubborn_pid, slow_pid, slow_done = (tmp_path / n for n in ("stubborn", "slow", "done"))
    stubborn = Helper(
        "the stubborn",
        python(
            "import os, pathlib, signal, time;"
            "signal.signal(signal.SIGTERM, signal.SIG_IGN);"
            f"pathlib.Path({str(stubborn_pid)!r}).write_text(str(os.getpid()));"
            "time.sleep(600)"
        ),
        stop_seconds=0.5,
    )
    slow = Helper(  # stops 12 s after SIGTERM: past the 10 s every helper had before
        "the slow",
        python(
            "import os, pathlib, signal, time\n"
            "def stop(*_):\n"
            "    time.sleep(12)\n"
            f"    pathlib.Path({str(slow_done)!r}).write_text('stopped')\n"
            "    raise SystemExit(0)\n"
            "signal.signal(signal.SIGTERM, stop)\n"
            f"pathlib.Path({str(slow_pid)!r}).write_text(str(os.getpid()))\n"
            "time.sleep(600)"
        ),
        stop_seconds=60,
    )

    def interrupt_once_started() -> None:
        while not (stubborn_pid.exists() and slow_pid.exists()):
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt_once_started, daemon=True).start()
    assert supervise([stubborn, slow], lambda _line: None) == 0
    assert slow_done.read_text() == "stopped"
    with pytest.raises(ProcessLookupError):  # killed and reaped
        os.kill(int(stubborn_pid.read_text()), 0)


def test_the_demos_serve_has_its_whole_stop_before_it_is_killed(data_dir: Path) -> None:
    """The demo waits for its serve as long as serve's own stop may last: the batches'
    grace and the workers' margin (``workers.STOP_MARGIN_SECONDS``); killed sooner, serve
    would leave what its intakes hold, and intake's cgroup, behind."""
    settings = Settings(data_dir=data_dir)
    serve = next(h for h in demo_helpers(settings, {}) if h.name == "controlroom serve")
    grace = settings.ingestion.stop_grace_seconds
    assert serve.stop_seconds > grace + STOP_MARGIN_SECONDS


def children_of(pid: int) -> dict[int, str]:
    """The live child processes of ``pid``: their pid and command line (Linux /proc)."""
    found: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        fields = stat.rpartition(")")[2].split()
        if int(fields[1]) == pid and fields[0] != "Z":
            found[int(entry.name)] = cmdline
    return found


@pytest.fixture
def demo(data_dir: Path, tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """``demo run`` on ``data_dir``, started in a directory of its own (``tmp_path /
    "cwd"``): what it writes elsewhere than its data directory is seen there."""
    log = tmp_path / "demo.log"
    env = {**os.environ, "CONTROLROOM_PORT": str(free_demo_port())}
    (tmp_path / "cwd").mkdir()
    with log.open("wb") as output:
        process = subprocess.Popen(
            [sys.executable, "-m", "controlroom", "demo", "run"],
            stdout=output,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=tmp_path / "cwd",
        )
        try:
            yield process, log
        finally:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(60)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()


def test_make_demo_stops_whole_when_a_helper_dies(
    demo: tuple[subprocess.Popen[bytes], Path],
) -> None:
    process, log = demo
    while True:  # wait for all four helpers (the demo's publish step ends first)
        children = children_of(process.pid)
        assert process.poll() is None, log.read_text()
        if len(children) == 4 and any("notifications" in c for c in children.values()):
            break
        time.sleep(0.1)
    sinks = next(pid for pid, c in children.items() if "notifications" in c)
    os.kill(sinks, signal.SIGKILL)
    assert process.wait(120) == 1
    output = log.read_text()
    assert "demo: the notification sinks exited (killed by SIGKILL); stopping the demo." in (output)
    for pid in children:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_the_demos_site_agents_keep_their_stores_in_its_data_dir(
    demo: tuple[subprocess.Popen[bytes], Path], data_dir: Path, tmp_path: Path
) -> None:
    """Everything the demo writes lives under CONTROLROOM_DATA_DIR, its site agents'
    tracking stores too: a second demo with its own data directory and port runs beside
    a first one (README "Quick start")."""
    process, log = demo
    cwd = tmp_path / "cwd"
    stores = [data_dir / "sites" / site / "tracking.db" for site in ("north", "south")]
    deadline = time.monotonic() + 120
    while not all(store.exists() for store in stores) and not any(cwd.iterdir()):
        assert process.poll() is None, log.read_text()
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.1)
    assert sorted(p.name for p in cwd.iterdir()) == [], log.read_text()
    assert all(store.exists() for store in stores)


def test_make_demo_runs_demo_run() -> None:
    demo = MAKEFILE.read_text().partition("\ndemo:")[2].partition("\n\n")[0]
    commands = [line.strip() for line in demo.splitlines()[1:]]
    assert commands == ["$(BIN)/controlroom demo run"]


def test_a_helper_waited_for_is_listening_before_the_next_starts(tmp_path: Path) -> None:
    with listen("127.0.0.1", 0) as probe:
        port = probe.getsockname()[1]
    seen = tmp_path / "seen"
    said: list[str] = []
    code = supervise(
        [
            Helper(
                "central",
                python(
                    "import socket, time; time.sleep(1);"
                    f"s = socket.create_server(('127.0.0.1', {port})); time.sleep(600)"
                ),
                listens_on=("127.0.0.1", port),
            ),
            Helper(
                "the site agent",
                python(
                    "import pathlib, socket;"
                    f"socket.create_connection(('127.0.0.1', {port})).close();"
                    f"pathlib.Path({str(seen)!r}).write_text('up'); raise SystemExit(4)"
                ),
            ),
        ],
        said.append,
    )
    assert code == 1 and seen.read_text() == "up"
    assert said == [
        "demo: the site agent exited (exit status 4); stopping the demo.",
        "demo: stopped.",
    ]


def test_the_demos_serve_leaves_routine_lines_out_of_its_log(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import logging

    from controlroom.runtime.demo_logs import QUIET_ENV, quiet_demo_logs

    access = logging.getLogger("uvicorn.access")
    levels = {name: logging.getLogger(name).level for name in ("alembic", "httpx")}
    filters = list(access.filters)
    try:
        monkeypatch.delenv(QUIET_ENV, raising=False)
        quiet_demo_logs()  # not under demo run: nothing changes
        assert access.filters == filters
        assert {n: logging.getLogger(n).level for n in levels} == levels
        monkeypatch.setenv(QUIET_ENV, "1")
        quiet_demo_logs()
        for name in levels:
            assert not logging.getLogger(name).isEnabledFor(logging.INFO), name
            assert logging.getLogger(name).isEnabledFor(logging.WARNING), name

        def record(path: str, status: int) -> logging.LogRecord:
            args = ("127.0.0.1:5", "GET", path, "1.1", status)
            return access.makeRecord("uvicorn.access", logging.INFO, "", 0, "%s", args, None)

        assert not access.filter(record("/static/console.css", 200))
        assert access.filter(record("/messages", 200))
        assert access.filter(record("/static/missing.css", 404))
    finally:
        access.filters[:] = filters
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)


@pytest.mark.parametrize(
    ("host", "url"),
    [
        ("127.0.0.1", "http://127.0.0.1:18100"),
        ("0.0.0.0", "http://127.0.0.1:18100"),
        ("localhost", "http://localhost:18100"),
        ("::", "http://[::1]:18100"),
        ("[::]", "http://[::1]:18100"),
        ("::1", "http://[::1]:18100"),
        ("[::1]", "http://[::1]:18100"),
    ],
)
def test_the_demos_helpers_reach_central_where_serve_listens(host: str, url: str) -> None:
    """Fresh-user pass (fourth): with ``CONTROLROOM_HOST=[::1]`` the demo waited for ever
    for serve at ``[::1]`` (a bracketed name no socket takes), and its helpers were told
    central was at 127.0.0.1, where nothing listened."""
    assert central_url(host, 18100) == url
    connect_to = urlsplit(url)
    assert central_address(host, 18100) == (connect_to.hostname, 18100)
