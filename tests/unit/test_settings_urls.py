"""URLs in the settings are refused at start when no HTTP client could use them, never
quoted (breaker pass: a webhook's port 99999 made the notification channel raise in every
intake worker, which restarted in a loop while the queue waited; a site's ``[::1/x`` was
reported as central's store failing), and a site's URL holds no credentials, which
``GET /api/sites`` shows to readers."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from controlroom.config import Settings

SECRET = "whsec_MDEyMzQ1Njc4OWFiY2RlZg=="
BAD = [
    "http://127.0.0.1:99999/",
    "http://[::1/x",
    "ftp://hooks.example/",
    "http:///no-host",
    "hooks",
    "http://hooks.example/a b",
    # Second breaker pass: urlsplit takes these, httpx refuses them when it sends.
    "http://256.256.256.256/x",
    "http://xn--zz.com/",
    "http://xn--a.com/",
    "http://\uff41.com/",
    # Fresh-user pass (second): names no resolver takes, and port 0, parked every send.
    "https://hooks..example.org/x",
    "https://-bad-.example/x",
    "http://hooks.example.org:0/x",
]


@pytest.mark.parametrize("url", BAD)
def test_a_webhook_url_no_client_could_use_is_refused(url: str) -> None:
    with pytest.raises(ValidationError) as refused:
        Settings(notifications={"webhooks": [{"name": "hook", "url": url, "secret": SECRET}]})
    [error] = refused.value.errors()
    assert error["loc"][:4] == ("notifications", "webhooks", 0, "url")
    assert url not in error["msg"]


@pytest.mark.parametrize("url", [*BAD, "http://admin:S3CRET@north.example:8090/"])
def test_a_site_url_no_client_could_use_or_holding_credentials_is_refused(url: str) -> None:
    with pytest.raises(ValidationError) as refused:
        Settings(sites=[{"id": "north", "base_url": url}])
    [error] = refused.value.errors()
    assert error["loc"][:3] == ("sites", 0, "base_url")
    assert url not in error["msg"]


@pytest.mark.parametrize("url", ["http://north.example:8090/?x=1", "http://north.example/#top"])
def test_a_site_url_with_a_query_or_fragment_is_refused(url: str) -> None:
    """Fresh-user pass (second): central appended its paths after the query, so every
    pull of ``http://north.example:8090?x=1`` went to ``/?limit=500...`` and was 404."""
    with pytest.raises(ValidationError) as refused:
        Settings(sites=[{"id": "north", "base_url": url}])
    [error] = refused.value.errors()
    assert error["loc"][:3] == ("sites", 0, "base_url")
    assert "query" in error["msg"]


@pytest.mark.parametrize(
    "url",
    [
        "http://north.example:8090",
        "http://hooks_service:8080/x",  # a Docker Compose service name resolves
        "https://hooks.example.org./x",  # a fully qualified name's root dot
        "https://[fd00::5]:8443/agent",
        "http://10.0.0.7/",
        "http://m\u00fcnchen.example/",
    ],
)
def test_usable_urls_are_taken(url: str) -> None:
    settings = Settings(
        sites=[{"id": "north", "base_url": url}],
        notifications={"webhooks": [{"name": "hook", "url": url, "secret": SECRET}]},
    )
    assert settings.sites[0].base_url == url
