"""What ServiceControl's clients read beyond the failed-message routes: the API root, the
license, custom checks, the ``X-Particular-Version`` header and CORS.

Teams that run NServiceBus point ServicePulse, and scripts written for ServiceControl's
HTTP API, at ``/api/``; these answers keep them working (ServiceControl's public API:
``RootController``, ``LicenseController``, its version header and CORS policy):

- ``GET /api`` and ``GET /api/``: the instance's main URLs, absolute, below this API's
  root (``known_endpoints_url`` relative, as ServiceControl writes it). URLs of what
  Controlroom does not serve (sagas, audit, event log) are left out, not invented.
- ``GET /api/license``: ServiceControl's license shape. Controlroom needs no license, so
  it is ``Valid`` and no trial, and the other fields say there is none.
- ``GET /api/license/details``: the same; ``GET /api/configuration/remotes``: ``[]``
  (a single instance); ``GET /api/authentication/configuration``: ``{"enabled": bool}``.
- ``GET /api/customchecks``: ``[]`` with ``Total-Count: 0`` (Controlroom runs no custom
  checks), so a client shows "none" rather than an error.
- ``X-Particular-Version`` on every ``/api`` response: the ServiceControl API version
  Controlroom implements (setting ``servicecontrol_api_version``).
- CORS for the origins of setting ``cors_allowed_origins`` (none by default).
"""

from __future__ import annotations

from typing import Any, Final

from fastapi import APIRouter, FastAPI, Request, Response
from pydantic import BaseModel, Field
from starlette.datastructures import MutableHeaders
from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from controlroom.api.paging import LIST_RESPONSES
from controlroom.config import Settings

VERSION_HEADER: Final = "X-Particular-Version"
API_PREFIX: Final = "/api"

CORS_METHODS: Final = ("GET", "POST", "PATCH", "DELETE", "PUT")
CORS_REQUEST_HEADERS: Final = ("Content-Type", "Authorization")
"""``Content-Type`` for JSON bodies (ServiceControl's); ``Authorization`` because
Controlroom's API takes bearer tokens, which a page on another origin must be able to send."""
CORS_EXPOSED_HEADERS: Final = (
    "ETag",
    "Last-Modified",
    "Link",
    "Total-Count",
    VERSION_HEADER,
    "Content-Disposition",
)
CORS_MAX_AGE_SECONDS: Final = 600

router = APIRouter(tags=["compatibility"])


# --- response models ----------------------------------------------------------------------
class RootUrls(BaseModel):
    """The API root (ServiceControl's ``RootUrls``): where the main resources are. URL
    templates use RFC 6570 (``{?page,per_page,direction,sort}``), as ServiceControl's."""

    name: str
    description: str
    errors_url: str
    endpoints_error_url: str
    endpoints_url: str
    known_endpoints_url: str
    message_search_url: str
    archived_groups_url: str
    get_archive_group: str
    configuration: str
    license_status: str
    license_details: str


class LicenseInfo(BaseModel):
    """ServiceControl's license answer. Controlroom needs no license: ``license_status``
    ``"Valid"``, ``status`` ``"valid"``, no trial, no expiry (empty dates, as
    ServiceControl writes a missing one), and ``license_type`` saying why."""

    trial_license: bool
    edition: str
    registered_to: str
    upgrade_protection_expiration: str = Field(description="Empty: there is none.")
    expiration_date: str = Field(description="Empty: it never expires.")
    status: str
    license_type: str
    instance_name: str
    license_status: str


NO_LICENSE: Final = LicenseInfo(
    trial_license=False,
    edition="Controlroom",
    registered_to="",
    upgrade_protection_expiration="",
    expiration_date="",
    status="valid",
    license_type="None: Controlroom needs no license",
    instance_name="Controlroom",
    license_status="Valid",
)

_PAGE = "{?page,per_page,direction,sort}"


