"""The site demo's targets behave as `make demo` promises; its servers answer without
waiting for a delayed ACK."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from controlroom.site import demo
from controlroom.site.demo import MAX_RETRIES, demo_sites, flaky_targets
from tests.nodelay import accepted_with_nodelay


def test_the_demo_targets() -> None:
    client = TestClient(flaky_targets())
    assert [client.post("/recovers/a").status_code for _ in range(3)] == [503, 503, 200]
    parks = [client.post("/maintenance/b").status_code for _ in range(MAX_RETRIES + 1)]
    assert parks == [503] * MAX_RETRIES + [200]  # parked first, then an operator's retry
    assert client.post("/rejects/c").status_code == 400


def test_the_demo_sites_entries_are_valid_central_settings() -> None:
    from controlroom.config import Settings

    assert [site.id for site in Settings(sites=demo_sites()).sites] == ["north", "south"]


def test_every_connection_the_demo_accepts_has_tcp_nodelay(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Free ports (probed, as for a child process) instead of those past central's.
    targets, north, south, central = (free_port() for _ in range(4))

    async def main() -> list[bool]:
        running = asyncio.create_task(
            demo.run_site_demo(
                tmp_path,
                f"http://127.0.0.1:{central}",
                every=60.0,
                ports=(north, south, targets),
            )
        )
        try:
            async with asyncio.timeout(60):
                for port in (targets, north, south):
                    while not await asyncio.to_thread(_accepts, port):
                        await asyncio.sleep(0.05)
                return [
                    await asyncio.to_thread(accepted_with_nodelay, "127.0.0.1", port)
                    for port in (targets, north, south)
                ]
        finally:
            running.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await running

    assert asyncio.run(main()) == [True, True, True]


def free_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as probe:
        return int(probe.getsockname()[1])


def _accepts(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


def test_make_demo_configures_central_with_the_demo_agents_secrets() -> None:
    """`make demo` gives serve the sites `controlroom site demo` runs, secrets included:
    otherwise central refuses the agents' telemetry and the agents central's pulls."""
    from pathlib import Path

    makefile = (Path(__file__).parents[2] / "Makefile").read_text()
    assert "site demo --print-sites --central-url $(DEMO_CENTRAL)" in makefile
    assert (
        'CONTROLROOM_SITES="$$sites_json" CONTROLROOM_NOTIFICATIONS="$$outbox_json" '
        "$(BIN)/controlroom serve" in makefile
    )
    assert all(site["token"] and site["central_token"] for site in demo_sites())
