"""HTTP endpoints of the audit log, under /v1/audit (auditors only), plus a researcher's proof
for her own step. Auditor requests are signed like researchers' but checked against the
auditors' keys only."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Query, Request
from fastapi.responses import PlainTextResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool

from safeaccess.server.http.signed import signed_request
from safeaccess.server.service import Service


@dataclass(frozen=True)
class Auditor:
    name: str


async def audited(request: Request) -> Auditor:
    service: Service = request.app.state.service
    body = await request.body()
    name = await run_in_threadpool(service.audit.authenticate, signed_request(request, body))
    return Auditor(name=name)


AuditAuth = Annotated[Auditor, Depends(audited)]
Size = Annotated[int, Query(ge=0, le=2**62)]


def register(app: FastAPI, service: Service) -> None:
    """Add the auditors' routes."""

    @app.get("/v1/audit/checkpoint", response_class=PlainTextResponse, tags=["audit"])
    def checkpoint(_auth: AuditAuth) -> str:
        """The latest checkpoint, a signed note (C2SP tlog-checkpoint)."""
        return service.audit.checkpoint()

    @app.get("/v1/audit/entries", tags=["audit"])
    def entries(_auth: AuditAuth, start: Size, end: Size) -> dict[str, Any]:
        """Records start..end-1 (at most 1000), base64 of their canonical bytes."""
        return {"entries": service.audit.entries(start, end)}

    @app.get("/v1/audit/proof/inclusion", tags=["audit"])
    def inclusion(_auth: AuditAuth, index: Size, size: Size) -> dict[str, Any]:
        """RFC 9162 inclusion proof of entry `index` in the tree of `size` entries."""
        return {"index": index, "size": size, "proof": service.audit.inclusion(index, size)}

    @app.get("/v1/audit/proof/consistency", tags=["audit"])
    def consistency(_auth: AuditAuth, size1: Size, size2: Size) -> dict[str, Any]:
        """RFC 9162 consistency proof between the trees of `size1` and `size2` entries."""
        return {"size1": size1, "size2": size2, "proof": service.audit.consistency(size1, size2)}

    @app.get("/v1/audit/export", tags=["audit"])
    def export(_auth: AuditAuth) -> StreamingResponse:
        """The whole log: a JSON header line with a signed checkpoint, then one record a line."""
        return StreamingResponse(service.audit.export(), media_type="application/x-ndjson")
