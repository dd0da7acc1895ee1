"""Request authentication for researchers and auditors: one `Authenticator` per role.

Both roles sign requests the same way (`safeaccess.client.httpsig`) with keys held in their own
tables, so one class does both: the role decides the key table, the namespace of key ids in the
failure limiter and of nonces (an auditor may share a name with a researcher), and the word in
the server log. Every failure gets the one `AUTHENTICATION_FAILED` answer, whatever its cause,
so that the answer does not tell who is registered.

The limits of failures throttle failures, never a valid request: a request signed by a
registered key, for this server, fresh, with a new nonce, is served even when its key id or its
address is past its limit. Researchers behind one institution's address (a NAT, a proxy) share
that address with whoever fails from it, and anyone may send forged signatures naming a
colleague's key id; neither may lock her out. A request that fails authentication is counted
against its claimed key id and its address while both are within their limits, and refused with
429 (not counted again) once either is past it. Registered or not, a claimed key id is counted
and throttled alike, so neither answer tells who is registered.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from safeaccess.client.httpsig import SignatureError, verify_request
from safeaccess.client.keys import load_public_key
from safeaccess.server.errors import Unauthenticated
from safeaccess.server.ratelimit import FailureLimiter, TooManyFailures, claimed_keyid
from safeaccess.server.store import catalogue

if TYPE_CHECKING:
    from safeaccess.server.config import ServerConfig
    from safeaccess.server.store.database import Database

log = logging.getLogger("safeaccess.server")

AUTHENTICATION_FAILED = (
    "the request could not be authenticated: sign it with the key registered for your researcher "
    "name, for this server, with the current time and a fresh nonce (the safeaccess client does "
    "this; check your researcher name, key file and clock)"
)


def refuse_past_limit(
    wait: float | None,
    key: str | None,
    address: str | None,
    who: str,
    once: OncePerMinute | None = None,
) -> None:
    """Refuse (429) when the limiter said to `wait` (None: within the limits); logged, or
    logged once a minute per address (else key id) with `once`."""
    if wait is not None:
        if once is None or once.first(address if address is not None else key):
            log.warning(
                "%s authentication refused: too many failures (key id %r, address %s); further "
                "refusals from there are logged at most once a minute",
                who,
                key,
                address,
            )
        raise TooManyFailures(
            f"too many failed authentications from this key or address; try again in "
            f"{math.ceil(wait)} s",
            retry_after=wait,
        )


class OncePerMinute:
    """Whether a subject's refusal is its first in a minute: a throttled flood writes one log
    line a minute, not one per request (the log is what the limits keep from filling)."""

    PERIOD = 60.0
    MAX_SUBJECTS = 10_000

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last: OrderedDict[str | None, float] = OrderedDict()

    def first(self, subject: str | None) -> bool:
        now = time.monotonic()
        with self._lock:
            last = self._last.get(subject)
            if last is not None and now - last < self.PERIOD:
                return False
            self._last[subject] = now
            self._last.move_to_end(subject)
            while len(self._last) > self.MAX_SUBJECTS:
                self._last.popitem(last=False)
            return True


@dataclass(frozen=True)
class SignedRequest:
    """A request as its signature covers it (`safeaccess.client.httpsig`), with the address it
    came from (None when unknown): what both roles' authentication reads."""

    method: str
    path: str
    query: str
    headers: Mapping[str, str]
    body: bytes
    address: str | None = None


Role = Literal["researcher", "auditor"]
#: The prefix of a role's key ids in the failure limiter and the nonce table: researchers keep
#: the bare names they always had, auditors get a namespace of their own.
_PREFIX: dict[Role, str] = {"researcher": "", "auditor": "auditor:"}


