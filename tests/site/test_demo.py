"""The site demo's targets behave as `make demo` promises."""

from __future__ import annotations

from fastapi.testclient import TestClient

from controlroom.site.demo import MAX_RETRIES, demo_sites, flaky_targets


def test_the_demo_targets() -> None:
    client = TestClient(flaky_targets())
    assert [client.post("/recovers/a").status_code for _ in range(3)] == [503, 503, 200]
    parks = [client.post("/maintenance/b").status_code for _ in range(MAX_RETRIES + 1)]
    assert parks == [503] * MAX_RETRIES + [200]  # parked first, then an operator's retry
    assert client.post("/rejects/c").status_code == 400


def test_the_demo_sites_entries_are_valid_central_settings() -> None:
    from controlroom.config import Settings

    assert [site.id for site in Settings(sites=demo_sites()).sites] == ["north", "south"]


def test_make_demo_configures_central_with_the_demo_agents_secrets() -> None:
    """`make demo` gives serve the sites `controlroom site demo` runs, secrets included:
    otherwise central refuses the agents' telemetry and the agents central's pulls."""
    import json
    from pathlib import Path

    makefile = Path(__file__).parents[2] / "Makefile"
    line = next(
        line for line in makefile.read_text().splitlines() if line.startswith("DEMO_SITES :=")
    )
    assert json.loads(line.partition(":=")[2]) == demo_sites()
    assert all(site["token"] and site["central_token"] for site in demo_sites())
