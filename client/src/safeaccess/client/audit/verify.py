"""The whole-log verifier behind `safeaccess audit verify`.

Given a log source (a server, through the auditor endpoints, or an export file) it checks, in
this order, and stops at the first bad entry:

1. the checkpoint's signature with the centre's key, and its origin;
2. consistency with a previously trusted checkpoint (a rewritten or truncated history fails);
3. every entry: present, in place (its own index), canonical, and included in the checkpoint's
   tree (the recomputed RFC 9162 root must equal the signed root; if not, each entry's inclusion
   proof or stored leaf hash names the first entry that does not fit);
4. every sequence, replayed from the log: the header's signature with the researcher's logged
   key, endorsements with the logged CA keys, the hash chain of traces step by step (the
   protocol's own word decoding), tit-for-tat order (step j + 1 revealed only after step j was
   released; nothing after a withhold, a failure or the last step);
5. every decision: its rule set was logged, its verdict is what its findings combine to, and the
   rules re-evaluated from the logged facts would not have withheld a released output.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from safeaccess.client.audit import decisions
from safeaccess.client.audit.checkpoint import Checkpoint, CheckpointError, verify_checkpoint
from safeaccess.client.audit.merkle import (
    EMPTY_ROOT,
    Frontier,
    ProofError,
    leaf_hash,
    verify_consistency,
    verify_inclusion,
)
from safeaccess.client.audit.records import LogRecord, RecordError, decode_record
from safeaccess.client.keyrotation import rotation_signed_by
from safeaccess.client.keys import KeyFileError, fingerprint, load_public_key
from safeaccess.client.protocol import Endorsement, ProtocolError, SequenceVerifier
from safeaccess.client.protocol.words import verify_logged_step

EXPORT_FORMAT = "safeaccess-audit-export"


def log_origin(server_id: str) -> str:
    return f"safeaccess/{server_id}/audit"


class AuditFailure(Exception):
    """The log failed a check; `entry` names the first bad entry (None: the checkpoint)."""

    def __init__(self, message: str, entry: int | None = None):
        where = f"entry {entry}: " if entry is not None else ""
        super().__init__(where + message)
        self.entry = entry


class LogSource(Protocol):
    server_id: str
    server_key: Ed25519PublicKey
    checkpoint_note: str

    def entries(self, size: int) -> Iterator[tuple[int, bytes, bytes | None]]:
        """(index, record, stored leaf hash or None) for entries 0..size-1, as served."""

    def inclusion(self, index: int, size: int) -> list[bytes] | None:
        """The server's inclusion proof, or None when the source cannot give one."""

    def consistency(self, size1: int, size2: int) -> list[bytes] | None:
        """The server's consistency proof, or None when the source cannot give one."""


def _b64(value: str) -> bytes:
    return base64.b64decode(value, validate=True)


@dataclass
class ExportSource:
    """An export file: a JSON header line, then `<index> <leaf hash b64> <record>` lines."""

    path: Any
    server_id: str = ""
    server_key: Ed25519PublicKey = field(init=False)
    checkpoint_note: str = ""

    def __post_init__(self) -> None:
        with open(self.path, "rb") as handle:
            first = handle.readline()
        try:
            header = json.loads(first)
            if header.get("format") != EXPORT_FORMAT:
                raise ValueError("format")
            self.server_id = str(header["server_id"])
            self.server_key = Ed25519PublicKey.from_public_bytes(_b64(header["server_public_key"]))
            self.checkpoint_note = str(header["checkpoint"])
        except (ValueError, KeyError, TypeError, binascii.Error) as exc:
            raise AuditFailure(f"{self.path} is not a safeaccess audit export") from exc

    def entries(self, size: int) -> Iterator[tuple[int, bytes, bytes | None]]:
        with open(self.path, "rb") as handle:
            handle.readline()
            for position, line in enumerate(handle):
                try:
                    index, leaf, record = line.rstrip(b"\n").split(b" ", 2)
                    parsed = int(index), record, _b64(leaf.decode("ascii"))
                except (ValueError, binascii.Error) as exc:
                    raise AuditFailure(
                        "the export line is not `<index> <leaf hash> <record>`", position
                    ) from exc
                yield parsed

    def inclusion(self, index: int, size: int) -> list[bytes] | None:
        return None

    def consistency(self, size1: int, size2: int) -> list[bytes] | None:
        return None


