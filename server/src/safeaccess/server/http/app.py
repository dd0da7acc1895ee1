"""The HTTP API, versioned under /v1, over a `Service`.

Every endpoint except /v1/health needs a request signed with the researcher's key (see
`safeaccess.client.httpsig`). Bodies are parsed only after the signature verifies, and every error
is a JSON body {"error": {"code", "message"}}.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from fastapi import FastAPI, Path, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest
from pydantic import BaseModel, ValidationError
from sqlalchemy.exc import DBAPIError, OperationalError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from safeaccess.client.keyrotation import KeyStatus
from safeaccess.server import metrics
from safeaccess.server.errors import (
    InvalidRequest,
    PayloadTooLarge,
    ServiceError,
    Unauthenticated,
    Unavailable,
)
from safeaccess.server.http import audit as api_audit
from safeaccess.server.http.signed import signed_request
from safeaccess.server.logs import RequestIds
from safeaccess.server.ratelimit import TooManyFailures
from safeaccess.server.readiness import Readiness, sandbox_mode
from safeaccess.server.schemas import (
    Catalogue,
    Health,
    OpenRequest,
    PlanCheckRequest,
    PlanCheckView,
    RehearsalView,
    RevealRequest,
    SequenceList,
    SequenceView,
    StepView,
)
from safeaccess.server.service import Service
from safeaccess.server.steps import budgets, rehearsal

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

M = TypeVar("M", bound=BaseModel)

SequenceId = Annotated[str, Path(pattern=r"^[0-9a-f]{32}$")]
StepIndex = Annotated[int, Path(ge=1, le=65535)]
KeyFingerprint = Annotated[str, Path(pattern=r"^[0-9a-f]{64}$")]
DatasetName = Annotated[str, Path(pattern=r"^[A-Za-z0-9_.-]{1,128}$")]


def error_body(code: str, message: str) -> dict[str, dict[str, str]]:
    return {"error": {"code": code, "message": message}}


class BodyLimit:
    """Refuse request bodies above `limit` bytes with 413 before any handler sees them."""

    def __init__(self, app: ASGIApp, limit: int):
        self.app = app
        self.limit = limit

    async def _refuse(self, send: Send, status: int, code: str, message: str) -> None:
        payload = json.dumps(error_body(code, message)).encode()
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(payload)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": payload})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        too_large = f"the request body exceeds the limit of {self.limit} bytes"
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                if not value.isdigit():
                    await self._refuse(send, 400, "invalid_request", "bad Content-Length header")
                    return
                if int(value) > self.limit:
                    await self._refuse(send, 413, PayloadTooLarge.code, too_large)
                    return
        chunks: list[bytes] = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limit:
                await self._refuse(send, 413, PayloadTooLarge.code, too_large)
                return
            chunks.append(chunk)
            more = message.get("more_body", False)
        body = b"".join(chunks)
        delivered = False

        async def replay() -> Message:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


@dataclass(frozen=True)
class Authed:
    researcher: str
    body: bytes
    #: The researcher's key as authentication read it: a sequence header's signature is
    #: checked against it, without reading the key a second time.
    key: Ed25519PublicKey


def parse_body(model: type[M], body: bytes) -> M:
    """Parse a JSON request body into a model, or raise InvalidRequest saying what is wrong."""
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        errors = exc.errors()
        if errors and errors[0]["type"] == "json_invalid":
            raise InvalidRequest(f"the body is not valid JSON: {errors[0]['msg']}") from exc
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'body'}: {err['msg']}" for err in errors[:5]
        )
        raise InvalidRequest(f"invalid request body: {problems}") from exc


def _authenticate(service: Service, request: Request, body: bytes) -> Authed:
    """Verify the request's signature over its raw body (in a worker thread: it reads the
    database); the researcher who signed it."""
    researcher, key = service.authenticate_key(signed_request(request, body))
    return Authed(researcher=researcher, body=body, key=key)


async def authed_call(request: Request, handle: Callable[[Authed], Response]) -> Response:
    """Authenticate the request and `handle` it, in one worker thread: every researcher
    endpoint answers this way. A signature check as a dependency, with the endpoint a plain
    function, is two trips to the thread pool (the dependency's, then the endpoint's), each
    waking the event loop and a worker: measurable on a step's path of a few milliseconds.
    The path's parameters are checked first (400), then the signature (401)."""
    body = await request.body()
    service: Service = request.app.state.service
    return await run_in_threadpool(lambda: handle(_authenticate(service, request, body)))


def dict_reply(value: dict[str, Any]) -> Response:
    """A plain JSON reply, encoded as FastAPI encodes a returned dict."""
    return JSONResponse(jsonable_encoder(value))


