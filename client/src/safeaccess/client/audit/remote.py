"""The auditor's (and a researcher's) signed HTTP access to a centre's audit log."""

from __future__ import annotations

import base64
import gc
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from safeaccess.client.keys import load_private_key
from safeaccess.client.session import _Signer, tls_verify

BATCH = 1000
COLLECT_EVERY = 8  # pages


class AuditHTTPError(Exception):
    """The server refused an audit request; the message carries its error."""


class LogDamaged(AuditHTTPError):
    """The server cannot compute its log's tree: an entry's row is missing or altered in its
    store (`entry`), which is a bad log, not a failed request."""

    def __init__(self, message: str, entry: int):
        super().__init__(message)
        self.entry = entry


#: The server's message for a damaged log starts by naming the entry.
_DAMAGED = re.compile(r"entry (\d+): (.*)", re.DOTALL)


def _key(key: Ed25519PrivateKey | Path) -> Ed25519PrivateKey:
    return key if isinstance(key, Ed25519PrivateKey) else load_private_key(Path(key).expanduser())


class SignedClient:
    """Requests signed as `name` with `key`, like a researcher's session."""

    def __init__(
        self,
        url: str,
        key: Ed25519PrivateKey | Path,
        name: str,
        timeout: float = 120,
        ca_bundle: Path | str | None = None,
    ):
        self.url = url.rstrip("/")
        self._http = httpx.Client(
            base_url=self.url,
            auth=_Signer(_key(key), name, self.url + "/v1/health"),
            timeout=timeout,
            verify=tls_verify(ca_bundle),
        )

    def close(self) -> None:
        self._http.close()

    def get(self, path: str, **params: Any) -> httpx.Response:
        response = self._http.get(path, params=params or None)
        if response.status_code >= 400:
            try:
                error = response.json()["error"]
                message = f"{error['code']}: {error['message']}"
                damaged = (
                    _DAMAGED.fullmatch(str(error["message"]))
                    if error["code"] == "audit_log_damaged"
                    else None
                )
            except (ValueError, KeyError, TypeError):
                message, damaged = response.text[:300], None
            if damaged is not None:
                raise LogDamaged(damaged.group(2), int(damaged.group(1)))
            raise AuditHTTPError(f"{path}: HTTP {response.status_code} {message}")
        return response

    def health(self) -> dict[str, Any]:
        data: dict[str, Any] = self._http.get("/v1/health").json()
        return data


class ServerSource:
    """A `LogSource` over the auditor endpoints of a running centre."""

    def __init__(self, client: SignedClient, server_key: Ed25519PublicKey | None = None):
        self.client = client
        health = client.health()
        self.server_id = str(health["server_id"])
        announced = Ed25519PublicKey.from_public_bytes(
            base64.b64decode(health["server_public_key"])
        )
        self.pinned = server_key is not None
        self.server_key = server_key if server_key is not None else announced
        self.checkpoint_note = client.get("/v1/audit/checkpoint").text

    def _page(self, start: int, end: int) -> list[dict[str, Any]]:
        entries: list[dict[str, Any]] = self.client.get(
            "/v1/audit/entries", start=start, end=end
        ).json()["entries"]
        return entries

    def entries(self, size: int) -> Iterator[tuple[int, bytes, bytes | None]]:
        """Pages of BATCH entries, the next one fetched while this one is verified: the
        verifier holds at most two pages, and waits on the network only when the server is
        slower than the checks."""
        starts = range(0, size, BATCH)
        if not starts:
            return
        # Each httpx response ends up in a reference cycle (with its 1000 records), which only
        # the cyclic collector frees, and rarely: left alone it holds tens of MB on a long log.
        # Collecting every few pages keeps memory flat; freezing what existed before (imports,
        # the client) makes those collections walk only what the verification allocated.
        gc.freeze()
        try:
            with ThreadPoolExecutor(max_workers=1, thread_name_prefix="audit-page") as pool:
                pending = pool.submit(self._page, 0, min(size, BATCH))
                for number, start in enumerate(starts, start=1):
                    page = pending.result()
                    following = start + BATCH
                    if following < size:
                        pending = pool.submit(self._page, following, min(size, following + BATCH))
                    for entry in page:
                        yield int(entry["index"]), base64.b64decode(entry["record"]), None
                    if number % COLLECT_EVERY == 0:
                        gc.collect()
        finally:
            gc.unfreeze()

    def entry(self, index: int) -> bytes | None:
        """The record the server serves at `index`, even past the checkpoint; None if none."""
        batch = self.client.get("/v1/audit/entries", start=index, end=index + 1).json()
        served = [e for e in batch["entries"] if int(e["index"]) == index]
        return base64.b64decode(served[0]["record"]) if served else None

    def inclusion(self, index: int, size: int) -> list[bytes] | None:
        data = self.client.get("/v1/audit/proof/inclusion", index=index, size=size).json()
        return [base64.b64decode(p) for p in data["proof"]]

    def consistency(self, size1: int, size2: int) -> list[bytes] | None:
        data = self.client.get("/v1/audit/proof/consistency", size1=size1, size2=size2).json()
        return [base64.b64decode(p) for p in data["proof"]]

    def export(self, path: Path) -> None:
        with self.client._http.stream("GET", "/v1/audit/export") as response:
            if response.status_code >= 400:
                raise AuditHTTPError(f"export: HTTP {response.status_code}")
            with open(path, "wb") as handle:
                for chunk in response.iter_bytes():
                    handle.write(chunk)
