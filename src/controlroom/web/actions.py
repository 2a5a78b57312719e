"""The console's actions (POST): retry, archive, unarchive (one message or a selection),
edit and retry, retry or archive a group, the monitored switch, sign-in and sign-out.

Every action but sign-in depends on ``actor``: a valid session, its CSRF token and the
``operator`` role, else 403 and nothing changes. Each calls the same function the API
calls (``errors/actions``, ``errors/retries/requests``), which logs the event as the
operator, and answers 303 to the page that shows the outcome (docs/decisions.md "Console
actions answer with a redirect"): a count as a fixed-text ``done=`` code, a retry
operation's id whose progress that page polls, or, when the action was refused (an
unknown id, a message that cannot be retried, no transport), a flash saying why. A
form whose own input cannot be read (an edit's headers, a locked header changed) answers
400 instead: nothing was done, and going back keeps what the operator typed.
"""

from __future__ import annotations

import json
import uuid
from typing import Annotated, Any
from urllib.parse import urlencode

import sqlalchemy as sa
from fastapi import APIRouter, Depends, Form, HTTPException, Request
from fastapi.responses import Response

from controlroom.errors import actions
from controlroom.errors.read import operations
from controlroom.errors.retries import requests as retries
from controlroom.http.auth import Principal, SitePrincipal
from controlroom.transport.base import TransportError
from controlroom.web.common import actor, api_state, redirect, redirect_with, safe_next
from controlroom.web.flash import Flash
from controlroom.web.session import (
    COOKIE_NAME,
    CSRF_FIELD,
    Session,
    clear_session_cookie,
    csrf_matches,
    set_session_cookie,
)

router = APIRouter(include_in_schema=False)
Actor = Annotated[Session, Depends(actor)]
BULK_ACTIONS = ("retry", "archive", "unarchive")


# --- one message --------------------------------------------------------------------------
@router.post("/messages/{failed_message_id}/retry")
def retry_message(request: Request, session: Actor, failed_message_id: uuid.UUID) -> Response:
    back = f"/messages/{failed_message_id}"
    try:
        result = _retry(request, session, retries.retry_message, str(failed_message_id))
    except Refused as refusal:
        return refusal.redirect(request, back)
    return redirect(_with(back, operation=_operation_id(result)))


@router.post("/messages/{failed_message_id}/archive")
def archive_message(request: Request, session: Actor, failed_message_id: uuid.UUID) -> Response:
    return _archive_one(request, session, failed_message_id, actions.archive_messages, "archived")


@router.post("/messages/{failed_message_id}/unarchive")
def unarchive_message(request: Request, session: Actor, failed_message_id: uuid.UUID) -> Response:
    return _archive_one(
        request, session, failed_message_id, actions.unarchive_messages, "unarchived"
    )


@router.post("/messages/{failed_message_id}/edit")
async def edit_and_retry(
    request: Request,
    session: Actor,
    failed_message_id: uuid.UUID,
    body: Annotated[str, Form(max_length=16 * 1024 * 1024)],
    headers: Annotated[str, Form(max_length=4 * 1024 * 1024)],
) -> Response:
    """Send an edited copy (``retries.edit_and_retry``); the original becomes Resolved."""
    try:
        parsed: Any = json.loads(headers)
    except ValueError as exc:
        raise HTTPException(400, f"headers: not JSON ({exc})") from None
    if not isinstance(parsed, dict) or not all(
        isinstance(value, str | None) for value in parsed.values()
    ):
        raise HTTPException(400, "headers: must be a JSON object of text values")
    state = api_state(request)
    back = f"/messages/{failed_message_id}"
    if state.transport is None:
        return Refused("no transport is configured to send the edited message").redirect(
            request, back
        )
    try:
        await retries.edit_and_retry(
            state.engine,
            state.transport,
            str(failed_message_id),
            body=body,
            headers=parsed,
            acknowledgement_queue=state.settings.error_queue,
        )
    except retries.InvalidEdit as exc:
        # The form's own input is wrong: an error page, so going back keeps the edit.
        raise HTTPException(400, str(exc)) from exc
    except retries.RetryRequestError as exc:
        return Refused(str(exc)).redirect(request, back)
    except TransportError as exc:
        return Refused(f"the edited message could not be sent: {exc}").redirect(request, back)
    return redirect(_with(back, done="edited"))