@dataclass
class Report:
    """What was checked, for a person to read."""

    size: int = 0
    root: str = ""
    sequences: int = 0
    steps_released: int = 0
    steps_withheld: int = 0
    decisions: int = 0
    kinds: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    checkpoint: str = ""

    def lines(self) -> list[str]:
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(self.kinds.items()))
        return [
            f"checkpoint: {self.size} entries, root {self.root} (signature verified)",
            f"entries: all {self.size} present, in order, canonical and included ({kinds})",
            f"sequences: {self.sequences} replayed (signatures, hash chains, tit-for-tat order)",
            f"decisions: {self.decisions} re-derived from logged facts and rule sets; "
            f"{self.steps_released} released, {self.steps_withheld} withheld",
            *self.notes,
        ]


@dataclass(slots=True)
class _Sequence:
    """The replay's state of one sequence that may still take records."""

    researcher: str
    previous_trace: bytes
    next_index: int = 1
    state: str = "open"  # open | running | review | released | closed
    step: int = 0
    last: bool = False
    verdict: str | None = None
    pending_problems: list[str] = field(default_factory=list)
    dataset: str = ""
    first_approvers: list[str] = field(default_factory=list)
    # A script step: "queued" when revealed (no verdict yet), then "ran" or "failed".
    script: str | None = None
    granted: frozenset[str] = frozenset()  # the claims (policies) of its verified endorsements
    signed_with: bytes = b""  # the raw public key that verified its header, at its opening
    # kind -> claims the dataset required when the current step was revealed
    required: dict[str, frozenset[str]] = field(default_factory=dict)


