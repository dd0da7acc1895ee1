"""What researchers' and auditors' authentication share: the one failure message, and the
refusal of a key id or address past its limit of failures.

Both `service.py` (researchers) and `audit_service.py` (auditors) import it, so the auditors'
side no longer reaches back into `Service` for them (that was an import cycle). The rest of the
authentication merge (server-layout note, "Merges") lands here later.
"""

from __future__ import annotations

import logging
import math

from safeaccess.server.ratelimit import FailureLimiter, TooManyFailures

log = logging.getLogger("safeaccess.server")

AUTHENTICATION_FAILED = (
    "the request could not be authenticated: sign it with the key registered for your researcher "
    "name, for this server, with the current time and a fresh nonce (the safeaccess client does "
    "this; check your researcher name, key file and clock)"
)


def check_rate(limiter: FailureLimiter, key: str | None, address: str | None, who: str) -> None:
    """Refuse (429) a key id or client address past its limit of authentication failures,
    before its signature is checked."""
    wait = limiter.retry_after(key, address)
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
