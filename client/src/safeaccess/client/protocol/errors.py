"""Typed failures of the binding-sequence protocol.

Every failure is a `ProtocolError`; each kind has its own subclass so that a server can map it to
a precise API error and an auditor can say exactly what went wrong. Messages name the step and
the check that failed, so a researcher (or operator) knows what to fix.
"""

from __future__ import annotations


class ProtocolError(Exception):
    """Base class of every binding-sequence protocol failure."""


class MalformedError(ProtocolError):
    """Bytes or a file that do not have the documented shape (bad JSON, wrong length, bad field)."""


class InvalidSequenceError(MalformedError):
    """Arguments given to `seal` that cannot form a sequence (no steps, bad locator, bad expiry)."""


class UnsupportedProtocolError(ProtocolError):
    """A header or instruction word of an unknown protocol id or version."""


class SignatureError(ProtocolError):
    """The researcher's Ed25519 signature over the header does not verify with her public key."""


class EndorsementError(ProtocolError):
    """A certification-authority endorsement that does not verify."""


class UntrustedCAError(EndorsementError):
    """An endorsement by a certification authority that this verifier does not trust."""


class ValidityError(ProtocolError):
    """The sequence is used outside its validity period."""


class ExpiredError(ValidityError):
    """The header's `expires` time has passed."""


class NotYetValidError(ValidityError):
    """The header's `created` time lies in the future (beyond the allowed clock skew)."""


class WrongServerError(ProtocolError):
    """The header binds the sequence to a different server."""


class TamperedTraceError(ProtocolError):
    """A trace does not decode to a valid instruction word: altered, substituted or out of place."""


class IndexMismatchError(ProtocolError):
    """A valid instruction word whose index is not the step being revealed."""


class BodyDigestError(ProtocolError):
    """An instruction body whose SHA-256 does not match the digest bound in its word."""


class OutOfOrderError(ProtocolError):
    """A reveal for a step other than the next one expected."""


class SequenceFinishedError(ProtocolError):
    """A reveal after the last step of the sequence was already verified."""


class SequenceFailedError(ProtocolError):
    """A reveal after an earlier verification failure aborted the sequence."""


class IncompleteSequenceError(ProtocolError):
    """A whole sequence whose steps end before the last step (truncation)."""