class Authenticator:
    """Verifies signed requests of one role (`kind`) against that role's registered keys.

    Keys are cached by name and re-read when the stored fingerprint changes (a key rotated by
    the admin CLI takes effect on the next request). `limiter` counts failures; it is shared by
    both roles, so that one limit covers a client trying either."""

    def __init__(self, kind: Role, store: Database, config: ServerConfig, limiter: FailureLimiter):
        if kind not in _PREFIX:
            raise ValueError(f"unknown role {kind!r}: give 'researcher' or 'auditor'")
        self.kind: Role = kind
        self.store = store
        self.config = config
        self.limiter = limiter
        self._prefix = _PREFIX[kind]
        self._keys: dict[str, tuple[str, Ed25519PublicKey]] = {}
        self._refusals_logged = OncePerMinute()

    def key(self, name: str) -> Ed25519PublicKey | None:
        """The registered public key of `name` in this role, or None if there is none."""
        row = (
            catalogue.get_researcher(self.store, name)
            if self.kind == "researcher"
            else catalogue.get_auditor(self.store, name)
        )
        return None if row is None else self._loaded(name, row.public_key, row.fingerprint)

    def _loaded(self, name: str, public_key: str, fingerprint: str) -> Ed25519PublicKey:
        """The key registered as (`public_key`, `fingerprint`), parsed once per fingerprint."""
        cached = self._keys.get(name)
        if cached is not None and cached[0] == fingerprint:
            return cached[1]
        key = load_public_key(public_key.encode("ascii"))
        self._keys[name] = (fingerprint, key)
        return key

    def _rate_and_key(
        self, claimed: str | None, address: str | None, named: str | None
    ) -> tuple[float | None, Callable[[str], Ed25519PublicKey | None]]:
        """How long the key id or address must wait (None: within its limits), and the key
        lookup for the signature's check. With the database's limiter and both subjects known,
        the claimed name's key is read in the limits' statement (one read, not two, before
        every signed request)."""
        both = getattr(self.limiter, "retry_after_and_key", None)
        if both is None or claimed is None or address is None or named is None:
            return self.limiter.retry_after(claimed, address), self.key
        wait, registered = both(claimed, address, self.kind, named)

        def key(name: str) -> Ed25519PublicKey | None:
            if name != named:
                return self.key(name)
            return None if registered is None else self._loaded(name, *registered)

        return wait, key

    def _remember_nonce(self, keyid: str, nonce: str, expires: int) -> bool:
        return catalogue.remember_nonce(self.store, self._prefix + keyid, nonce, expires)

    def authenticate(self, request: SignedRequest) -> str:
        """The name that signed this request, or raise Unauthenticated (TooManyFailures when
        the request fails and its key id or address is past its limit of failures)."""
        return self.authenticate_key(request)[0]

    def authenticate_key(self, request: SignedRequest) -> tuple[str, Ed25519PublicKey]:
        """`authenticate`, with the registered key the request's signature was checked
        against: the request's later checks (a sequence header's signature) use that key
        instead of reading it again."""
        resolved: list[Ed25519PublicKey] = []
        named = claimed_keyid(request.headers)
        claimed = None if named is None else self._prefix + named
        address = request.address
        # Read before the signature is checked (with the key, in one statement), applied only
        # if the check fails: a valid request is served whatever the limits say.
        wait, lookup = self._rate_and_key(claimed, address, named)

        def resolve(name: str) -> Ed25519PublicKey | None:
            key = lookup(name)
            if key is not None:
                resolved.append(key)
            return key

        try:
            params = verify_request(
                request.method,
                request.path,
                request.query,
                request.headers,
                request.body,
                resolve_key=resolve,
                remember_nonce=self._remember_nonce,
                max_skew=self.config.clock_skew_seconds,
                server=self.config.server_id,
            )
        except SignatureError as exc:
            # Past a limit, the failure is refused and not counted again: a flood keeps its
            # subject throttled without a write per request, and is free again once the
            # failures that put it at the limit have left the window.
            refuse_past_limit(wait, claimed, address, self.kind, self._refusals_logged)
            # One answer for every cause: a distinct "unknown key" would tell who is registered.
            # The true cause goes to the server log for the administrators.
            log.info(
                "%sauthentication failed (%s) for key id %r from %s: %s",
                "" if self.kind == "researcher" else f"{self.kind} ",
                exc.code,
                named,
                address,
                exc,
            )
            self.limiter.failed(claimed, address)
            raise Unauthenticated(AUTHENTICATION_FAILED) from exc
        return params.keyid, resolved[-1]
