"""The site agent: a site's store-and-forward engine for cached calls, its tracking store
(the source of truth), its telemetry outbox and the HTTP API central pulls and commands.

A site's Python process::

    agent = SiteAgent(SiteSettings(site_id="plant-7", central_url="http://central:8080"))
    agent.register("post-invoice", post_invoice)      # fn(payload); raise to fail
    agent.cached_call("erp/invoices", "post-invoice", {"number": 42})
    agent.http_call("POST", "https://erp.example/invoices", json={"number": 42})

and runs ``SiteService(agent).run(listener)`` (or ``controlroom site serve``) for the
retries, the outbox and the API.
"""

from controlroom.site.agent import CachedCallFailed, CallResult, SiteAgent
from controlroom.site.config import SiteSettings, load_site_settings
from controlroom.site.lifecycle import CommandOutcome, PermanentFailure, Status
from controlroom.site.service import SiteService

__all__ = [
    "CachedCallFailed",
    "CallResult",
    "CommandOutcome",
    "PermanentFailure",
    "SiteAgent",
    "SiteService",
    "SiteSettings",
    "Status",
    "load_site_settings",
]
