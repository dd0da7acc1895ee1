"""The flow of a step, from a verified reveal to a recorded outcome and its view.

`Flow.open_sequence` accepts a signed header and step 1, `Flow.reveal` each next step after a
release; both verify the step against the sealed header (`SequenceVerifier`), parse its body
once (`Revealed`), check the endorsement claims and record the reveal, then `_compute` runs it:
a script is queued for the background (`scripts.py`), any other step goes through the
pipeline under its locks (the DP ledger's, the query-set scope's through `qss/admission.py`)
and is recorded with its audit event in one transaction.

Reveals of one sequence are serialised by a per-sequence lock in this process and by the
sequence row's version in the database (so two replicas cannot both advance one sequence).
"""

from __future__ import annotations

import base64
import contextlib
import logging
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from safeaccess.client.metadata import DatasetMetadata
from safeaccess.client.protocol import (
    Endorsement,
    ProtocolError,
    SequenceVerifier,
    VerifierState,
    parse_header,
)
from safeaccess.rules.ruleset import RuleSet
from safeaccess.sandbox.backend import Backend
from safeaccess.server import metrics
from safeaccess.server.audit import records as audit_records
from safeaccess.server.auth import AUTHENTICATION_FAILED, Authenticator
from safeaccess.server.config import DataDir, DPConfig, ServerConfig, ledger_key
from safeaccess.server.digests import sha256_hex
from safeaccess.server.dp import DPContext
from safeaccess.server.errors import (
    Conflict,
    Forbidden,
    NotFound,
    ProtocolRejected,
    Unauthenticated,
    Unavailable,
)
from safeaccess.server.logs import step_context
from safeaccess.server.outcome import QssCommit, StepOutcome
from safeaccess.server.qss.admission import Admission
from safeaccess.server.qss.record_ids import read_ids
from safeaccess.server.qss.reserved import read_reserved
from safeaccess.server.qss.scope import LOCK_TIMEOUT_SECONDS, ScopeAuditor
from safeaccess.server.qss.universe import Population
from safeaccess.server.schemas import OpenRequest, RevealRequest, StepView
from safeaccess.server.states import TERMINAL_SEQUENCE_STATES, SequenceState, StepState
from safeaccess.server.steps import claims as claim_gate
from safeaccess.server.steps.pipeline import StepContext, lost_outcome, run_step
from safeaccess.server.steps.revealed import Revealed
from safeaccess.server.steps.scheduler import FairScheduler
from safeaccess.server.steps.scripts import ScriptRuns, queued_outcome
from safeaccess.server.steps.timing import hold_until_padded
from safeaccess.server.steps.views import Views
from safeaccess.server.steps.withhold_budget import count_at_settle, opening_needs_approval
from safeaccess.server.store import WithholdCount, catalogue, ledgers, queue, sequences
from safeaccess.server.store.advisory_locks import LockTimeout, SharedLock, SharedLocks
from safeaccess.server.store.database import Database
from safeaccess.server.store.queue import QueuedJob, carried_rows, settled_rows, step_job
from safeaccess.server.store.schema import DatasetRow, SequenceRow, StepRow
from safeaccess.server.store.step_settings import (
    StepSettings,
    prime,
    settings_of,
    settings_scope,
)
from safeaccess.server.synth.mock import public_spent
from safeaccess.server.synth.step import FILES_DIR as SYNTH_DIR

if TYPE_CHECKING:  # PostgreSQL only: psycopg is the `postgresql` extra's
    from safeaccess.server.store.sequence_leases import SequenceLeases
    from safeaccess.server.store.settled import SettledListener

log = logging.getLogger("safeaccess.server")


def _protocol_code(exc: ProtocolError) -> str:
    """TamperedTraceError -> 'tampered_trace': a stable machine-readable code per error class."""
    name = type(exc).__name__.removesuffix("Error")
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower() or "protocol_error"


def _rejected(exc: ProtocolError) -> ProtocolRejected:
    return ProtocolRejected(str(exc), code=_protocol_code(exc))


def _split_dataset(name: str) -> tuple[str, int | None]:
    """'census' -> ('census', None); 'census@2' -> ('census', 2)."""
    base, sep, version = name.partition("@")
    if not sep:
        return name, None
    if not version.isdigit():
        raise ProtocolRejected(f"dataset {name!r}: the version after '@' must be a number")
    return base, int(version)


