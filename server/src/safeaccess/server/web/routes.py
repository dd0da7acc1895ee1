"""The /review routes: enrolment, login, the queue, one step, decisions, openings.

Pages are server-rendered (Jinja2, autoescaped) plain HTML forms: no script is needed. Every POST
checks the CSRF token of the session; every page but login and enrolment needs a logged-in
checker. Researchers' signed requests carry no session cookie and get the login page; a checker's
cookie is worth nothing on the /v1 API, which only accepts signed requests.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import APIRouter, FastAPI, Form, Path, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from safeaccess.rules.decision import Decision
from safeaccess.server.errors import NotFound, ServiceError
from safeaccess.server.review import decisions as review
from safeaccess.server.review import rules as review_rules
from safeaccess.server.service import Service
from safeaccess.server.store import review as withheld
from safeaccess.server.web import accounts, csrf
from safeaccess.server.web.forms import DecisionForm, EnrolForm, LoginForm, StepDecisionForm
from safeaccess.server.web.qr import qr_svg
from safeaccess.server.web.ratelimit import FailureLimiter
from safeaccess.server.web.render import pretty_json, render_output
from safeaccess.server.web.sessions import COOKIE, SessionStore, WebSession

PREFIX = "/review"
STATIC_CSS = "review.css"
SequenceId = Annotated[str, Path(pattern=r"^[0-9a-f]{32}$")]
StepIndex = Annotated[int, Path(ge=1, le=65535)]

SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'self'; img-src 'self' data:; form-action 'self'; "
        "frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
    "Cross-Origin-Opener-Policy": "same-origin",
}


@dataclass
class Web:
    service: Service
    env: Environment
    sessions: SessionStore
    by_account: FailureLimiter
    by_address: FailureLimiter


def _web(request: Request) -> Web:
    web: Web = request.app.state.review_web
    return web


def _cookie(response: Response, session: WebSession) -> None:
    response.set_cookie(
        COOKIE,
        session.id,
        path=PREFIX,
        secure=True,
        httponly=True,
        samesite="strict",
    )


def _page(
    request: Request,
    template: str,
    session: WebSession | None,
    status: int = 200,
    **context: Any,
) -> HTMLResponse:
    web = _web(request)
    flash = web.sessions.take_flash(session) if session is not None else []
    html = web.env.get_template(template).render(
        prefix=PREFIX,
        csrf=session.csrf if session is not None else "",
        checker=session.checker if session is not None else None,
        flash=flash,
        **context,
    )
    response = HTMLResponse(html, status_code=status)
    if session is not None:
        _cookie(response, session)
    return response


def _error(
    request: Request, session: WebSession | None, status: int, title: str, message: str
) -> HTMLResponse:
    return _page(request, "error.html", session, status, title=title, message=message)


def _session(request: Request) -> tuple[WebSession | None, bool]:
    return _web(request).sessions.get(request.cookies.get(COOKIE))


def _anonymous(request: Request) -> WebSession:
    """The current session, or a new anonymous one (it carries the login form's CSRF token)."""
    session, _ = _session(request)
    return session if session is not None else _web(request).sessions.new()


def _login_redirect(expired: bool) -> RedirectResponse:
    return RedirectResponse(f"{PREFIX}/login" + ("?expired=1" if expired else ""), status_code=303)


def _checker(request: Request) -> WebSession | RedirectResponse:
    session, expired = _session(request)
    if session is None or session.checker is None:
        return _login_redirect(expired)
    if not accounts.is_active(_web(request).service.store, session.checker):
        _web(request).sessions.end(session.id)
        return _login_redirect(False)
    return session


def _csrf_refused(request: Request, session: WebSession | None) -> HTMLResponse:
    return _error(
        request,
        session,
        403,
        "Form refused",
        "This form was stale or did not come from this page (its CSRF token is missing or "
        "wrong), so nothing was changed. Reload the page and submit it again.",
    )


def _decision_form(request: Request, form: DecisionForm) -> tuple[WebSession, str] | Response:
    """The checker and her name behind a decision form, or the response refusing it: not
    logged in, a missing or wrong CSRF token, or an action other than approve/reject."""
    session = _checker(request)
    if isinstance(session, RedirectResponse):
        return session
    if not csrf.valid(session, form.csrf_token):
        return _csrf_refused(request, session)
    if session.checker is None or form.action not in ("approve", "reject"):
        return _error(request, session, 400, "Decision refused", "choose approve or reject")
    return session, session.checker


def _age_hours(at: str) -> float:
    when = datetime.fromisoformat(at)
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return (datetime.now(UTC) - when) / timedelta(hours=1)


router = APIRouter(prefix=PREFIX, include_in_schema=False)


@router.get("/static/review.css")
def static_css(request: Request) -> Response:
    from importlib.resources import files

    text = (files("safeaccess.server.web") / "static" / STATIC_CSS).read_text(encoding="utf-8")
    return Response(text, media_type="text/css")


# -- enrolment and login --------------------------------------------------------------------------


@router.get("/enrol")
def enrol_page(request: Request, token: str = "") -> Response:
    session = _anonymous(request)
    found = accounts.enrolment_for(_web(request).service.store, token) if token else None
    if found is None:
        return _error(
            request,
            session,
            404,
            "Enrolment link not valid",
            "This enrolment link is not valid: it was used, it expired or it was mistyped. Ask "
            "the administrator for a new one (safeaccess-server checker add).",
        )
    return _enrol_form(request, session, token, found)


def _enrol_form(
    request: Request,
    session: WebSession | None,
    token: str,
    found: tuple[str, str],
    error: str | None = None,
) -> Response:
    """The enrolment form of the account `found` (name, TOTP secret), with `error` (400)
    after a refused submission."""
    name, secret = found
    uri = accounts.provisioning_uri(name, secret)
    status = 200 if error is None else 400
    return _page(
        request,
        "enrol.html",
        session,
        status,
        token=token,
        name=name,
        secret=secret,
        uri=uri,
        qr=qr_svg(uri),
        error=error,
    )


@router.post("/enrol")
def enrol_submit(request: Request, form: Annotated[EnrolForm, Form()]) -> Response:
    session, _ = _session(request)
    if not csrf.valid(session, form.csrf_token):
        return _csrf_refused(request, session)
    assert session is not None
    store = _web(request).service.store
    try:
        name = accounts.enrol(store, form.token, form.password, form.confirm, form.code)
    except ServiceError as exc:
        found = accounts.enrolment_for(store, form.token)
        if found is None:
            return _error(request, session, 400, "Enrolment failed", exc.message)
        return _enrol_form(request, session, form.token, found, exc.message)
    _web(request).sessions.add_flash(
        session, f"Account {name} is active. Log in with your password and a new code."
    )
    return RedirectResponse(f"{PREFIX}/login", status_code=303)


@router.get("/login")
def login_page(request: Request, expired: str = "") -> Response:
    session = _anonymous(request)
    notice = "Your session ended; log in again." if expired else None
    return _page(request, "login.html", session, notice=notice, error=None, name="")


@router.post("/login")
def login_submit(request: Request, form: Annotated[LoginForm, Form()]) -> Response:
    web = _web(request)
    session, _ = _session(request)
    if not csrf.valid(session, form.csrf_token):
        return _csrf_refused(request, session)
    assert session is not None
    name = form.name
    address = "addr:" + (request.client.host if request.client else "unknown")
    account = "acct:" + name
    wait = max(web.by_account.retry_after(account), web.by_address.retry_after(address))
    if wait:
        return _page(
            request,
            "login.html",
            session,
            429,
            notice=None,
            name=name,
            error=f"Too many failed logins. Try again in {wait} s.",
        )
    checker = accounts.authenticate(web.service.store, name, form.password, form.code)
    if checker is None:
        web.by_account.fail(account)
        web.by_address.fail(address)
        return _page(
            request,
            "login.html",
            session,
            401,
            notice=None,
            name=name,
            error="Name, password or code not right (a code works once; wait for the next one).",
        )
    web.by_account.clear(account)
    web.sessions.end(session.id)
    fresh = web.sessions.new(checker)
    web.service.store.log_event("review_login", checker, {"checker": checker})
    response = RedirectResponse(f"{PREFIX}/", status_code=303)
    _cookie(response, fresh)
    return response


@router.post("/logout")
def logout(request: Request, csrf_token: Annotated[str, Form()] = "") -> Response:
    session, _ = _session(request)
    if not csrf.valid(session, csrf_token):
        return _csrf_refused(request, session)
    assert session is not None
    _web(request).sessions.end(session.id)
    return RedirectResponse(f"{PREFIX}/login", status_code=303)


# -- the queue ------------------------------------------------------------------------------------


@router.get("/")
def queue(
    request: Request,
    dataset: str = "",
    project: str = "",
    researcher: str = "",
    kind: str = "",
    older_than_hours: str = "",
) -> Response:
    session = _checker(request)
    if isinstance(session, RedirectResponse):
        return session
    items = review.pending(_web(request).service.store)
    try:
        min_age = float(older_than_hours) if older_than_hours.strip() else None
    except ValueError:
        min_age = None
    filters = {
        "dataset": dataset,
        "project": project,
        "researcher": researcher,
        "kind": kind,
        "older_than_hours": older_than_hours,
    }
    shown = [
        i
        for i in items
        if (not dataset or i.dataset == dataset)
        and (not project or i.project == project)
        and (not researcher or i.researcher == researcher)
        and (not kind or (i.kind or "") == kind)
        and (min_age is None or _age_hours(i.waiting_since) >= min_age)
    ]
    rows = [
        {
            "item": i,
            "age": _age_hours(i.waiting_since),
            "second": bool(i.approved_by) and len(i.approved_by) < i.checkers_required,
        }
        for i in shown
    ]
    return _page(
        request,
        "queue.html",
        session,
        rows=rows,
        total=len(items),
        filters=filters,
        waiting_second=sum(1 for r in rows if r["second"]),
        options={
            "dataset": sorted({i.dataset for i in items}),
            "project": sorted({i.project for i in items}),
            "researcher": sorted({i.researcher for i in items}),
            "kind": sorted({i.kind or "" for i in items}),
        },
        openings=len(review.openings(_web(request).service.store)),
        withheld=withheld.withheld_steps(_web(request).service.store, limit=0)[0],
        bad_age=bool(older_than_hours.strip()) and min_age is None,
    )


# -- one step -------------------------------------------------------------------------------------


def _analysis_text(body: bytes) -> tuple[Any, dict[str, str]]:
    try:
        parsed = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return body.decode("utf-8", "replace"), {}
    fields: dict[str, str] = {}
    if isinstance(parsed, dict):
        # Every field as the researcher wrote it; the filter and formula are text already.
        for key, value in parsed.items():
            if value is None or value == [] or value == {}:
                continue
            if isinstance(value, str):
                fields[key] = value
            elif isinstance(value, list) and all(isinstance(v, str | int | float) for v in value):
                fields[key] = ", ".join(str(v) for v in value)
            else:
                fields[key] = json.dumps(value, sort_keys=True)
    return parsed, fields


def _step_context(web: Web, seq_id: str, index: int, checker: str) -> dict[str, Any]:
    store = web.service.store
    seq = store.get_sequence(seq_id)
    step = store.get_step(seq_id, index)
    if seq is None or step is None:
        raise NotFound(f"step {index} of sequence {seq_id} does not exist")
    review_rules.refuse_own_output(store, seq, checker)
    dataset = store.get_dataset(seq.dataset_id)
    decision = Decision.model_validate(step.decision) if step.decision else None
    findings = list(decision.findings) if decision else []
    analysis, fields = _analysis_text(step.body)
    order = {"checks": 0, "run_finished": 1, "review_first_approval": 2}
    logged = [e for e in store.events(seq_id) if e.step_index == index and e.kind in order]
    logged.sort(key=lambda e: (order[e.kind], e.log_index))
    earlier = [
        {"step": s, "output": render_output(s.public_output, [])}
        for s in store.steps(seq_id)
        if s.index < index and s.state == "released"
    ]
    same_dataset = []
    for other in store.list_sequences(seq.researcher):
        if other.id == seq_id:
            continue
        other_ds = store.get_dataset(other.dataset_id)
        if other_ds.name != dataset.name:
            continue
        for s in store.steps(other.id):
            if s.state == "released":
                same_dataset.append({"sequence": other, "step": s, "version": other_ds.version})
    approvals = review_rules.first_approvals(store, seq_id, index)
    required = review_rules.checkers_required(store, dataset.name)
    return {
        "seq": seq,
        "step": step,
        "dataset": dataset,
        "decision": decision,
        "findings": findings,
        "analysis": pretty_json(analysis),
        "fields": fields,
        "output": render_output(step.output, findings),
        "facts": [(e.kind, pretty_json(e.data)) for e in logged],
        "earlier": earlier,
        "same_dataset": same_dataset[-50:],
        "approvals": approvals,
        "required": required,
        "already_approved": any(a.checker == checker for a in approvals),
        "run": (
            review.script_run_state(
                step.output, step.error_code, step.error_message, step.wall_seconds
            )
            if step.kind == "script"
            else None
        ),
        "mitigable": step.kind in ("frequency_table", "magnitude_table"),
    }


@router.get("/steps/{sequence_id}/{index}")
def step_page(request: Request, sequence_id: SequenceId, index: StepIndex) -> Response:
    session = _checker(request)
    if isinstance(session, RedirectResponse):
        return session
    assert session.checker is not None
    web = _web(request)
    try:
        context = _step_context(web, sequence_id, index, session.checker)
    except ServiceError as exc:
        return _error(request, session, exc.status, "Not available", exc.message)
    review_rules.log_view(web.service.store, session.checker, sequence_id, index)
    return _page(request, "step.html", session, **context)


@router.post("/steps/{sequence_id}/{index}/decision")
def step_decision(
    request: Request,
    sequence_id: SequenceId,
    index: StepIndex,
    fields: Annotated[StepDecisionForm, Form()],
) -> Response:
    form = _decision_form(request, fields)
    if isinstance(form, Response):
        return form
    session, checker = form
    web = _web(request)
    mitigation = None
    if fields.action == "approve" and (fields.suppress or fields.round_to.strip()):
        try:
            base = int(fields.round_to) if fields.round_to.strip() else None
        except ValueError:
            return _error(
                request,
                session,
                400,
                "Decision refused",
                f"the rounding base must be a whole number, not {fields.round_to!r}; "
                "nothing changed",
            )
        mitigation = review.Mitigation(suppress=bool(fields.suppress), round_to=base)
    try:
        view = web.service.decide_review(
            sequence_id,
            index,
            approve=fields.action == "approve",
            reviewer=checker,
            note=fields.comment.strip(),
            mitigation=mitigation,
        )
    except ServiceError as exc:
        return _error(request, session, exc.status, "Decision refused", exc.message)
    state = view.sequence_state
    if view.state == "review":
        message = f"Your approval of step {index} is recorded; it waits for a second checker."
    elif fields.action == "approve":
        message = f"Step {index} of {sequence_id} released (sequence {state})."
    else:
        message = f"Step {index} of {sequence_id} withheld with your comment (sequence {state})."
    web.sessions.add_flash(session, message)
    return RedirectResponse(f"{PREFIX}/", status_code=303)


# -- openings past the withhold budget ------------------------------------------------------------


#: Withheld steps listed per page of the "withheld" list.
WITHHELD_PAGE = 50


@router.get("/withheld")
def withheld_page(request: Request, page: str = "1") -> Response:
    """Every withheld step, newest first, by the rules or by a checker, each linked to its
    page: the queue shows only what waits, and a checker must find a withhold to explain it."""
    session = _checker(request)
    if isinstance(session, RedirectResponse):
        return session
    number = int(page) if page.isdigit() and int(page) >= 1 else 1
    store = _web(request).service.store
    total, rows = withheld.withheld_steps(
        store, limit=WITHHELD_PAGE, offset=(number - 1) * WITHHELD_PAGE
    )
    datasets: dict[int, str] = {}
    items = []
    for seq, step in rows:
        if seq.dataset_id not in datasets:
            datasets[seq.dataset_id] = store.get_dataset(seq.dataset_id).name
        decision = Decision.model_validate(step.decision) if step.decision else None
        items.append(
            {
                "seq": seq,
                "step": step,
                "dataset": datasets[seq.dataset_id],
                "by": step.reviewer or "the rules",
                "checks": sorted({f.check for f in decision.findings} if decision else set()),
            }
        )
    pages = max(1, -(-total // WITHHELD_PAGE))
    return _page(
        request,
        "withheld.html",
        session,
        items=items,
        total=total,
        page=number,
        pages=pages,
    )


@router.get("/openings")
def openings_page(request: Request) -> Response:
    session = _checker(request)
    if isinstance(session, RedirectResponse):
        return session
    items = review.openings(_web(request).service.store)
    return _page(request, "openings.html", session, items=items)


@router.post("/openings/{sequence_id}/decision")
def opening_decision(
    request: Request, sequence_id: SequenceId, fields: Annotated[DecisionForm, Form()]
) -> Response:
    form = _decision_form(request, fields)
    if isinstance(form, Response):
        return form
    session, checker = form
    try:
        view = _web(request).service.decide_opening(
            sequence_id,
            approve=fields.action == "approve",
            reviewer=checker,
            note=fields.comment.strip(),
        )
    except ServiceError as exc:
        return _error(request, session, exc.status, "Decision refused", exc.message)
    state = view.sequence_state
    _web(request).sessions.add_flash(
        session, f"Opening of {sequence_id} decided; the sequence is now {state}."
    )
    return RedirectResponse(f"{PREFIX}/openings", status_code=303)


def mount(app: FastAPI, service: Service) -> None:
    """Serve the review workspace under /review on `app`."""
    cfg = service.config.review_web
    env = Environment(
        loader=PackageLoader("safeaccess.server.web", "templates"),
        autoescape=select_autoescape(default=True, default_for_string=True),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["urlencode_dict"] = lambda d: urlencode({k: v for k, v in d.items() if v})
    app.state.review_web = Web(
        service=service,
        env=env,
        # Sessions and login failures live in the database: every replica shares them.
        sessions=SessionStore(
            service.store, cfg.idle_timeout_seconds, cfg.session_lifetime_seconds
        ),
        by_account=FailureLimiter(
            service.store,
            "login-account",
            cfg.login_failures_per_account,
            cfg.login_window_seconds,
        ),
        by_address=FailureLimiter(
            service.store,
            "login-address",
            cfg.login_failures_per_address,
            cfg.login_window_seconds,
        ),
    )
    app.include_router(router)

    app.add_middleware(ReviewHeaders)


class ReviewHeaders:
    """`SECURITY_HEADERS` on every response under `PREFIX` (a header a route set stays).

    Plain ASGI, so the API's requests pass straight through: as a `BaseHTTPMiddleware`
    (`@app.middleware("http")`) it put every API request through a task group and a pair of
    memory streams, about a millisecond of the server's CPU per step."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if not (path == PREFIX or path.startswith(PREFIX + "/")):
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for key, value in SECURITY_HEADERS.items():
                    headers.setdefault(key, value)
            await send(message)

        await self.app(scope, receive, send_with_headers)