def json_reply(view: BaseModel, status: int = 200) -> Response:
    """A view as its JSON reply, serialised once by pydantic's own encoder.

    Returned as a `Response`, FastAPI sends it as is: for a returned model it would validate
    the model again against `response_model`, dump it to Python values and encode those with
    `json.dumps`, three passes over a view the service built and validated already. The
    route's `response_model` still documents the reply."""
    return Response(view.model_dump_json(), status_code=status, media_type="application/json")


def create_app(service: Service) -> FastAPI:
    """The FastAPI application for one service."""
    app = FastAPI(
        title="safeaccess",
        version="1",
        summary="Tit-for-tat remote execution for a safe access centre",
        openapi_url="/v1/openapi.json",
        docs_url="/v1/docs",
        redoc_url=None,
    )
    app.state.service = service

    @app.exception_handler(ServiceError)
    async def _service_error(request: Request, exc: ServiceError) -> JSONResponse:
        headers = {"Retry-After": "5"} if isinstance(exc, Unavailable) else None
        if isinstance(exc, Unauthenticated | TooManyFailures):
            who = "auditor" if request.url.path.startswith("/v1/audit") else "researcher"
            metrics.AUTH_FAILURES.labels(kind=who, reason=exc.code).inc()
        if isinstance(exc, TooManyFailures):
            headers = {"Retry-After": str(math.ceil(exc.retry_after))}
        return JSONResponse(error_body(exc.code, exc.message), exc.status, headers=headers)

    @app.exception_handler(DBAPIError)
    async def _database_error(_request: Request, exc: DBAPIError) -> JSONResponse:
        # A lost connection (PostgreSQL restarting, a failover) is the centre's passing
        # failure: 503 with Retry-After, which the clients retry. Every call they retry is
        # idempotent and every write is one transaction, so a retry finds what committed.
        if isinstance(exc, OperationalError) or exc.connection_invalidated:
            logging.getLogger("safeaccess.server").warning(
                "database unavailable during a request: %s", str(exc.orig or exc).strip()
            )
            unavailable = Unavailable("the centre's database is unavailable for a moment; retry")
            return JSONResponse(
                error_body(unavailable.code, unavailable.message), 503, headers={"Retry-After": "1"}
            )
        raise exc

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors()[:5]
        )
        return JSONResponse(error_body("invalid_request", problems), 400)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return JSONResponse(error_body(code, str(exc.detail)), exc.status_code)

    @app.get("/v1/health", response_model=Health, tags=["service"])
    def health() -> Health:
        """Liveness and identity of this centre (no authentication): the process answers.
        Whether it can serve a step now is `/v1/ready`."""
        return Health(
            status="ok",
            server_id=service.server_id,
            server_key=service.server_fingerprint,
            server_public_key=service.server_public_key,
            sandbox=service.backend.name,
            sandbox_mode=sandbox_mode(service.backend),
        )

    @app.get(
        "/v1/ready",
        response_model=Readiness,
        tags=["service"],
        responses={503: {"model": Readiness, "description": "not ready, and why"}},
    )
    def ready() -> Response:
        """Readiness (no authentication): 200 when this replica can serve a step now, 503
        with the reasons while its database does not answer, no worker has been seen (job
        queue) or its sandbox cannot start. The load balancer's health check."""
        answer = service.readiness()
        return json_reply(answer, 200 if answer.ready else 503)

    @app.get("/metrics", include_in_schema=False)
    def prometheus_metrics() -> Response:
        """Prometheus metrics of this replica (`metrics.py`); HAProxy refuses this path from
        outside, Prometheus scrapes each replica on the private network."""
        return Response(generate_latest(REGISTRY), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/keys/{fingerprint}", response_model=KeyStatus, tags=["service"])
    def key_status(fingerprint: KeyFingerprint) -> KeyStatus:
        """Whether a researcher key is current, rotated or revoked (no authentication: a client
        whose key stopped working learns why, and flags a revocation she did not ask for)."""
        return KeyStatus.model_validate(service.store.key_status(fingerprint))

    @app.get("/v1/datasets", response_model=Catalogue, tags=["catalogue"])
    async def datasets(request: Request) -> Response:
        """Datasets of your projects: names, descriptions and column metadata (never data)."""
        return await authed_call(
            request,
            lambda auth: json_reply(Catalogue(datasets=service.catalogue(auth.researcher))),
        )

    @app.get("/v1/datasets/{name}/mock", tags=["catalogue"])
    async def dataset_mock(name: DatasetName, request: Request) -> Response:
        """The dataset's published DP mock: the manifest, the centre's signature over its
        canonical JSON, and the Parquet file (base64). Mock results predict nothing about real
        verdicts."""
        return await authed_call(
            request, lambda auth: dict_reply(service.mock(auth.researcher, name))
        )

    @app.post("/v1/datasets/{name}/plan-check", response_model=PlanCheckView, tags=["catalogue"])
    async def plan_check(name: DatasetName, request: Request) -> Response:
        """Check an unsealed plan for what its analyses alone doom (a DP request the budget
        cannot cover, a kind the dataset's DP setting refuses); nothing runs or is charged."""

        def handle(auth: Authed) -> Response:
            plan = parse_body(PlanCheckRequest, auth.body)
            return json_reply(budgets.plan_check(service.store, auth.researcher, name, plan))

        return await authed_call(request, handle)

    @app.post("/v1/datasets/{name}/rehearse", response_model=RehearsalView, tags=["catalogue"])
    async def rehearse(name: DatasetName, request: Request) -> Response:
        """Rehearse an unsealed plan on a mock built from the metadata, with the same compute
        code and output rules; nothing touches the data, is logged or charged."""

        def handle(auth: Authed) -> Response:
            plan = parse_body(PlanCheckRequest, auth.body)
            view = rehearsal.rehearse(
                service.store, service.ruleset_for, auth.researcher, name, plan
            )
            return json_reply(view)

        return await authed_call(request, handle)

    @app.get("/v1/sequences", response_model=SequenceList, tags=["sequences"])
    async def list_sequences(request: Request) -> Response:
        """Your sequences with the state of each step."""
        return await authed_call(
            request,
            lambda auth: json_reply(SequenceList(sequences=service.sequences(auth.researcher))),
        )

    @app.post("/v1/sequences", response_model=StepView, status_code=201, tags=["sequences"])
    async def open_sequence(request: Request) -> Response:
        """Open a sequence: signed header, endorsements, T_1 and body 1. Runs step 1."""

        def handle(auth: Authed) -> Response:
            opening = parse_body(OpenRequest, auth.body)
            return json_reply(service.open_sequence(auth.researcher, opening, key=auth.key), 201)

        return await authed_call(request, handle)

    @app.get("/v1/sequences/{sequence_id}", response_model=SequenceView, tags=["sequences"])
    async def get_sequence(sequence_id: SequenceId, request: Request) -> Response:
        return await authed_call(
            request, lambda auth: json_reply(service.sequence(auth.researcher, sequence_id))
        )

    @app.get(
        "/v1/sequences/{sequence_id}/steps/{index}", response_model=StepView, tags=["sequences"]
    )
    async def get_step(sequence_id: SequenceId, index: StepIndex, request: Request) -> Response:
        """A step's state; its released output once released, the reasons if withheld."""
        return await authed_call(
            request, lambda auth: json_reply(service.step(auth.researcher, sequence_id, index))
        )

    @app.post(
        "/v1/sequences/{sequence_id}/steps/{index}", response_model=StepView, tags=["sequences"]
    )
    async def reveal_step(sequence_id: SequenceId, index: StepIndex, request: Request) -> Response:
        """Reveal step `index` (T_j, body j) after step j-1 was released. Repeating the accepted
        reveal returns the same answer without running it twice."""

        def handle(auth: Authed) -> Response:
            reveal = parse_body(RevealRequest, auth.body)
            view = service.flow.reveal(auth.researcher, sequence_id, index, reveal, key=auth.key)
            return json_reply(view)

        return await authed_call(request, handle)

    @app.get("/v1/sequences/{sequence_id}/steps/{index}/proof", tags=["sequences"])
    async def step_proof(sequence_id: SequenceId, index: StepIndex, request: Request) -> Response:
        """Your step's outcome entry in the audit log, its inclusion proof and a signed
        checkpoint: check your receipt against the log (`safeaccess audit receipt`)."""
        return await authed_call(
            request,
            lambda auth: dict_reply(service.audit.step_proof(auth.researcher, sequence_id, index)),
        )

    @app.get(
        "/v1/sequences/{sequence_id}/steps/{index}/file",
        tags=["sequences"],
        response_class=Response,
        responses={200: {"content": {"application/vnd.apache.parquet": {}}}},
    )
    async def step_file(sequence_id: SequenceId, index: StepIndex, request: Request) -> Response:
        """The released file of your step (synthetic data, Parquet); its SHA-256 is in the
        step's output and hence in your signed receipt."""

        def handle(auth: Authed) -> Response:
            data = service.step_file(auth.researcher, sequence_id, index)
            return Response(content=data, media_type="application/vnd.apache.parquet")

        return await authed_call(request, handle)

    api_audit.register(app, service)
    # The output checkers' web workspace under /review (session cookies, never signatures).
    from safeaccess.server import web

    web.mount(app, service)
    app.add_middleware(BodyLimit, limit=service.config.max_body_bytes)
    # Outermost: every line logged for the request, even a refused body's, carries its id.
    app.add_middleware(RequestIds)
    return app
