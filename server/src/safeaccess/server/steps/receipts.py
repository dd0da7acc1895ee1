"""Signed step receipts: the centre's Ed25519 statement of what it decided for a step.

A receipt binds the server id, the sequence (by the SHA-256 of its signed header), the step index,
its final state, the hashes of the revealed trace and body, the rule set's hash, the index of the
audit-log entry that records the outcome, and for a released output its salted commitment in the
log (for a withheld output too, which the log commits to) together with, for a release only,
the opening (the salt): with it the researcher, and only she or whoever she
shows it to, can check that the log commits to exactly the output she received. The researcher can check it against her own sealed sequence and the output
she received (`safeaccess.client.results.verify_receipt`), and keep it as evidence; an auditor can
check it with the centre's public key alone.
"""

from __future__ import annotations

import base64
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from safeaccess.client.protocol import canonical
from safeaccess.server.audit.commitments import commitment as output_commitment
from safeaccess.server.states import StepState
from safeaccess.server.store.schema import SequenceRow, StepRow

RECEIPT_PROTOCOL = "safeaccess-receipt"
RECEIPT_VERSION = 2
FINAL_STEP_STATES = frozenset({StepState.RELEASED, StepState.WITHHELD, StepState.FAILED})


def receipt_fields(server_id: str, seq: SequenceRow, step: StepRow) -> dict[str, Any]:
    """The signed statement for a step in a final state."""
    released = step.state == StepState.RELEASED
    # The same commitment as the log's outcome entry, whatever the state (a withheld output is
    # committed to as well, so the receipt proves the withhold); the opening only for a release.
    commitment = (
        output_commitment(step.output_salt, step.public_output)
        if step.output_salt is not None
        else None
    )
    opening = step.output_salt if released and commitment is not None else None
    return {
        "protocol": RECEIPT_PROTOCOL,
        "version": RECEIPT_VERSION,
        "server": server_id,
        "sequence": seq.id,
        "header_sha256": seq.header_hash,
        "step": step.index,
        "last": step.last,
        "state": step.state,
        "trace_sha256": step.trace_hash,
        "body_sha256": step.body_hash,
        "output_commitment": commitment,
        "output_opening": opening.hex() if opening is not None else None,
        "ruleset_sha256": step.ruleset_hash,
        "log_index": step.log_index,
    }


def sign_receipt(
    key: Ed25519PrivateKey, server_id: str, seq: SequenceRow, step: StepRow
) -> dict[str, Any] | None:
    """{"fields", "signature"} for a step in a final state; None while it can still change."""
    if StepState(step.state) not in FINAL_STEP_STATES:
        return None
    fields = receipt_fields(server_id, seq, step)
    signature = key.sign(canonical.dumps(fields))
    return {"fields": fields, "signature": base64.b64encode(signature).decode("ascii")}
