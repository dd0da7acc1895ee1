"""The auditors' side of the service: their authentication, checkpoints, entries, proofs, export.

Auditors sign requests exactly as researchers do (`safeaccess.client.httpsig`), with keys held
in their own table: a researcher's key is unknown here and an auditor's key is unknown to the
researcher endpoints, so neither role reaches the other's endpoints.
"""

from __future__ import annotations

import base64
import hashlib
import time
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from safeaccess.client.audit.checkpoint import Checkpoint, sign_checkpoint
from safeaccess.client.keys import public_key_raw
from safeaccess.client.protocol import canonical
from safeaccess.server.auth import Authenticator, SignedRequest
from safeaccess.server.errors import InvalidRequest, NotFound
from safeaccess.server.store import auditlog, log, sequences

if TYPE_CHECKING:
    # Types only: this module takes the parts it needs, never the `Service` (service.py builds
    # an AuditService, so even a type import of it would be an import cycle: `Running` below
    # names what `of` reads instead).
    from safeaccess.server.config import ServerConfig
    from safeaccess.server.ratelimit import FailureLimiter
    from safeaccess.server.store.database import Database

MAX_ENTRIES_PER_REQUEST = 1000
EXPORT_FORMAT = "safeaccess-audit-export"
EXPORT_BATCH = 2000


def log_origin(server_id: str) -> str:
    """The checkpoint origin line: names this centre's log."""
    return f"safeaccess/{server_id}/audit"


class Running(Protocol):
    """What `AuditService.of` reads of a running service (`service.Service` has it all)."""

    @property
    def store(self) -> Database: ...
    @property
    def config(self) -> ServerConfig: ...
    @property
    def signing_key(self) -> Ed25519PrivateKey: ...
    @property
    def auth_limiter(self) -> FailureLimiter: ...


