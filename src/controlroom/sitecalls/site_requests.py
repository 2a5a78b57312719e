"""Central's requests to a site agent (reconciliation's pages, the Retry/Discard relay),
bounded in time and in size: ``request_site``.

httpx's timeout bounds each read of an answer, not the whole: a site that sends its
answer a byte every few seconds holds the request for as long as it likes, and what it
sends is read into memory whole. A site is another party (a broken or hostile agent), so
the whole answer must arrive within ``reconciliation.request_timeout`` and stay under a
size (docs/design.md "Reconciliation"). The request runs on the event loop: while it
waits it holds no thread that the API's other routes need.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

import httpx

MAX_PAGE_BYTES = 64 * 1024 * 1024
"""The largest answer to one page of the pull contract: 5,000 rows (the largest
``reconciliation.batch_size``) of a few kilobytes each fit many times over."""

MAX_COMMAND_ANSWER_BYTES = 64 * 1024
"""The largest answer to a Retry or Discard: a small JSON object."""


class SiteAnswerError(Exception):
    """The site's answer was not read whole: ``AnswerTooSlow`` or ``AnswerTooLarge``."""


class AnswerTooSlow(SiteAnswerError):
    """The whole answer did not arrive within the timeout (the site may still act on the
    request)."""


class AnswerTooLarge(SiteAnswerError):
    """The answer is larger than its bound; the rest is not read."""


@dataclass(frozen=True, slots=True)
class SiteAnswer:
    """A site's whole answer: its HTTP status and body bytes."""

    status_code: int
    body: bytes

    @property
    def is_success(self) -> bool:
        return 200 <= self.status_code < 300

    def json(self) -> Any:
        """The body as JSON. Raises ``ValueError`` when it is not JSON."""
        return json.loads(self.body)

    def text(self, limit: int) -> str:
        """The first ``limit`` characters of the body, undecodable bytes replaced."""
        return self.body[: limit * 4].decode("utf-8", "replace")[:limit]


async def request_site(
    method: str,
    url: str,
    *,
    headers: dict[str, str],
    timeout: float,
    max_bytes: int,
    params: dict[str, Any] | None = None,
    json_body: Any = None,
) -> SiteAnswer:
    """Send one request to a site and read its whole answer within ``timeout`` seconds
    from the call, at most ``max_bytes`` of body. Raises ``AnswerTooSlow`` past the
    timeout, ``AnswerTooLarge`` past the size (announced by Content-Length, or read), and
    httpx's ``HTTPError`` when the site cannot be reached or the connection fails."""
    try:
        async with (
            asyncio.timeout(timeout),
            # A connection not made is httpx's ConnectTimeout (nothing was sent), before
            # the whole answer's deadline can call it slow.
            httpx.AsyncClient(timeout=httpx.Timeout(timeout, connect=timeout * 0.9)) as client,
            client.stream(method, url, headers=headers, params=params, json=json_body) as answer,
        ):
            announced = answer.headers.get("content-length", "")
            if announced.isdigit() and int(announced) > max_bytes:
                raise AnswerTooLarge(f"its answer of {announced} bytes is over {max_bytes}")
            body = bytearray()
            async for chunk in answer.aiter_bytes():
                body += chunk
                if len(body) > max_bytes:
                    raise AnswerTooLarge(f"its answer is over {max_bytes} bytes")
            return SiteAnswer(answer.status_code, bytes(body))
    except TimeoutError as exc:
        raise AnswerTooSlow(f"no whole answer within {timeout:g} s") from exc
