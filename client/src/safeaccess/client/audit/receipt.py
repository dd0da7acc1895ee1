"""A researcher checks her own release against the centre's audit log.

From her receipt (signed by the centre: the commitment, its opening and the log index) and the
output she received, she checks that the log's entry at that index is included in a signed
checkpoint, records exactly her sequence, step and outcome, and commits to exactly her output;
and that the output the centre serves for that step today still opens the same commitment.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from safeaccess.client.audit.checkpoint import CheckpointError, verify_checkpoint
from safeaccess.client.audit.merkle import ProofError, leaf_hash, verify_inclusion
from safeaccess.client.audit.records import RecordError, decode_record, opens
from safeaccess.client.audit.verify import AuditFailure
from safeaccess.client.protocol import canonical

# The log entries that close a step without a release.
WITHHOLD_KINDS = frozenset({"step_withheld", "step_failed", "review_rejected"})


@dataclass(frozen=True)
class ReceiptCheck:
    entry: int
    size: int
    state: str
    output_checked: bool


def check_receipt(
    receipt: dict[str, Any],
    output: Any,
    proof: dict[str, Any],
    server_key: Ed25519PublicKey,
    server_id: str,
    served_output: Any = None,
) -> ReceiptCheck:
    """Raise AuditFailure unless the receipt, the log entry and the outputs agree."""
    fields = receipt.get("fields")
    if not isinstance(fields, dict):
        raise AuditFailure("the file holds no receipt (no 'fields')")
    try:
        server_key.verify(base64.b64decode(str(receipt.get("signature"))), canonical.dumps(fields))
    except (InvalidSignature, binascii.Error, ValueError) as exc:
        raise AuditFailure("the receipt is not signed by the centre's key") from exc
    index = fields.get("log_index")
    if not isinstance(index, int) or index != proof.get("index"):
        raise AuditFailure("the receipt's log index is not the entry the server points to")
    try:
        checkpoint = verify_checkpoint(str(proof["checkpoint"]), server_id, server_key)
        raw = base64.b64decode(str(proof["record"]))
        path = [base64.b64decode(p) for p in proof["proof"]]
        verify_inclusion(index, checkpoint.size, leaf_hash(raw), path, checkpoint.root)
        record = decode_record(raw)
    except (CheckpointError, ProofError, RecordError, KeyError, binascii.Error) as exc:
        raise AuditFailure(f"the log entry does not verify: {exc}", index) from exc
    wanted = {
        "sequence": fields.get("sequence"),
        "step": fields.get("step"),
        "index": index,
    }
    got = {"sequence": record.sequence, "step": record.step, "index": record.index}
    if wanted != got:
        raise AuditFailure(f"the entry records {got}, not the receipt's {wanted}", index)
    state = fields.get("state")
    if state == "released" and record.kind not in ("step_released", "review_approved"):
        raise AuditFailure(f"the receipt says released but the log says {record.kind}", index)
    if state in ("withheld", "failed") and record.kind not in WITHHOLD_KINDS:
        raise AuditFailure(f"the receipt says {state} but the log says {record.kind}", index)
    commitment = record.data.get("output_commitment")
    if commitment != fields.get("output_commitment"):
        raise AuditFailure("the log commits to another output than the receipt", index)
    checked = False
    if state == "released":
        try:
            salt = bytes.fromhex(str(fields.get("output_opening")))
        except ValueError as exc:
            raise AuditFailure("the receipt's opening is not hex") from exc
        if output is not None:
            if not opens(str(commitment), salt, output):
                raise AuditFailure("your output does not open the logged commitment", index)
            checked = True
        if served_output is not None and not opens(str(commitment), salt, served_output):
            raise AuditFailure(
                "the output the centre serves for this step today differs from the one the log "
                "committed to (it was swapped)",
                index,
            )
    return ReceiptCheck(entry=index, size=checkpoint.size, state=str(state), output_checked=checked)