class AuditService:
    """Audit endpoints over the log's store, signed with the server's key.

    `config` gives the server id and the allowed clock skew; `auth_limiter` counts failed
    authentications (shared with the researchers' side, so both roles hit one limit)."""

    def __init__(
        self,
        store: Database,
        config: ServerConfig,
        signing_key: Ed25519PrivateKey,
        auth_limiter: FailureLimiter,
    ):
        self.store = store
        self.config = config
        self.signing_key = signing_key
        self.auditors = Authenticator("auditor", store, config, auth_limiter)

    @classmethod
    def of(cls, service: Running) -> AuditService:
        """An AuditService over a running `Service`'s store, identity and limiter (a
        convenience for tools and tests; the service's own is `service.audit`)."""
        return cls(service.store, service.config, service.signing_key, service.auth_limiter)

    @property
    def auth_limiter(self) -> FailureLimiter:
        """The counter of failed authentications (shared with the researchers' side)."""
        return self.auditors.limiter

    @auth_limiter.setter
    def auth_limiter(self, limiter: FailureLimiter) -> None:
        self.auditors.limiter = limiter

    @property
    def server_id(self) -> str:
        return self.config.server_id

    # -- authentication (auth.py) ---------------------------------------------------------------

    def authenticate(self, request: SignedRequest) -> str:
        """The auditor who signed this request, or raise Unauthenticated (TooManyFailures past
        the rate limit of failures per key id and per address)."""
        return self.auditors.authenticate(request)

    # -- log views ------------------------------------------------------------------------------

    def _sign(self, size: int, root: bytes) -> str:
        checkpoint = Checkpoint(
            origin=log_origin(self.server_id), size=size, root=root, time=int(time.time())
        )
        return sign_checkpoint(checkpoint, self.server_id, self.signing_key)

    def checkpoint(self) -> str:
        """A freshly signed checkpoint of the whole log."""
        with self.store.transaction() as s:
            size = auditlog.size(s)
            return self._sign(size, auditlog.root(s, size))

    def entries(self, start: int, end: int) -> list[dict[str, Any]]:
        if start < 0 or end <= start:
            raise InvalidRequest("give 0 <= start < end")
        end = min(end, start + MAX_ENTRIES_PER_REQUEST)
        with self.store.transaction() as s:
            rows = auditlog.entries(s, start, end)
        return [{"index": i, "record": base64.b64encode(r).decode("ascii")} for i, r in rows]

    def inclusion(self, index: int, size: int) -> list[str]:
        with self.store.transaction() as s:
            proof = auditlog.inclusion_proof(s, index, size)
        return [base64.b64encode(p).decode("ascii") for p in proof]

    def consistency(self, size1: int, size2: int) -> list[str]:
        with self.store.transaction() as s:
            proof = auditlog.consistency_proof(s, size1, size2)
        return [base64.b64encode(p).decode("ascii") for p in proof]

    def export(self) -> Iterator[bytes]:
        """The whole log: a JSON header line (format, server id and key, a signed checkpoint),
        then one line per entry of the checkpoint's tree, `<index> <stored leaf hash, base64>
        <record>` (records are canonical JSON, which has no raw newlines). The stored leaf
        hashes let an offline verifier name an edited record."""
        checkpoint = self.checkpoint()
        size = int(checkpoint.split("\n")[1])
        header: dict[str, Any] = {
            "format": EXPORT_FORMAT,
            "version": 1,
            "server_id": self.server_id,
            "server_public_key": base64.b64encode(
                public_key_raw(self.signing_key.public_key())
            ).decode("ascii"),
            "checkpoint": checkpoint,
        }
        yield canonical.dumps(header) + b"\n"
        for start in range(0, size, EXPORT_BATCH):
            end = min(size, start + EXPORT_BATCH)
            with self.store.transaction() as s:
                rows = auditlog.entries(s, start, end)
                leaves = auditlog.leaf_hashes(s, start, end)
            chunk = []
            for index, record in rows:
                leaf = base64.b64encode(leaves.get(index, b"")).decode("ascii")
                chunk.append(f"{index} {leaf} ".encode("ascii") + record + b"\n")
            yield b"".join(chunk)

    def step_proof(self, researcher: str, sequence_id: str, index: int) -> dict[str, Any]:
        """For a researcher's own step: the log entry recording its outcome, its inclusion
        proof and a signed checkpoint, so she can check her receipt against the log."""
        seq = sequences.get_sequence(self.store, sequence_id)
        step = sequences.get_step(self.store, sequence_id, index)
        if seq is None or seq.researcher != researcher or step is None:
            raise NotFound(f"you have no step {index} in sequence {sequence_id}")
        if step.log_index is None:
            raise NotFound(f"step {index} of {sequence_id} has no outcome in the log yet")
        with self.store.transaction() as s:
            size = auditlog.size(s)
            root = auditlog.root(s, size)
            rows = auditlog.entries(s, step.log_index, step.log_index + 1)
            proof = auditlog.inclusion_proof(s, step.log_index, size)
        if not rows:
            raise NotFound(f"log entry {step.log_index} is missing")
        return {
            "index": step.log_index,
            "record": base64.b64encode(rows[0][1]).decode("ascii"),
            "proof": [base64.b64encode(p).decode("ascii") for p in proof],
            "checkpoint": self._sign(size, root),
        }


def configuration_record(
    config: ServerConfig,
    server_public_key: str,
    trusted_cas: Mapping[str, Ed25519PublicKey],
) -> dict[str, Any]:
    """The configuration an auditor needs to check the log: the centre's identity and key
    (`server_public_key`, 32 raw bytes in base64), the certification authorities it trusts
    (their keys verify endorsements), sandbox settings."""
    cas = {
        name: base64.b64encode(public_key_raw(key)).decode("ascii")
        for name, key in sorted(trusted_cas.items())
    }
    data: dict[str, Any] = {
        "server_id": config.server_id,
        "server_public_key": server_public_key,
        "trusted_cas": cas,
        "sandbox": config.sandbox.model_dump(mode="json"),
        "max_concurrent_jobs": config.max_concurrent_jobs,
    }
    data["digest"] = hashlib.sha256(canonical.dumps(data)).hexdigest()
    return data


def log_configuration(store: Database, data: dict[str, Any]) -> None:
    """Log the configuration record `data` (see `configuration_record`) when it differs from
    the last one logged (first start, changes)."""
    with store.transaction() as s:
        last = log.last_event(s, "configuration")
        if last is None or last.data.get("digest") != data["digest"]:
            auditlog.append(s, "configuration", "server", data)
