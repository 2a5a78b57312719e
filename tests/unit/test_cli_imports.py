"""``import controlroom.cli`` loads no API, store or error instance: each command imports
what it needs when it runs, so ``controlroom --help`` and ``controlroom version`` stay
cheap (they cost what typer itself costs)."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("fastapi", "sqlalchemy", "controlroom.api", "controlroom.web", "controlroom.errors")


def test_importing_the_cli_loads_none_of_the_heavy_modules() -> None:
    """Checked in a fresh interpreter: this test process has imported all of them."""
    probe = (
        "import json, sys; import controlroom.cli; "
        f"print(json.dumps(sorted(m for m in sys.modules if m.startswith({HEAVY!r}))))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    loaded = [
        name
        for name in json.loads(result.stdout)
        if any(name == heavy or name.startswith(f"{heavy}.") for heavy in HEAVY)
    ]
    assert loaded == []