class _Replay:
    """Replays sequences and decisions record by record."""

    def __init__(self, report: Report, server_id: str | None = None):
        self.report = report
        # Only sequences that may still take a record keep their state; a closed one keeps
        # (researcher, step, last), enough to refuse and name a record that comes after it.
        self.closed: dict[str, tuple[str, int, bool]] = {}
        self.with_sequences: set[str] = set()  # researchers with a sequence on record
        self.researcher_keys: dict[str, Ed25519PublicKey] = {}  # her key now, in the replay
        self.cas: dict[str, Ed25519PublicKey] = {}
        # The centre's id, from the signed checkpoint's origin when the replay has a source: a
        # key rotation logged before the first `configuration` entry (registrations come before
        # the first `serve`) is checked against it, as the server checked it.
        self.server_id: str | None = server_id
        self.rulesets: dict[str, dict[str, Any]] = {}
        self.sequences: dict[str, _Sequence] = {}
        self.review_checkers: dict[str, int] = {}  # dataset -> checkers a release needs
        self.checker_researcher: dict[str, str] = {}  # checker -> her researcher identity
        self.claims: dict[str, dict[str, set[str]]] = {}  # dataset -> kind -> required claims

    def feed(self, rec: LogRecord) -> None:
        handler: Callable[[LogRecord], None] | None = getattr(self, "_" + rec.kind, None)
        if handler is None and rec.kind.startswith("step_") and rec.kind != "step_revealed":
            handler = self._outcome
        if handler is not None:
            handler(rec)
        seq = self.sequences.get(rec.sequence or "")
        # A closed sequence takes no more records, except the run of a script a checker
        # rejected while it ran: keep it until then.
        if seq is not None and seq.state == "closed" and seq.script != "queued":
            del self.sequences[rec.sequence or ""]
            self.closed[rec.sequence or ""] = (seq.researcher, seq.step, seq.last)

    def _fail(self, rec: LogRecord, message: str) -> AuditFailure:
        return AuditFailure(f"{rec.kind}: {message}", rec.index)

    # -- administrative records -----------------------------------------------------------------

    def _configuration(self, rec: LogRecord) -> None:
        named = rec.data.get("server_id")
        if not isinstance(named, str) or not named:
            raise self._fail(rec, "the configuration names no server id")
        if self.server_id is not None and named != self.server_id:
            raise self._fail(
                rec,
                f"the configuration names server id {named!r}, but this is the log of "
                f"{self.server_id!r} (its signed checkpoint's origin)",
            )
        self.server_id = named
        try:
            self.cas = {
                name: Ed25519PublicKey.from_public_bytes(_b64(key))
                for name, key in rec.data.get("trusted_cas", {}).items()
            }
        except (ValueError, binascii.Error) as exc:
            raise self._fail(rec, "a trusted CA key is malformed") from exc

    def _researcher_added(self, rec: LogRecord) -> None:
        try:
            key = load_public_key(str(rec.data["public_key"]).encode("ascii"))
        except (KeyError, KeyFileError) as exc:
            raise self._fail(rec, "the researcher's public key is missing or malformed") from exc
        name = str(rec.data["researcher"])
        known = self.researcher_keys.get(name)
        # A registration never replaces a key: otherwise whoever can append to the log could
        # sign sequences in her name. Registering her again (projects added) keeps her key.
        if known is not None and known.public_bytes_raw() != key.public_bytes_raw():
            raise self._fail(
                rec,
                f"researcher {name!r} is registered again with another key (a registration "
                "never changes a researcher's key)",
            )
        self.researcher_keys[name] = key

    def _researcher_removed(self, rec: LogRecord) -> None:
        name = str(rec.data.get("researcher"))
        if name not in self.researcher_keys:
            raise self._fail(rec, f"researcher {name!r} was not registered before")
        # The server keeps the account of anyone with a sequence on record (her sequences are
        # checked against her key): a removal now, and a registration with another key after
        # it, would let sequences be signed in her name.
        if name in self.with_sequences:
            raise self._fail(
                rec, f"researcher {name!r} is removed although she has sequences on record"
            )
        del self.researcher_keys[name]
        self.report.notes.append(
            f"entry {rec.index}: researcher {name} was removed (she had no sequence); a later "
            "registration of the name is a new account"
        )

    def _key_change(self, rec: LogRecord) -> tuple[str, Ed25519PublicKey, Ed25519PublicKey]:
        """The researcher, her key until now and the new key of a rotation or revocation."""
        name = str(rec.data.get("researcher"))
        old = self.researcher_keys.get(name)
        if old is None:
            raise self._fail(rec, f"researcher {name!r} was not registered before")
        if rec.data.get("old_fingerprint") != fingerprint(old):
            raise self._fail(
                rec, f"it replaces a key of {name!r} that is not the one she holds in the log"
            )
        try:
            new = load_public_key(str(rec.data["public_key"]).encode("ascii"))
        except (KeyError, KeyFileError) as exc:
            raise self._fail(rec, "the new public key is missing or malformed") from exc
        if rec.data.get("fingerprint") != fingerprint(new):
            raise self._fail(rec, "the new key's logged fingerprint is not its fingerprint")
        return name, old, new

    def _researcher_key_rotated(self, rec: LogRecord) -> None:
        name, old, new = self._key_change(rec)
        if self.server_id is None or not rotation_signed_by(
            old,
            str(rec.data.get("signature")),
            self.server_id,
            name,
            fingerprint(old),
            str(rec.data["public_key"]),
        ):
            raise self._fail(
                rec,
                f"the rotation of the key of researcher {name!r} is not signed by her previous "
                "key (only she "
                "rotates her key; the centre can only revoke it, with a reason)",
            )
        self.researcher_keys[name] = new
        self.report.notes.append(
            f"entry {rec.index}: researcher {name} rotated her key (signed by the previous one)"
        )

    def _researcher_key_revoked(self, rec: LogRecord) -> None:
        name, _, new = self._key_change(rec)
        reason = rec.data.get("reason")
        if not isinstance(reason, str) or not reason.strip():
            raise self._fail(
                rec, f"the revocation of the key of researcher {name!r} gives no reason"
            )
        self.researcher_keys[name] = new
        # Not an error (a lost key is replaced this way) but the one act by which a centre could
        # sign in her name: every report shows it, and her client flags it to her.
        self.report.notes.append(
            f"entry {rec.index}: the centre REVOKED researcher {name}'s key and registered "
            f"another without her signature (reason: {reason})"
        )

    def _ruleset(self, rec: LogRecord) -> None:
        text = rec.data.get("contents")
        # The hash is the rules library's: SHA-256 of the sorted compact JSON of every
        # parameter, logged as that very text.
        if not isinstance(text, str):
            raise self._fail(rec, "the rule set's contents are missing")
        digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
        if digest != rec.data.get("sha256"):
            raise self._fail(rec, "the logged rule set does not hash to its logged hash")
        contents = json.loads(text)
        if not isinstance(contents, dict):
            raise self._fail(rec, "the rule set's contents are not a mapping")
        self.rulesets[digest] = contents

    def _review_settings(self, rec: LogRecord) -> None:
        count = rec.data.get("checkers")
        if count not in (1, 2) or not isinstance(rec.data.get("dataset"), str):
            raise self._fail(rec, "a review setting needs a dataset and 1 or 2 checkers")
        self.review_checkers[rec.data["dataset"]] = int(count)

    def _claim_required(self, rec: LogRecord) -> None:
        dataset, kind, claim = (str(rec.data.get(k)) for k in ("dataset", "kind", "claim"))
        self.claims.setdefault(dataset, {}).setdefault(kind, set()).add(claim)

    def _claim_dropped(self, rec: LogRecord) -> None:
        dataset, kind, claim = (str(rec.data.get(k)) for k in ("dataset", "kind", "claim"))
        self.claims.get(dataset, {}).get(kind, set()).discard(claim)

    def _required_now(self, dataset: str) -> dict[str, frozenset[str]]:
        return {k: frozenset(v) for k, v in self.claims.get(dataset, {}).items()}

    def _check_claims(self, rec: LogRecord, seq: _Sequence, kind: str, what: str) -> None:
        """The server refuses (and does not log) a step whose kind needs a claim that no
        verified endorsement of the sequence grants: a logged one is an inserted entry."""
        missing = sorted(seq.required.get(kind, frozenset()) - seq.granted)
        if missing:
            raise self._fail(
                rec,
                f"{what} of kind {kind!r} on dataset {seq.dataset!r}, which requires the "
                f"claim(s) {', '.join(missing)} that no endorsement of the sequence grants",
            )

    def _checker_added(self, rec: LogRecord) -> None:
        linked = rec.data.get("researcher")
        if isinstance(linked, str):
            self.checker_researcher[str(rec.data.get("checker"))] = linked

    # -- sequences ------------------------------------------------------------------------------

    def _seq(self, rec: LogRecord) -> _Sequence:
        seq = self.sequences.get(rec.sequence or "")
        if seq is None:
            closed = self.closed.get(rec.sequence or "")
            if closed is None:
                raise self._fail(rec, f"sequence {rec.sequence} was never opened in the log")
            # Every handler refuses a record for a closed sequence; this copy is never kept.
            researcher, step, last = closed
            return _Sequence(researcher, b"", state="closed", step=step, last=last)
        return seq

    def _sequence_opened(self, rec: LogRecord) -> None:
        if rec.sequence is None or rec.sequence in self.sequences or rec.sequence in self.closed:
            raise self._fail(rec, "a sequence id is missing or opened twice")
        key = self.researcher_keys.get(rec.actor)
        if key is None:
            raise self._fail(rec, f"researcher {rec.actor!r} was not registered before")
        try:
            header = _b64(rec.data["header"])
            signature = _b64(rec.data["signature"])
            endorsements = [Endorsement.model_validate(e) for e in rec.data["endorsements"]]
            verifier = SequenceVerifier(
                header,
                signature,
                key,
                endorsements,
                self.cas,
                at=datetime.fromisoformat(rec.time.replace("Z", "+00:00")),
                server=self.server_id,
            )
        except (KeyError, ValueError, binascii.Error, ProtocolError) as exc:
            raise self._fail(rec, f"the sequence header does not verify: {exc}") from exc
        if verifier.header.researcher != rec.actor:
            raise self._fail(rec, "the header names another researcher than the one logged")
        self.sequences[rec.sequence] = _Sequence(
            researcher=rec.actor,
            signed_with=key.public_bytes_raw(),
            previous_trace=verifier.header.t0,
            # Required claims and the two-checker setting are kept per dataset name, for all
            # its versions; a header that pins a version names `name@version`.
            dataset=verifier.header.dataset.partition("@")[0],
            granted=frozenset(
                policy
                for e in verifier.endorsements
                if isinstance(policy := e.claims.get("policy"), str)
            ),
        )
        self.with_sequences.add(rec.actor)
        seq = self.sequences[rec.sequence]
        seq.required = self._required_now(seq.dataset)
        for kind in verifier.header.kinds or ():
            self._check_claims(rec, seq, kind, "a sequence declaring analyses")
        self.report.sequences += 1

    def _step_revealed(self, rec: LogRecord) -> None:
        seq = self._seq(rec)
        j = rec.step or 0
        if seq.state not in ("open", "released"):
            raise self._fail(
                rec,
                f"step {j} was revealed while the sequence was {seq.state} (tit-for-tat: a step "
                "is revealed only after the previous one was released, never after a withhold)",
            )
        if j != seq.next_index:
            raise self._fail(rec, f"step {j} was revealed but step {seq.next_index} was next")
        if self.researcher_keys[seq.researcher].public_bytes_raw() != seq.signed_with:
            # The server checks the sequence's signature against her key at each reveal.
            raise self._fail(
                rec,
                f"step {j} was revealed after the key of {seq.researcher!r} that signed its "
                "sequence was replaced (steps are valid only under the key of their time)",
            )
        try:
            trace = bytes.fromhex(str(rec.data["trace"]))
            digest = bytes.fromhex(str(rec.data["body_sha256"]))
            last = verify_logged_step(seq.previous_trace, j, trace, digest)
        except (KeyError, ValueError) as exc:
            raise self._fail(rec, "the trace or body digest is missing or malformed") from exc
        except ProtocolError as exc:
            raise self._fail(rec, f"the hash chain breaks: {exc}") from exc
        if last != bool(rec.data.get("last")):
            raise self._fail(rec, "the logged 'last' flag contradicts the hash chain")
        seq.previous_trace, seq.next_index, seq.step, seq.last = trace, j + 1, j, last
        seq.state = "running"
        seq.required = self._required_now(seq.dataset)
        seq.verdict = None
        seq.first_approvers = []
        seq.script = None

    def _running(self, rec: LogRecord) -> _Sequence:
        seq = self._seq(rec)
        if seq.state != "running" or rec.step != seq.step:
            raise self._fail(
                rec, f"step {rec.step} ran while the sequence was {seq.state} at step {seq.step}"
            )
        return seq

    def _run_started(self, rec: LogRecord) -> None:
        self._running(rec)

    def _run_finished(self, rec: LogRecord) -> None:
        self._running(rec)

    def _checks(self, rec: LogRecord) -> None:
        seq = self._running(rec)
        data = rec.data
        verdict = data.get("verdict")
        findings = data.get("findings") or []
        seq.verdict = verdict
        seq.pending_problems = []
        kind = "script" if data.get("script_run") == "queued" else data.get("kind")
        if isinstance(kind, str):
            self._check_claims(rec, seq, kind, f"step {rec.step} ran an analysis")
        if data.get("script_run") == "queued":
            # A script is sent to review before it runs; its verdict comes with its run.
            seq.script = "queued"
            return
        if verdict is None:
            return  # the analysis failed before any check ran
        self.report.decisions += 1
        rules = self.rulesets.get(str(data.get("ruleset_sha256")))
        if rules is None:
            raise self._fail(rec, f"rule set {data.get('ruleset_sha256')} was never logged")
        combined = decisions.combine([str(f.get("verdict")) for f in findings])
        if combined != verdict:
            raise self._fail(
                rec, f"the verdict {verdict!r} is not what its findings combine to ({combined!r})"
            )
        seq.pending_problems = decisions.fact_problems(data.get("facts"), rules)
        seq.pending_problems += decisions.feature_withholds(data)

    def _outcome(self, rec: LogRecord) -> None:
        seq = self._running(rec)
        state = rec.kind.removeprefix("step_")
        if state == "released":
            if seq.verdict != "release":
                raise self._fail(rec, f"released although the rules' verdict was {seq.verdict!r}")
            self._released(rec, seq)
        elif state == "review":
            if seq.script == "queued" and seq.verdict is None:
                seq.state = "review"
            elif seq.verdict != "review":
                raise self._fail(rec, f"sent to review although the verdict was {seq.verdict!r}")
            seq.state = "review"
        elif state in ("withheld", "failed"):
            seq.state = "closed"
            self.report.steps_withheld += 1
        else:
            raise self._fail(rec, f"unknown step outcome {state!r}")

    def _released(self, rec: LogRecord, seq: _Sequence) -> None:
        if seq.pending_problems:
            raise self._fail(
                rec,
                "released, but the logged rules withhold it: " + "; ".join(seq.pending_problems),
            )
        if not rec.data.get("output_commitment"):
            raise self._fail(rec, "a release without a commitment to its output")
        seq.state = "closed" if seq.last else "released"
        self.report.steps_released += 1

    def _script_run_finished(self, rec: LogRecord) -> None:
        seq = self._seq(rec)
        # "closed": a checker may reject a queued script while it runs; its run is still logged.
        if seq.script != "queued" or seq.state not in ("review", "closed") or rec.step != seq.step:
            raise self._fail(
                rec, f"a script run for step {rec.step}, which no queued script awaits"
            )
        run = rec.data.get("script_run")
        failed = not isinstance(run, dict) or run.get("error_code") or run.get("result") == "failed"
        seq.script = "failed" if failed else "ran"
        seq.verdict = rec.data.get("verdict")

    def _in_review_by_other(self, rec: LogRecord) -> _Sequence:
        """The sequence of a checker's record: its step is in review, and the checker is not
        the researcher (by name or by the researcher identity her checker account holds)."""
        seq = self._seq(rec)
        if seq.state != "review" or rec.step != seq.step:
            raise self._fail(rec, f"a review decision for step {rec.step}, which is not in review")
        if seq.researcher in (rec.actor, self.checker_researcher.get(rec.actor)):
            raise self._fail(rec, f"{rec.actor} reviewed the output of her own sequence")
        return seq

    def _review_first_approval(self, rec: LogRecord) -> None:
        seq = self._in_review_by_other(rec)
        if rec.actor in seq.first_approvers:
            raise self._fail(rec, f"{rec.actor} approved the same step twice")
        seq.first_approvers.append(rec.actor)

    def _review_approved(self, rec: LogRecord) -> None:
        seq = self._in_review_by_other(rec)
        if rec.actor in seq.first_approvers:
            raise self._fail(rec, f"{rec.actor} gave both approvals of a two-person release")
        if seq.script is not None and seq.script != "ran":
            raise self._fail(rec, f"approved a script that {seq.script} (nothing to release)")
        needed = self.review_checkers.get(seq.dataset, 1)
        if len(seq.first_approvers) + 1 < needed:
            raise self._fail(
                rec,
                f"released by {len(seq.first_approvers) + 1} checker(s); dataset "
                f"{seq.dataset} needs {needed} different checkers",
            )
        seq.pending_problems = [p for p in seq.pending_problems if "decided withhold" not in p]
        self._released(rec, seq)

    def _review_rejected(self, rec: LogRecord) -> None:
        seq = self._in_review_by_other(rec)
        seq.state = "closed"
        self.report.steps_withheld += 1