# --- a selection --------------------------------------------------------------------------
@router.post("/messages/bulk")
async def bulk(request: Request, session: Actor) -> Response:
    """Retry, archive or unarchive the selected messages (form fields ``ids`` and
    ``action``), then back to the list the form came from (``back``)."""
    form = await request.form()
    action = form.get("action")
    if action not in BULK_ACTIONS:
        raise HTTPException(400, f"action must be one of {', '.join(BULK_ACTIONS)}")
    ids = [str(_uuid(value)) for value in form.getlist("ids")]
    back_field = form.get("back")
    back = safe_next(back_field if isinstance(back_field, str) else "/messages")
    if not ids:
        return redirect(_with(back, done="nothing"))
    if len(ids) > operations.MAX_IDS_PER_REQUEST:
        raise HTTPException(400, f"ids: at most {operations.MAX_IDS_PER_REQUEST} at once")
    try:
        if action == "retry":
            result = _retry(request, session, retries.retry_messages, ids)
            return redirect(
                _with(back, done="retried", n=result.message_count, operation=_operation_id(result))
            )
        act = actions.archive_messages if action == "archive" else actions.unarchive_messages
        change = _by_ids(request, session, act, ids)
    except Refused as refusal:
        return refusal.redirect(request, back)
    left = len(change.unchanged) or None  # said only when some were
    return redirect(_with(back, done=f"{action}d", n=len(change.changed), left=left))


# --- groups -------------------------------------------------------------------------------
@router.post("/groups/{group_id}/retry")
def retry_group(
    request: Request,
    session: Actor,
    group_id: uuid.UUID,
    classifier: Annotated[str, Form(max_length=200)] = "",
) -> Response:
    back = _with("/groups", classifier=classifier)
    try:
        _retry(request, session, retries.retry_group, str(group_id), selection=True)
    except Refused as refusal:
        return refusal.redirect(request, back)
    return redirect(back)


@router.post("/groups/{group_id}/archive")
def archive_group(
    request: Request,
    session: Actor,
    group_id: uuid.UUID,
    classifier: Annotated[str, Form(max_length=200)] = "",
) -> Response:
    try:
        changed = actions.archive_group(_engine(request), str(group_id), by=_name(session))
    except retries.UnknownGroup as exc:
        return Refused(str(exc)).redirect(request, _with("/groups", classifier=classifier))
    return redirect(_with("/groups", classifier=classifier, done="group-archived", n=changed))


@router.post("/groups/{group_id}/acknowledge")
def acknowledge_group_retry(
    request: Request,
    session: Actor,
    group_id: uuid.UUID,
    classifier: Annotated[str, Form(max_length=200)] = "",
) -> Response:
    """Dismiss the group's completed retry (as ``DELETE
    /api/recoverability/unacknowledgedgroups/{id}``): the group no longer shows it."""
    back = _with("/groups", classifier=classifier)
    if not actions.acknowledge_group_retry(_engine(request), str(group_id)):
        text = f"no completed retry of group {group_id} awaits acknowledgement"
        return Refused(text).redirect(request, back)
    return redirect(_with(back, done="acknowledged"))


# --- endpoints ----------------------------------------------------------------------------
@router.post("/endpoints/{endpoint_id}/monitored")
def set_monitored(
    request: Request,
    session: Actor,
    endpoint_id: uuid.UUID,
    monitored: Annotated[str, Form(pattern="^(true|false)$")],
) -> Response:
    found = actions.set_endpoint_monitored(
        _engine(request), str(endpoint_id), monitored == "true", by=_name(session)
    )
    if not found:
        return Refused(f"no known endpoint with id {endpoint_id}").redirect(request, "/endpoints")
    return redirect("/endpoints")


