"""Request authentication for researchers and auditors: one `Authenticator` per role.

Both roles sign requests the same way (`safeaccess.client.httpsig`) with keys held in their own
tables, so one class does both: the role decides the key table, the namespace of key ids in the
failure limiter and of nonces (an auditor may share a name with a researcher), and the word in
the server log. Every failure gets the one `AUTHENTICATION_FAILED` answer, whatever its cause,
so that the answer does not tell who is registered.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Literal

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from safeaccess.client.httpsig import SignatureError, verify_request
from safeaccess.client.keys import load_public_key
from safeaccess.server.errors import Unauthenticated
from safeaccess.server.ratelimit import FailureLimiter, TooManyFailures, claimed_keyid

if TYPE_CHECKING:
    from safeaccess.server.config import ServerConfig
    from safeaccess.server.store import Store

log = logging.getLogger("safeaccess.server")

AUTHENTICATION_FAILED = (
    "the request could not be authenticated: sign it with the key registered for your researcher "
    "name, for this server, with the current time and a fresh nonce (the safeaccess client does "
    "this; check your researcher name, key file and clock)"
)


def check_rate(limiter: FailureLimiter, key: str | None, address: str | None, who: str) -> None:
    """Refuse (429) a key id or client address past its limit of authentication failures,
    before its signature is checked."""
    refuse_past_limit(limiter.retry_after(key, address), key, address, who)


def refuse_past_limit(wait: float | None, key: str | None, address: str | None, who: str) -> None:
    """Refuse (429) when the limiter said to `wait` (None: within the limits)."""
    if wait is not None:
        log.warning(
            "%s authentication refused: too many failures (key id %r, address %s)",
            who,
            key,
            address,
        )
        raise TooManyFailures(
            f"too many failed authentications from this key or address; try again in "
            f"{math.ceil(wait)} s",
            retry_after=wait,
        )


Role = Literal["researcher", "auditor"]
#: The prefix of a role's key ids in the failure limiter and the nonce table: researchers keep
#: the bare names they always had, auditors get a namespace of their own.
_PREFIX: dict[Role, str] = {"researcher": "", "auditor": "auditor:"}


class Authenticator:
    """Verifies signed requests of one role (`kind`) against that role's registered keys.

    Keys are cached by name and re-read when the stored fingerprint changes (a key rotated by
    the admin CLI takes effect on the next request). `limiter` counts failures; it is shared by
    both roles, so that one limit covers a client trying either."""

    def __init__(self, kind: Role, store: Store, config: ServerConfig, limiter: FailureLimiter):
        if kind not in _PREFIX:
            raise ValueError(f"unknown role {kind!r}: give 'researcher' or 'auditor'")
        self.kind: Role = kind
        self.store = store
        self.config = config
        self.limiter = limiter
        self._prefix = _PREFIX[kind]
        self._keys: dict[str, tuple[str, Ed25519PublicKey]] = {}

    def key(self, name: str) -> Ed25519PublicKey | None:
        """The registered public key of `name` in this role, or None if there is none."""
        row = (
            self.store.get_researcher(name)
            if self.kind == "researcher"
            else self.store.get_auditor(name)
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
    ) -> Callable[[str], Ed25519PublicKey | None]:
        """Refuse (429) a key id or address past its limit; the key lookup for the signature's
        check. With the database's limiter and both subjects known, the claimed name's key is
        read in the limits' statement (one read, not two, before every signed request)."""
        both = getattr(self.limiter, "retry_after_and_key", None)
        if both is None or claimed is None or address is None or named is None:
            self.check_rate(claimed, address)
            return self.key
        wait, registered = both(claimed, address, self.kind, named)
        refuse_past_limit(wait, claimed, address, self.kind)

        def key(name: str) -> Ed25519PublicKey | None:
            if name != named:
                return self.key(name)
            return None if registered is None else self._loaded(name, *registered)

        return key

    def check_rate(self, key: str | None, address: str | None) -> None:
        """Refuse (429) a key id (already namespaced) or address past its limit of failures."""
        check_rate(self.limiter, key, address, self.kind)

    def _remember_nonce(self, keyid: str, nonce: str, expires: int) -> bool:
        return self.store.remember_nonce(self._prefix + keyid, nonce, expires)

    def authenticate(
        self,
        method: str,
        path: str,
        query: str,
        headers: Mapping[str, str],
        body: bytes,
        address: str | None = None,
    ) -> str:
        """The name that signed this request, or raise Unauthenticated (TooManyFailures past
        the rate limit of failures per key id and per address)."""
        return self.authenticate_key(method, path, query, headers, body, address)[0]

    def authenticate_key(
        self,
        method: str,
        path: str,
        query: str,
        headers: Mapping[str, str],
        body: bytes,
        address: str | None = None,
    ) -> tuple[str, Ed25519PublicKey]:
        """`authenticate`, with the registered key the request's signature was checked
        against: the request's later checks (a sequence header's signature) use that key
        instead of reading it again."""
        resolved: list[Ed25519PublicKey] = []
        named = claimed_keyid(headers)
        claimed = None if named is None else self._prefix + named
        lookup = self._rate_and_key(claimed, address, named)

        def resolve(name: str) -> Ed25519PublicKey | None:
            key = lookup(name)
            if key is not None:
                resolved.append(key)
            return key

        try:
            params = verify_request(
                method,
                path,
                query,
                headers,
                body,
                resolve_key=resolve,
                remember_nonce=self._remember_nonce,
                max_skew=self.config.clock_skew_seconds,
                server=self.config.server_id,
            )
        except SignatureError as exc:
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