def _trusted(path: Path, source: LogSource) -> tuple[Checkpoint, ExportSource | None]:
    """A trusted checkpoint (a signed note) or an earlier export (its checkpoint; its records,
    read again only if the log turns out inconsistent, name the first rewritten entry)."""
    old_export: ExportSource | None = None
    with open(path, "rb") as handle:
        start = handle.read(1)
    if start == b"{":
        old_export = ExportSource(path)
        note = old_export.checkpoint_note
    else:
        note = path.read_text(encoding="utf-8")
    try:
        checkpoint = verify_checkpoint(note, source.server_id, source.server_key)
    except CheckpointError as exc:
        raise AuditFailure(f"the trusted checkpoint: {exc}") from exc
    return checkpoint, old_export


def verify_log(
    source: LogSource,
    *,
    trusted: Path | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> Report:
    """Run every check; raises AuditFailure naming the first bad entry.

    The entries are streamed: each is checked, hashed into the tree's right edge (`Frontier`)
    and replayed as it arrives, and then dropped, so memory stays flat in the log's size (the
    replay keeps the state of open sequences and a few bytes per closed one). A replay failure
    is held until the tree is checked: an entry that is not in the signed tree is named as such
    first, exactly as when the checks ran one after the other. Naming an entry that breaks the
    tree, or the first entry that differs from a trusted export, reads the log a second time."""
    report = Report()
    try:
        checkpoint = verify_checkpoint(source.checkpoint_note, source.server_id, source.server_key)
    except CheckpointError as exc:
        raise AuditFailure(f"checkpoint: {exc}") from exc
    if checkpoint.origin != log_origin(source.server_id):
        raise AuditFailure(f"checkpoint: origin {checkpoint.origin!r} is not this centre's log")
    size = checkpoint.size
    report.size, report.root = size, checkpoint.root.hex()
    report.checkpoint = source.checkpoint_note
    old, old_export = _trusted(trusted, source) if trusted is not None else (None, None)
    prefix_root = EMPTY_ROOT if old is not None and old.size == 0 else None

    # 3. entries: all there, in place, canonical, hashed into the tree; 4, 5. replayed.
    frontier = Frontier()
    replay = _Replay(report, source.server_id)
    held: AuditFailure | None = None
    expected = 0
    for index, raw, stored_leaf in source.entries(size):
        if index != expected:
            raise AuditFailure(
                "missing from the log" if index > expected else "appears twice or out of order",
                expected if index > expected else index,
            )
        try:
            rec = decode_record(raw)
        except RecordError as exc:
            raise AuditFailure(str(exc), index) from exc
        if 0 <= rec.index < index:
            # The records from here on sit later than they say: entries were inserted before.
            raise AuditFailure(
                f"inserted: entry {index} holds the record of entry {rec.index}, so "
                f"{index - rec.index} entr{'y was' if index - rec.index == 1 else 'ies were'} "
                f"inserted from entry {rec.index} on and the entries after moved down",
                rec.index,
            )
        if rec.index != index:
            raise AuditFailure(f"the record says it is entry {rec.index}: rows were moved", index)
        leaf = leaf_hash(raw)
        if stored_leaf is not None and stored_leaf != leaf:
            raise AuditFailure("the record does not match the leaf hash in the tree: edited", index)
        frontier.append(leaf)
        expected += 1
        if old is not None and expected == old.size:
            prefix_root = frontier.root()
        if held is None:
            try:
                replay.feed(rec)
            except AuditFailure as exc:
                held = exc
            report.kinds[rec.kind] = report.kinds.get(rec.kind, 0) + 1
        if progress is not None and expected % 10_000 == 0:
            progress(expected, size)
    if expected != size:
        raise AuditFailure(
            f"missing from the log: the checkpoint covers {size} entries but only {expected} "
            "were served",
            expected,
        )
    if frontier.root() != checkpoint.root:
        _name_bad_entry(source, checkpoint)

    # 2. consistency with the trusted checkpoint.
    if old is not None:
        _check_trusted(old, old_export, prefix_root, source, checkpoint, report)
    if held is not None:
        raise held
    return report


def _leaves(source: LogSource, size: int) -> Iterator[bytes]:
    """The leaf hashes of the entries as the source serves them (a second read)."""
    for _, raw, _ in source.entries(size):
        yield leaf_hash(raw)


def _name_bad_entry(source: LogSource, checkpoint: Checkpoint) -> None:
    leaves = _leaves(source, checkpoint.size)
    current = next(leaves, None)
    index = 0
    while current is not None:
        following = next(leaves, None)
        proof = source.inclusion(index, checkpoint.size)
        if proof is None:
            break
        try:
            verify_inclusion(index, checkpoint.size, current, proof, checkpoint.root)
        except ProofError as exc:
            after = following
            if after is None and (entry := getattr(source, "entry", None)) is not None:
                # Past the checkpoint, if the source can serve one entry alone.
                raw = entry(index + 1)
                after = leaf_hash(raw) if raw is not None else None
            if after is not None:
                try:
                    verify_inclusion(index, checkpoint.size, after, proof, checkpoint.root)
                except ProofError:
                    pass
                else:
                    raise AuditFailure(
                        "inserted: this entry is not in the signed tree, and the entry served "
                        f"after it is the tree's entry {index}: an entry was inserted here and "
                        "the entries after it moved down",
                        index,
                    ) from exc
            raise AuditFailure(
                f"not included in the signed tree (an edited or inserted entry): {exc}", index
            ) from exc
        current, index = following, index + 1
    raise AuditFailure(
        "the entries do not hash to the checkpoint's root: the log was altered after signing"
    )


def _first_difference(old_export: ExportSource, source: LogSource, size: int) -> int:
    """The first position where the trusted export and the log differ (reads both again)."""
    position = 0
    for old_entry, new_leaf in zip(old_export.entries(0), _leaves(source, size), strict=False):
        old_index, old_raw, _ = old_entry
        if old_index != position or leaf_hash(old_raw) != new_leaf:
            return position
        position += 1
    return position


def _check_trusted(
    old: Checkpoint,
    old_export: ExportSource | None,
    prefix_root: bytes | None,
    source: LogSource,
    checkpoint: Checkpoint,
    report: Report,
) -> None:
    def first_difference() -> int | None:
        if old_export is None:
            return None
        return _first_difference(old_export, source, checkpoint.size)

    if old.size > checkpoint.size:
        raise AuditFailure(
            f"the log has {checkpoint.size} entries, fewer than the {old.size} of the trusted "
            "checkpoint: it was truncated",
            first_difference() if old_export is not None else checkpoint.size,
        )
    proof = source.consistency(old.size, checkpoint.size) if old.size > 0 else None
    try:
        if proof is not None:
            verify_consistency(old.size, checkpoint.size, old.root, checkpoint.root, proof)
        if prefix_root != old.root:
            raise ProofError(
                f"the first {old.size} entries do not hash to the trusted root: history was "
                "rewritten"
            )
    except ProofError as exc:
        raise AuditFailure(
            f"inconsistent with the trusted checkpoint of {old.size} entries: {exc}",
            first_difference(),
        ) from exc
    report.notes.append(
        f"consistent with the trusted checkpoint of {old.size} entries (root {old.root.hex()})"
    )