# --- sign-in ------------------------------------------------------------------------------
@router.post("/signin")
def sign_in(
    request: Request,
    token: Annotated[str, Form(max_length=4096)],
    next: Annotated[str, Form(max_length=2000)] = "/",
) -> Response:
    """Exchange an API token for a session cookie. Only a same-origin form may sign in
    (a cross-site ``Origin`` is refused), so no other site can sign a browser in."""
    origin = request.headers.get("origin")
    if origin is not None and origin != f"{request.url.scheme}://{request.url.netloc}":
        raise HTTPException(403, "sign-in from another site is refused")
    signer = request.app.state.signer
    caller = api_state(request).auth.identify(token.strip()) if token.strip() else None
    if not isinstance(caller, Principal):
        # Back to the sign-in page, which says why: a reload there sends no token again.
        why = "site" if isinstance(caller, SitePrincipal) else "1"
        return redirect("/signin?" + urlencode({"next": safe_next(next), "refused": why}))
    principal = caller
    response = redirect(safe_next(next))
    set_session_cookie(response, request, signer, signer.new_session(principal))
    return response


@router.post("/signout")
async def sign_out(request: Request) -> Response:
    """End the session (CSRF-checked, so no other site can sign the operator out)."""
    session = request.app.state.signer.decode(request.cookies.get(COOKIE_NAME))
    form = await request.form()
    token = form.get(CSRF_FIELD)
    if session is None or not csrf_matches(session, token if isinstance(token, str) else None):
        raise HTTPException(403, "the form's CSRF token is missing or wrong: reload the page")
    response = redirect("/signin")
    clear_session_cookie(response)
    return response


# --- helpers ------------------------------------------------------------------------------
class Refused(Exception):
    """The action did nothing, for the reason given (one sentence, shown as text)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason

    def redirect(self, request: Request, path: str) -> Response:
        """303 to ``path``, which shows the refusal once."""
        text = self.reason[:1].upper() + self.reason[1:]
        return redirect_with(request, path, Flash("error", text, code="Refused"))


def _retry(
    request: Request, session: Session, action: Any, *args: Any, selection: bool = False
) -> retries.RetryRequestResult:
    """Run a retry request of ``errors/retries/requests`` as the session's principal;
    raises ``Refused`` with the request's reason (unknown ids, archived or resolved). A
    ``selection``'s request answers within ``retries.ANSWER_WITHIN``, as the API's does."""
    processor = api_state(request).retry_processor
    options: dict[str, Any] = {}
    if selection:
        options["answer_within"] = retries.ANSWER_WITHIN
        options["on_batches"] = processor.wake if processor is not None else None
    try:
        result: retries.RetryRequestResult = action(
            _engine(request), *args, by=_name(session), **options
        )
    except retries.RetryRequestError as exc:
        raise Refused(str(exc)) from exc
    if processor is not None and result.batches:
        processor.wake()
    return result


def _archive_one(
    request: Request, session: Session, failed_message_id: uuid.UUID, action: Any, done: str
) -> Response:
    back = f"/messages/{failed_message_id}"
    try:
        change = _by_ids(request, session, action, [str(failed_message_id)])
    except Refused as refusal:
        return refusal.redirect(request, back)
    return redirect(_with(back, done=done, n=len(change.changed)))


def _operation_id(result: retries.RetryRequestResult) -> str | None:
    """The operation whose progress to show; none when the request claimed nothing."""
    return result.operation_id if result.batches else None


def _by_ids(
    request: Request, session: Session, action: Any, ids: list[str]
) -> operations.StatusChange:
    """What ``action`` (``errors/actions``) changed and left; raises ``Refused`` naming
    the unknown ids when any (nothing was changed)."""
    change: operations.StatusChange = action(_engine(request), ids, by=_name(session))
    if change.refused:
        raise Refused(f"no failed message with id {', '.join(change.unknown[:20])}")
    return change


def _name(session: Session) -> str:
    return session.principal.name


def _with(path: str, **params: Any) -> str:
    kept = {key: value for key, value in params.items() if value not in (None, "")}
    if not kept:
        return path
    joiner = "&" if "?" in path else "?"
    return path + joiner + urlencode(kept)


def _uuid(value: object) -> uuid.UUID:
    try:
        return uuid.UUID(str(value))
    except ValueError:
        raise HTTPException(400, "ids: each must be a failed message id (a UUID)") from None


def _engine(request: Request) -> sa.Engine:
    engine: sa.Engine = api_state(request).engine
    return engine