# --- routes -------------------------------------------------------------------------------
@router.get("", response_model_exclude_none=True)
@router.get("/", response_model_exclude_none=True, include_in_schema=False)
def get_root(request: Request) -> RootUrls:
    """The instance's main URLs, absolute and below this API's root."""
    base = f"{str(request.base_url).rstrip('/')}{API_PREFIX}/"
    return RootUrls(
        name="Controlroom",
        description="Controlroom: failed messages of message-driven systems, and site call audit",
        errors_url=f"{base}errors/{_PAGE}",
        endpoints_error_url=f"{base}endpoints/{{name}}/errors/{_PAGE}",
        endpoints_url=f"{base}endpoints",
        known_endpoints_url="/endpoints/known",  # relative, as ServiceControl writes it
        message_search_url=f"{base}messages/search/{{keyword}}/{_PAGE}",
        archived_groups_url=f"{base}errors/groups/{{classifier?}}",
        get_archive_group=f"{base}archive/groups/id/{{groupId}}",
        configuration=f"{base}configuration",
        license_status=NO_LICENSE.status,
        license_details=f"{base}license",
    )


@router.get("/license")
@router.get("/license/details")
def get_license() -> LicenseInfo:
    """ServiceControl's license shape, saying that Controlroom needs no license."""
    return NO_LICENSE


@router.get("/configuration/remotes")
def list_remotes() -> list[dict[str, Any]]:
    """Remote instances (ServiceControl's audit instances it queries): none, Controlroom
    is a single instance."""
    return []


class AuthenticationConfiguration(BaseModel):
    """Whether the API asks for a bearer token. Controlroom's tokens are configured
    secrets, not OpenID Connect, so there is no authority or client to name."""

    enabled: bool


@router.get("/authentication/configuration")
def get_authentication_configuration(request: Request) -> AuthenticationConfiguration:
    """Whether authentication is on (tokens configured); served without a token, as a
    client asks it before it can sign in."""
    return AuthenticationConfiguration(enabled=not request.app.state.auth.open)


@router.get("/customchecks", responses=LIST_RESPONSES)
def list_custom_checks(response: Response) -> list[dict[str, Any]]:
    """Custom checks: always empty (Controlroom runs none), with ``Total-Count: 0``."""
    response.headers["Total-Count"] = "0"
    return []


# --- middleware ---------------------------------------------------------------------------
class ParticularVersionMiddleware:
    """Adds ``X-Particular-Version: <version>`` to every response under ``/api`` (errors,
    304s and CORS preflights included), as ServiceControl does on every response."""

    def __init__(self, app: ASGIApp, version: str) -> None:
        self.app = app
        self.version = version

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not _is_api_path(scope):
            await self.app(scope, receive, send)
            return

        async def send_with_version(message: Message) -> None:
            if message["type"] == "http.response.start":
                MutableHeaders(scope=message)[VERSION_HEADER] = self.version
            await send(message)

        await self.app(scope, receive, send_with_version)


def _is_api_path(scope: Scope) -> bool:
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    if root and path.startswith(root):
        path = path[len(root) :]
    return path == API_PREFIX or path.startswith(API_PREFIX + "/")


def install_middleware(app: FastAPI, settings: Settings) -> None:
    """CORS for ``settings.cors_allowed_origins`` (a preflight from any other origin is
    refused: 400, no ``Access-Control-Allow-Origin``), and the version header outermost,
    so that it is on every answer, preflights and refusals included."""
    app.add_middleware(
        CORSMiddleware,
        allow_origins=list(settings.cors_allowed_origins),
        allow_methods=list(CORS_METHODS),
        allow_headers=list(CORS_REQUEST_HEADERS),
        expose_headers=list(CORS_EXPOSED_HEADERS),
        max_age=CORS_MAX_AGE_SECONDS,
    )
    app.add_middleware(ParticularVersionMiddleware, version=settings.servicecontrol_api_version)
