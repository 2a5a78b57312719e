"""Every HTTP client a test makes names its timeout (``tests.servers.TEST_CLIENT_TIMEOUT``
or its own, on purpose): httpx's default of 5 s fails tests on a loaded CI machine."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
# httpx's module-level requests and its clients; a call of one without ``timeout=`` waits
# httpx's default. (The in-process TestClient has no network timeout: not listed.)
CALLS = {"get", "post", "put", "patch", "delete", "head", "options", "request", "stream"}
CLIENTS = {"Client", "AsyncClient"}


def calls_without_timeout(source: str) -> list[int]:
    """Line numbers of ``httpx.<request>(...)`` and ``httpx.Client(...)`` /
    ``httpx.AsyncClient(...)`` calls in ``source`` that pass no ``timeout``."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        owner = node.func.value
        if not (isinstance(owner, ast.Name) and owner.id == "httpx"):
            continue
        if node.func.attr not in CALLS | CLIENTS:
            continue
        keywords = {keyword.arg for keyword in node.keywords}
        if "timeout" not in keywords and None not in keywords:  # None: a **kwargs
            lines.append(node.lineno)
    return lines


def test_the_scan_finds_a_client_without_a_timeout() -> None:
    source = "import httpx\nhttpx.get('u', timeout=1)\nhttpx.AsyncClient(base_url='u')\n"
    assert calls_without_timeout(source) == [3]


def test_every_http_client_of_the_tests_names_its_timeout() -> None:
    offenders = [
        f"{path.relative_to(TESTS.parent)}:{line}"
        for path in sorted(TESTS.rglob("*.py"))
        for line in calls_without_timeout(path.read_text(encoding="utf-8"))
    ]
    assert offenders == []
