"""The console's static files under content-hashed names, cached by browsers for good.

Every file below ``web/static`` is also served as ``/static/<name>.<hash>.<suffix>``
(``/static/console.3f2a9c1b.css``), where the hash is the first 8 hex digits of the
SHA-256 of its content, computed once when the console starts. Such an answer carries
``Cache-Control: public, max-age=31536000, immutable``: a changed file gets a new name,
so a browser never asks again for one it holds, and a warm page load is one request.
Templates name a file by ``static_url('console.css')`` (a Jinja global); the unhashed
names keep answering, without the immutable header.
"""

from __future__ import annotations

import hashlib
from pathlib import Path, PurePosixPath
from typing import Final

from starlette.responses import Response
from starlette.staticfiles import StaticFiles
from starlette.types import Scope

IMMUTABLE: Final = "public, max-age=31536000, immutable"
HASH_DIGITS: Final = 8
PREFIX: Final = "/static"


class StaticAssets:
    """The hashed name of every file below ``directory`` (read once, here)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._hashed: dict[str, str] = {}  # file -> hashed name, both relative
        for path in sorted(directory.rglob("*")):
            if path.is_file():
                name = path.relative_to(directory).as_posix()
                digest = hashlib.sha256(path.read_bytes()).hexdigest()[:HASH_DIGITS]
                self._hashed[name] = hashed_name(name, digest)
        self._files = {hashed: name for name, hashed in self._hashed.items()}

    def url(self, name: str) -> str:
        """The immutable URL of file ``name`` (relative to the static directory, e.g.
        ``vendor/htmx/htmx.min.js``). Raises ``KeyError`` for a file that is not there,
        so a template naming one fails when it renders, not in the browser."""
        return f"{PREFIX}/{self._hashed[name]}"

    def file_of(self, hashed: str) -> str | None:
        """The file a hashed name stands for, ``None`` when ``hashed`` is not one."""
        return self._files.get(hashed)


def hashed_name(name: str, digest: str) -> str:
    """``name`` with ``digest`` before its last suffix: ``a/console.css`` ->
    ``a/console.<digest>.css``; ``LICENSE`` -> ``LICENSE.<digest>``."""
    path = PurePosixPath(name)
    if not path.suffix:
        return f"{name}.{digest}"
    return str(path.with_name(f"{path.stem}.{digest}{path.suffix}"))


class HashedStaticFiles(StaticFiles):
    """``StaticFiles`` over ``assets.directory`` that also answers the hashed names,
    those with the immutable ``Cache-Control``."""

    def __init__(self, assets: StaticAssets) -> None:
        super().__init__(directory=assets.directory)
        self._assets = assets

    async def get_response(self, path: str, scope: Scope) -> Response:
        name = self._assets.file_of(path)
        if name is None:
            return await super().get_response(path, scope)
        response = await super().get_response(name, scope)
        if response.status_code < 400:
            response.headers["Cache-Control"] = IMMUTABLE
        return response
