"""Unit tests: pure functions and the file-system body store; no servers.

``sample_entries`` and ``sample_headers`` read the real NServiceBus header sets kept in
the repository (``tests/data/nsb_error_headers.json``, see ``tests/data/README.md``), so a
fresh clone runs every test.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SAMPLES_PATH = Path(__file__).parents[1] / "data" / "nsb_error_headers.json"

# Index of each NServiceBus version's entry in the samples file, and the UniqueMessageId
# its notes give (derived from ServiceControl's source).
V10, V8, V6, V5 = 0, 1, 2, 3
SAMPLE_UNIQUE_IDS = {
    V10: "4d0fa359-a748-5c14-e6c2-70c018dc84f7",
    V8: "fcc478a8-4871-59f5-1546-02e396768e8b",
    V6: "78da4577-5958-c9c2-5c63-e94baa7ccc98",
    V5: "901373f5-3287-7ba1-117a-ea244eef7d53",
}


def sample_entries() -> list[dict[str, Any]]:
    """The sample entries (``source``, ``headers``, ``body``, ``notes``)."""
    return json.loads(SAMPLES_PATH.read_text(encoding="utf-8"))


def sample_headers(index: int) -> dict[str, str | None]:
    """A copy of the header set of one sample (``V10``, ``V8``, ``V6``, ``V5``)."""
    return dict(sample_entries()[index]["headers"])