@contextlib.contextmanager
def _holding(lock: SharedLock, what: str) -> Iterator[None]:
    """Hold a lock shared with other replicas; one held too long elsewhere is "retry later"."""
    try:
        lock.acquire()
    except LockTimeout as exc:
        raise Unavailable(f"{what} is busy on another server ({exc}); retry later") from exc
    try:
        yield
    finally:
        lock.release()


@dataclass(frozen=True)
class _Ledger:
    """The DP configuration of a step's dataset and the ledger the step is charged to."""

    config: DPConfig
    key: str
    owner: str


def _still_running(seq: SequenceRow, step: StepRow, index: int) -> bool:
    """Whether step `index` is recorded running as its running sequence's current step (so a
    job or a resumed step still has to compute it)."""
    return (
        step.state == StepState.RUNNING
        and seq.state == SequenceState.RUNNING
        and seq.current_index == index
    )


class Flow:
    """Opens sequences and runs their steps, over the service's store, sandbox and locks."""

    def __init__(
        self,
        *,
        data: DataDir,
        config: ServerConfig,
        store: Database,
        backend: Backend,
        researchers: Authenticator,
        trusted_cas: dict[str, Ed25519PublicKey],
        scripts: ScriptRuns,
        ruleset_for: Callable[[DatasetRow], RuleSet],
        views: Views,
        listener: SettledListener | None = None,
        leases: SequenceLeases | None = None,
    ):
        self.data = data
        self.config = config
        self.store = store
        self.backend = backend
        self.researchers = researchers
        self.trusted_cas = trusted_cas
        self.scripts = scripts
        self.ruleset_for = ruleset_for
        self.views = views
        # execution = "queue": steps are jobs run by worker hosts; this replica waits for them.
        self.queued = config.execution == "queue"
        self.listener = listener
        # Replicas running steps themselves on PostgreSQL: which sequences this one works on,
        # seen by the others (`store/sequence_leases.py`, `orphans.py`).
        self.leases = leases
        # Interactive steps and background scripts queue separately, each fair across
        # researchers: a researcher's own scripts never delay her answers (their run time is not
        # hers to observe), and nobody's jobs fill every slot.
        self._jobs = FairScheduler(config.max_concurrent_jobs, config.max_jobs_per_researcher)
        self._locks: dict[str, threading.Lock] = {}
        self._locks_guard = threading.Lock()
        # DP ledgers and withhold budgets are shared by every replica: on PostgreSQL their locks
        # are advisory locks too (SQLite: this process's locks only).
        self._dp_locks = SharedLocks(store.engine, "dp-ledger", LOCK_TIMEOUT_SECONDS)
        self._budget_locks = SharedLocks(store.engine, "withhold-budget", LOCK_TIMEOUT_SECONDS)
        self.auditor = ScopeAuditor(data.root, store)
        self._ids: dict[int, Any] = {}
        self._metadata_of: dict[int, DatasetMetadata] = {}  # by dataset version id
        self._population_of: dict[int, Population] = {}  # by dataset version id

    @property
    def server_id(self) -> str:
        return self.config.server_id

    def run_data(self) -> dict[str, Any]:
        """What a run starts with, for the audit log."""
        return audit_records.run_data(self.backend.name, self.config.sandbox.limits)

    def reveal_data(self, trace: bytes, step: StepRow) -> dict[str, Any]:
        """A reveal as logged (`audit_records.reveal_data`)."""
        return audit_records.reveal_data(trace, step, self.run_data())

    def settle_data(self, outcome: StepOutcome, ruleset: RuleSet) -> dict[str, Any]:
        """The audit-log fields of a settled step (`audit_records.settle_data`)."""
        return audit_records.settle_data(outcome, ruleset, self.run_data())

    def local_lock(self, sequence_id: str) -> threading.Lock:
        """This process's lock of a sequence."""
        with self._locks_guard:
            return self._locks.setdefault(sequence_id, threading.Lock())

    @contextlib.contextmanager
    def lock(self, sequence_id: str) -> Iterator[None]:
        """Work on a sequence alone: this process's lock, then (replicas running steps
        themselves on PostgreSQL) the sequence's lease, which other replicas see."""
        with self.local_lock(sequence_id):
            if self.leases is None:
                yield
                return
            with self.leases.hold(sequence_id):
                yield

    def resume_orphan(self, sequence_id: str, index: int) -> bool:
        """Run again a step left `running` by a server that died mid-step, as a re-sent reveal
        would; the caller holds the sequence's lock and lease. False if it is running no more."""
        with settings_scope(self.store), step_context(sequence_id, index):
            seq, step = sequences.get_sequence_step(self.store, sequence_id, index)
            if seq is None or step is None or not _still_running(seq, step, index):
                return False
            log.info(
                "sequence %s step %d: its server stopped mid-step; running it here", seq.id, index
            )
            self._compute(
                seq,
                step,
                catalogue.get_dataset(self.store, seq.dataset_id),
                Revealed.stored(step.body, last=step.last),
            )
            return True

    def _record_ids(self, dataset: DatasetRow) -> Any:
        """The dataset version's positions -> stable record ids (read once per version)."""
        ids = self._ids.get(dataset.id)
        if ids is None:
            ids = read_ids(self.data.root / dataset.path, dataset.rows)
            with self._locks_guard:
                self._ids[dataset.id] = ids
        return ids

    def _metadata(self, dataset: DatasetRow) -> DatasetMetadata:
        """The dataset version's metadata, validated once per version (a registered version
        never changes; validating it cost about 0.09 ms of every step)."""
        metadata = self._metadata_of.get(dataset.id)
        if metadata is None:
            metadata = DatasetMetadata.model_validate(dataset.dataset_metadata)
            with self._locks_guard:
                self._metadata_of[dataset.id] = metadata
        return metadata

    def _settings(self, dataset_id: int) -> StepSettings:
        """The settings of dataset version `dataset_id` as this request read them (once, in
        one statement: `settings_of`)."""
        settings = settings_of(self.store, dataset_id)
        if settings is None:  # a sequence's or a job's dataset version is never removed
            raise NotFound(f"dataset version {dataset_id} does not exist")
        return settings

    def _populations(self, version_ids: tuple[int, ...]) -> list[Population]:
        """Every registered version of a dataset's name (`version_ids`, as its settings were
        read) as a population of record ids: the catalogue publishes their row counts, so the
        auditor admits them before any output."""
        populations = []
        # Only the ids are read at each step: a version's row never changes (`get_dataset`
        # keeps it), so only a version registered since the last step is read whole.
        for dataset_id in version_ids:
            population = self._population_of.get(dataset_id)
            if population is None:
                row = catalogue.get_dataset(self.store, dataset_id)
                # the standard tables each scope reserves right after the population
                # (`qss/reserved.py`, unless the centre turned it off), computed once per
                # version and process
                reserved = (
                    read_reserved(self.data.root / row.path, self._metadata(row))
                    if self.config.reserve_standard_tables
                    else []
                )
                population = Population.of(row.version, self._record_ids(row), reserved)
                with self._locks_guard:
                    self._population_of[dataset_id] = population
            populations.append(population)
        return populations

    def _dp_ledger(
        self, seq: SequenceRow, dataset: DatasetRow, raw: dict[str, Any] | None
    ) -> _Ledger | None:
        """The DP ledger a step of `seq` on `dataset` is charged to, under the dataset's DP
        configuration `raw` as its settings were read (None: the dataset has no DP)."""
        if raw is None:
            return None
        config = DPConfig.model_validate(raw)
        key, owner = ledger_key(
            dataset.name, config.scope, researcher=seq.researcher, project=seq.project
        )
        return _Ledger(config, key, owner)

    def _dp_guard(self, ledger: _Ledger | None) -> contextlib.AbstractContextManager[None]:
        """Serialises the steps charged to one DP ledger, from reading it to recording the
        charge, on every replica (the store's version check is the backstop); nothing on other
        datasets."""
        if ledger is None:
            return contextlib.nullcontext()
        return _holding(self._dp_locks.lock(ledger.key), "the privacy ledger of this step")

    def _dp_context(
        self, ledger: _Ledger | None, dataset: DatasetRow, ruleset: RuleSet
    ) -> DPContext | None:
        """The dataset's DP configuration and the state of the ledger this step would be
        charged to, read under its lock."""
        if ledger is None:
            return None
        return DPContext(
            config=ledger.config,
            dataset=dataset.name,
            key=ledger.key,
            owner=ledger.owner,
            ledger=ledgers.dp_ledger(self.store, ledger.key),
            ruleset_label=ruleset.label,
            ruleset_hash=ruleset.content_hash(),
            public_spent=public_spent(self.store, dataset.name),
            rows=dataset.rows,
        )

    def _budget_lock(
        self, researcher: str, dataset: str
    ) -> contextlib.AbstractContextManager[None]:
        """Serialises a researcher's openings on one dataset name, on every replica, so that
        sequences opened at once are each counted against the withhold budget."""
        return _holding(
            self._budget_locks.lock(f"{researcher}\x00{dataset}"),
            "the withhold budget of this dataset",
        )

    def own_sequence(self, researcher: str, sequence_id: str) -> SequenceRow:
        seq = sequences.get_sequence(self.store, sequence_id)
        # Another researcher's sequence is reported as absent: its existence is not hers to know.
        if seq is None or seq.researcher != researcher:
            raise NotFound(f"you have no sequence {sequence_id}")
        return seq

    def _verifier(
        self,
        header: bytes,
        signature: bytes,
        researcher: str,
        endorsements: list[Endorsement],
        state: VerifierState | None,
        key: Ed25519PublicKey | None = None,
    ) -> SequenceVerifier:
        """The verifier of a sequence of `researcher`; `key` is her registered key if this
        request's authentication read it already (None: read it now)."""
        if key is None:
            key = self.researchers.key(researcher)
        if key is None:
            raise Unauthenticated(AUTHENTICATION_FAILED)
        try:
            return SequenceVerifier(
                header,
                signature,
                key,
                endorsements,
                self.trusted_cas,
                state=state,
                server=self.server_id,
            )
        except ProtocolError as exc:
            raise _rejected(exc) from exc

    def open_sequence(
        self, researcher: str, request: OpenRequest, *, key: Ed25519PublicKey | None = None
    ) -> StepView:
        """Accept a signed header (once) and run step 1; `key` is the researcher's key as the
        request's authentication read it (None: read it now)."""
        # The dataset's settings are read once for the whole request (`store/step_settings.py`).
        with settings_scope(self.store):
            return self._open_sequence(researcher, request, key)

    def _open_sequence(
        self, researcher: str, request: OpenRequest, key: Ed25519PublicKey | None
    ) -> StepView:
        try:
            fields = parse_header(request.header)
        except ProtocolError as exc:
            raise _rejected(exc) from exc
        if fields.researcher != researcher:
            raise Forbidden(
                f"the header is for researcher {fields.researcher!r} but the request was signed "
                f"by {researcher!r}"
            )
        if fields.server != self.server_id:
            raise ProtocolRejected(
                f"the sequence is bound to server {fields.server!r}; this server is "
                f"{self.server_id!r}",
                code="wrong_server",
            )
        if fields.project not in catalogue.projects_of(self.store, researcher):
            raise Forbidden(f"you are not a member of project {fields.project!r}")
        name, version = _split_dataset(fields.dataset)
        dataset = catalogue.find_dataset(self.store, name, version)
        if dataset is None or dataset.project != fields.project:
            raise NotFound(f"project {fields.project!r} has no dataset {fields.dataset!r}")
        # The claims, rule set, auditor and DP settings, read once for the request.
        settings = self._settings(dataset.id)
        endorsements = [Endorsement.model_validate(e.model_dump()) for e in request.endorsements]
        verifier = self._verifier(
            request.header, request.signature, researcher, endorsements, None, key
        )
        try:
            verified = verifier.reveal(1, request.trace, request.body)
        except ProtocolError as exc:
            raise _rejected(exc) from exc
        revealed = Revealed.of(request.trace, request.body, last=verified.last)
        required = settings.requirements
        claim_gate.check_open(
            dataset.name,
            required,
            fields.kinds,
            revealed.kind,
            claim_gate.granted_claims(verifier.endorsements),
        )
        sequence_id = uuid.uuid4().hex
        step = StepRow(
            index=1,
            trace_hash=sha256_hex(request.trace),
            body=request.body,
            body_hash=sha256_hex(request.body),
            last=revealed.last,
        )
        header_hash = sha256_hex(request.header)
        with self.lock(sequence_id), step_context(sequence_id, 1):
            # The budget's lock covers reading the budget and recording the sequence (which then
            # counts as a possible withhold), not the step: it is shared with every replica.
            with self._budget_lock(researcher, dataset.name):
                held, budget_facts = opening_needs_approval(
                    self.store, self.ruleset_for(dataset), researcher, dataset.name
                )
                seq, step = sequences.create_sequence(
                    self.store,
                    sequence_id=sequence_id,
                    researcher=researcher,
                    project=fields.project,
                    dataset_id=dataset.id,
                    header=request.header,
                    header_hash=header_hash,
                    nonce=fields.nonce.hex(),
                    signature=request.signature,
                    endorsements=[e.model_dump(mode="json") for e in endorsements],
                    verifier_state=verifier.state.model_dump(mode="json"),
                    first_step=step,
                    event_data={
                        "header": base64.b64encode(request.header).decode("ascii"),
                        "signature": base64.b64encode(request.signature).decode("ascii"),
                        "endorsements": [e.model_dump(mode="json") for e in endorsements],
                        "header_sha256": header_hash,
                        "dataset": dataset.name,
                        "dataset_version": dataset.version,
                        "dataset_sha256": dataset.sha256,
                        "endorsed_by": sorted(verifier.endorsed_by),
                        "claims": claim_gate.claims_record(verifier.endorsements),
                        "declared_kinds": None if fields.kinds is None else list(fields.kinds),
                        "required_claims": {k: sorted(v) for k, v in sorted(required.items())},
                        "reveal": self.reveal_data(request.trace, step),
                        "withhold_budget": budget_facts,
                    },
                    awaiting_approval=held,
                    job=self._job(sequence_id, 1, researcher, dataset.name, revealed),
                )
            if held:
                log.info("sequence %s by %s awaits approval (withhold budget)", seq.id, researcher)
                return self.views.step(seq, step, revealed)
            return self._compute(seq, step, dataset, revealed)

    def reveal(
        self,
        researcher: str,
        sequence_id: str,
        index: int,
        request: RevealRequest,
        *,
        key: Ed25519PublicKey | None = None,
    ) -> StepView:
        """Accept the reveal of step `index` after a release, or answer a repeated reveal;
        `key` as in `open_sequence`."""
        # The dataset's settings are read once for the whole request (`store/step_settings.py`).
        with self.lock(sequence_id), settings_scope(self.store), step_context(sequence_id, index):
            seq, existing = sequences.get_sequence_step(self.store, sequence_id, index)
            # Another researcher's sequence is reported as absent (as in `own_sequence`).
            if seq is None or seq.researcher != researcher:
                raise NotFound(f"you have no sequence {sequence_id}")
            trace_hash = sha256_hex(request.trace)
            body_hash = sha256_hex(request.body)
            if existing is not None:
                if existing.trace_hash != trace_hash or existing.body_hash != body_hash:
                    raise Conflict(
                        f"step {index} was already revealed with another trace or body",
                        code="step_already_revealed",
                    )
                if existing.state == StepState.RUNNING and seq.state == SequenceState.RUNNING:
                    if self.queued:
                        # Its job is queued or running on a worker (or is queued again now).
                        return self._await(seq, existing, ensure_job=True)
                    # Computed but never recorded (the server stopped mid-step): run it again.
                    return self._compute(
                        seq,
                        existing,
                        catalogue.get_dataset(self.store, seq.dataset_id),
                        Revealed.stored(existing.body, last=existing.last),
                    )
                return self.views.step(seq, existing)
            if SequenceState(seq.state) in TERMINAL_SEQUENCE_STATES:
                raise Conflict(
                    f"the sequence is {seq.state}; nothing more can be revealed",
                    code="sequence_closed",
                )
            if seq.state != SequenceState.RELEASED:
                raise Conflict(
                    f"step {seq.current_index} is {seq.state}; reveal step "
                    f"{seq.current_index + 1} only after it is released",
                    code="not_released",
                )
            if index != seq.current_index + 1:
                raise Conflict(
                    f"step {seq.current_index + 1} is next, not step {index}", code="out_of_order"
                )
            verifier = self._verifier(
                seq.header,
                seq.signature,
                researcher,
                [Endorsement.model_validate(e) for e in seq.endorsements],
                VerifierState.model_validate(seq.verifier_state),
                key,
            )
            try:
                verified = verifier.reveal(index, request.trace, request.body)
            except ProtocolError as exc:
                # Nothing is persisted: the sequence stays where it was.
                raise _rejected(exc) from exc
            revealed = Revealed.of(request.trace, request.body, last=verified.last)
            claim_gate.check_step(
                verifier.header.dataset,
                self._settings(seq.dataset_id).requirements,
                verifier.header.kinds,
                index,
                revealed.kind,
                claim_gate.granted_claims(verifier.endorsements),
            )
            step = StepRow(
                index=index,
                trace_hash=trace_hash,
                body=request.body,
                body_hash=body_hash,
                last=revealed.last,
            )
            step = sequences.begin_step(
                self.store,
                sequence_id,
                expected_version=seq.version,
                step=step,
                verifier_state=verifier.state.model_dump(mode="json"),
                event_data=self.reveal_data(request.trace, step),
                job=self._job(sequence_id, index, researcher, verifier.header.dataset, revealed),
            )
            # No re-read of the sequence: `_compute` uses only its fixed fields (id, owner,
            # project, dataset), and `settle_step` reads and returns the row it moves.
            return self._compute(
                seq, step, catalogue.get_dataset(self.store, seq.dataset_id), revealed
            )

    def _compute(
        self, seq: SequenceRow, step: StepRow, dataset: DatasetRow, revealed: Revealed
    ) -> StepView:
        ruleset = self.ruleset_for(dataset)
        if revealed.is_script:
            return self._queue_script(seq, step, ruleset, revealed)
        if self.queued:
            return self._await(seq, step, revealed=revealed)
        # The view's withhold budget, counted in the step's settle transaction (no read of its own).
        withholds = count_at_settle(ruleset, seq.researcher, dataset.name)
        seq, step = self._compute_here(seq, step, dataset, revealed, ruleset, withholds)
        return self.views.step(seq, step, revealed, withholds=withholds)

    def _job(
        self, sequence_id: str, index: int, researcher: str, dataset: str, revealed: Revealed
    ) -> QueuedJob | None:
        """The job to queue with the step's record (execution = "queue", not a script: a
        script's job is queued when it is answered "in review")."""
        if not self.queued or revealed.is_script:
            return None
        return step_job(
            self.config,
            sequence_id=sequence_id,
            index=index,
            researcher=researcher,
            dataset=_split_dataset(dataset)[0],
            script=False,
        )

    def _await(
        self,
        seq: SequenceRow,
        step: StepRow,
        *,
        revealed: Revealed | None = None,
        ensure_job: bool = False,
    ) -> StepView:
        """Wait for a worker host to settle the step (execution = "queue"); after
        `queue.wait_seconds` answer with the step still running (the client asks again)."""
        if ensure_job:
            # Queued again carrying no rows (rare: a re-sent reveal whose job was lost), so its
            # worker reads them (`run_job`).
            dataset = catalogue.get_dataset(self.store, seq.dataset_id)
            with self.store.transaction() as s:
                queue.ensure(
                    s,
                    step_job(
                        self.config,
                        sequence_id=seq.id,
                        index=step.index,
                        researcher=seq.researcher,
                        dataset=dataset.name,
                        script=False,
                    ),
                )
        current: dict[str, Any] = {}

        def announced(fields: str) -> bool:
            # The settle's own rows, as its NOTIFY carried them (`queue.SettledFields`): the
            # view built from them is the one a read of the rows would give, with no read.
            rows = settled_rows(fields, seq, step)
            if rows is None or rows[1].state == StepState.RUNNING:
                return False
            current["seq"], current["step"] = rows
            return True

        def settled() -> bool:
            # The sequence with the step, in one read: the view needs both.
            latest, row = sequences.get_sequence_step(self.store, seq.id, step.index)
            current["seq"], current["step"] = latest, row
            return row is not None and row.state != StepState.RUNNING

        job_failed: dict[str, bool] = {}

        def settled_or_failed() -> bool:
            if settled():
                return True
            # Tried max_attempts times without an answer (the sandbox unavailable): the same
            # "retry later" as a server running the step itself (`pipeline._unavailable`).
            with self.store.transaction() as s:
                status = queue.job_status(s, f"step:{seq.id}:{step.index}")
            job_failed["failed"] = status == "failed"
            return job_failed["failed"]

        assert self.listener is not None, "a replica with execution = 'queue' listens"
        self.listener.wait(
            seq.id,
            step.index,
            self.config.queue.wait_seconds,
            settled_or_failed,
            # A step queued by this request is running: its first look is when it is announced.
            look_first=ensure_job,
            announced=announced,
        )
        if job_failed.get("failed") and not settled():
            raise Unavailable(
                "the sandbox could not run this step; retry the same reveal later",
                code="sandbox_unavailable",
            )
        if "seq" not in current:  # still running after `wait_seconds`, never looked at
            settled()
        latest = current["seq"]
        if latest is None:
            raise NotFound(f"sequence {seq.id} does not exist")
        return self.views.step(latest, current.get("step") or step, revealed)

    def run_job(
        self,
        sequence_id: str,
        index: int,
        check: Callable[[DatasetRow], None] | None = None,
        *,
        carried: Mapping[str, Any] | None = None,
    ) -> bool:
        """Compute a queued step (on a worker host); False if it was settled already (a job
        run again after its worker was presumed dead records nothing twice). `check` sees the
        dataset's row before anything runs on it (the worker's SHA-256 check). `carried`: the
        rows the job carries (`queue.Carried`), given on its first attempt only; without them
        (a later attempt, a job queued by an older release or by `ensure`) the rows are read."""
        # The dataset's settings are read once for the whole job, as for a request.
        with self.lock(sequence_id), settings_scope(self.store), step_context(sequence_id, index):
            rows = carried_rows(carried, sequence_id, index)
            if rows is not None:
                # The rows as the reveal's transaction wrote them, with the settings it read:
                # nothing is read before the computation. Possibly stale (the step settled
                # meanwhile): the settle below is guarded by the carried version, and is then
                # refused, recording nothing.
                seq, step, settings = rows
                if settings is not None:
                    prime(self.store, settings)
            else:
                # With the dataset's settings, in one statement: the scope starts empty, so
                # `get_sequence_step` reads them for it (the reveal's replica read them too).
                read_seq, read_step = sequences.get_sequence_step(self.store, sequence_id, index)
                if (
                    read_seq is None
                    or read_step is None
                    or not _still_running(read_seq, read_step, index)
                ):
                    return False
                seq, step = read_seq, read_step
            dataset = catalogue.get_dataset(self.store, seq.dataset_id)
            if check is not None:
                check(dataset)
            # The rows in hand are those the settle moves on: it need not read them again
            # (its UPDATE is guarded by the sequence's version, as for a step begun here).
            self.store.running.remember(seq, step)
            revealed = Revealed.stored(step.body, last=step.last)
            try:
                self._compute_here(seq, step, dataset, revealed, self.ruleset_for(dataset))
            except Conflict as exc:
                if rows is None or exc.code != "concurrent_update":
                    raise
                # Carried rows of a step settled meanwhile: the guarded settle recorded nothing.
                log.info("job %s step %d: settled already; nothing recorded", sequence_id, index)
                return False
            return True

    def record_lost(self, sequence_id: str, index: int, attempts: int) -> bool:
        """Settle a step whose job's workers all died (its lease expired `attempts` times) as
        withheld: what kills a worker host may depend on the records, so it is answered like
        any data-dependent failure (`failures.py`), and the sequence stops. False if the step
        was settled already."""
        with self.lock(sequence_id), step_context(sequence_id, index):
            seq = sequences.get_sequence(self.store, sequence_id)
            step = sequences.get_step(self.store, sequence_id, index)
            if seq is None or step is None or step.state != StepState.RUNNING:
                return False
            dataset = catalogue.get_dataset(self.store, seq.dataset_id)
            ruleset = self.ruleset_for(dataset)
            outcome = lost_outcome(
                Revealed.stored(step.body, last=step.last).kind or "", ruleset, attempts
            )
            try:
                sequences.settle_step(
                    self.store,
                    sequence_id,
                    index,
                    outcome,
                    event_data=self.settle_data(outcome, ruleset),
                )
            except Conflict:
                return False
            return True

    def _compute_here(
        self,
        seq: SequenceRow,
        step: StepRow,
        dataset: DatasetRow,
        revealed: Revealed,
        ruleset: RuleSet,
        withholds: WithholdCount | None = None,
    ) -> tuple[SequenceRow, StepRow]:
        """Run a step in this process and record it: admission, DP ledger, sandbox, settle
        (which counts `withholds` if given)."""
        started = time.monotonic()  # reply padding counts from here (`timing.py`)
        metadata = self._metadata(dataset)
        # The dataset's settings, read once for the request (`store/step_settings.py`), are
        # handed down as data: the auditor's, the versions' and the DP configuration.
        settings = self._settings(dataset.id)
        admission = Admission(
            self.auditor,
            dataset=dataset.name,
            settings=settings.qss,
            threshold=ruleset.threshold,
            researcher=seq.researcher,
            project=seq.project,
            ids=self._record_ids(dataset),
            populations=lambda: self._populations(settings.version_ids),
            analysis=revealed.analysis_json,
            metadata=metadata,
        )
        # The DP ledger's lock (if the dataset has DP) covers the run and the record; the
        # scope's lock is taken by the admission and held until the step is recorded.
        ledger = self._dp_ledger(seq, dataset, settings.dp_config)
        with admission, self._dp_guard(ledger):
            dp = self._dp_context(ledger, dataset, ruleset)
            with self._jobs.slot(seq.researcher):
                outcome = run_step(
                    revealed,
                    StepContext(
                        job_id=f"{seq.id}-{step.index}",
                        metadata=metadata,
                        dataset_path=self.data.root / dataset.path,
                        backend=self.backend,
                        limits=self.config.sandbox.limits,
                        ruleset=ruleset,
                        audit=metrics.timed(metrics.ADMISSION_SECONDS, admission.admit),
                        n_records=dataset.rows,
                        dp=dp,
                        synth_files=self.data.root / SYNTH_DIR,
                    ),
                )

            def record(
                outcome: StepOutcome, commit: QssCommit | None, facts: dict[str, Any]
            ) -> tuple[SequenceRow, StepRow]:
                event_data = self.settle_data(outcome, ruleset)
                if outcome.dp_facts is not None:
                    event_data["dp"] = outcome.dp_facts
                if facts:
                    event_data["qss"] = facts
                # The moment a step is recorded is the first thing about it anyone can see.
                hold_until_padded(self.config.timing, started, dataset.rows)
                return sequences.settle_step(
                    self.store,
                    seq.id,
                    step.index,
                    outcome,
                    event_data=event_data,
                    qss=commit,
                    withholds=withholds,
                )

            (seq, step), outcome = admission.settle(outcome, record)
        facts = outcome.dp_facts or {}
        charge = facts.get("charge") if facts.get("verdict") == "release" else None
        metrics.step_recorded(
            outcome.kind,
            outcome.state.value,
            time.monotonic() - started,
            float(charge) if isinstance(charge, int | float) else None,
            dataset.name,
        )
        log.info(
            "sequence %s step %d (%s) by %s: %s%s",
            seq.id,
            step.index,
            outcome.kind,
            seq.researcher,
            outcome.state.value,
            f" ({outcome.error_code})" if outcome.error_code else "",
        )
        return seq, step

    def _queue_script(
        self, seq: SequenceRow, step: StepRow, ruleset: RuleSet, revealed: Revealed
    ) -> StepView:
        """Answer a script step "in review" now; run it in the background (scripts.py)."""
        seq, step = sequences.settle_step(
            self.store,
            seq.id,
            step.index,
            queued_outcome(ruleset),
            event_data={
                "trace_sha256": step.trace_hash,
                "body_sha256": step.body_hash,
                "ruleset_sha256": ruleset.content_hash(),
                "script_run": "queued",
            },
            job=(
                step_job(
                    self.config,
                    sequence_id=seq.id,
                    index=step.index,
                    researcher=seq.researcher,
                    dataset="",
                    script=True,
                )
                if self.queued
                else None
            ),
        )
        if not self.queued:
            self.scripts.submit(seq.id, step.index, seq.researcher)
        log.info("sequence %s step %d (script) by %s: queued", seq.id, step.index, seq.researcher)
        return self.views.step(seq, step, revealed)
