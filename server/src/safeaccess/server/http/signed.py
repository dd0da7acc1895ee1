"""A Starlette request as the authenticators read it: both the researchers' and the auditors'
endpoints build their `SignedRequest` here."""

from __future__ import annotations

from starlette.requests import Request

from safeaccess.server.auth import SignedRequest


def signed_request(request: Request, body: bytes) -> SignedRequest:
    """The request's signed parts (method, path, query, headers, the raw `body`) and the
    client's address (None when the server is not told it)."""
    return SignedRequest(
        request.method,
        request.url.path,
        request.url.query,
        request.headers,
        body,
        request.client.host if request.client is not None else None,
    )
