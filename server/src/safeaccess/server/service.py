"""The controller service: authenticate, open sequences, accept reveals, run steps, report results.

The HTTP layer (`api.py`) is a thin shell over this class, which the admin CLI and the tests use
directly too. Reveals of one sequence are serialised by a per-sequence lock in this process and by
the sequence row's version in the database (so two replicas cannot both advance one sequence).
"""

from __future__ import annotations

import base64
import contextlib
import importlib.metadata
import logging
import re
import threading
import uuid
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from safeaccess.client.keys import KeyFileError, fingerprint, load_public_key, public_key_raw
from safeaccess.client.metadata import DatasetMetadata
from safeaccess.client.protocol import (
    Endorsement,
    ProtocolError,
    SequenceVerifier,
    VerifierState,
    parse_header,
)
from safeaccess.rules.decision import Decision
from safeaccess.rules.ruleset import DEFAULT_RULESET, RuleSet, load_ruleset
from safeaccess.sandbox.backend import Backend, SandboxError
from safeaccess.sandbox.factory import make_backend
from safeaccess.server import budgets, claim_gate, review
from safeaccess.server.audit_service import (
    AuditService,
    configuration_record,
    log_configuration,
)
from safeaccess.server.auth import AUTHENTICATION_FAILED as AUTHENTICATION_FAILED
from safeaccess.server.auth import Authenticator, check_rate
from safeaccess.server.config import DataDir, ServerConfig
from safeaccess.server.dataset_rules import current_rules_path
from safeaccess.server.digests import sha256_hex
from safeaccess.server.dp_config import DPConfig, ledger_key
from safeaccess.server.dp_release import DPContext, public_reasons
from safeaccess.server.errors import (
    ConfigError,
    Conflict,
    Forbidden,
    NotFound,
    ProtocolRejected,
    Unauthenticated,
    Unavailable,
)
from safeaccess.server.leverage_record import leverage_record
from safeaccess.server.outcome import QssCommit, StepOutcome
from safeaccess.server.pipeline import run_step
from safeaccess.server.qss.admission import Admission
from safeaccess.server.qss_scope import LOCK_TIMEOUT_SECONDS, ScopeAuditor
from safeaccess.server.qss_universe import Population
from safeaccess.server.ratelimit import DatabaseFailureLimiter, FailureLimiter
from safeaccess.server.reasons import researcher_reasons, script_reasons
from safeaccess.server.receipts import sign_receipt
from safeaccess.server.record_ids import read_ids
from safeaccess.server.scheduler import FairScheduler
from safeaccess.server.schemas import (
    BudgetView,
    DatasetView,
    ErrorInfo,
    OpenRequest,
    Reason,
    RevealRequest,
    SequenceView,
    StepView,
)
from safeaccess.server.script_runs import RunContext, ScriptRuns, queued_outcome
from safeaccess.server.states import TERMINAL_SEQUENCE_STATES, SequenceState, StepState
from safeaccess.server.steps.revealed import Revealed, shown_of
from safeaccess.server.store import Store
from safeaccess.server.store.advisory_locks import LockTimeout, SharedLock, SharedLocks
from safeaccess.server.store.schema import DatasetRow, SequenceRow, StepRow
from safeaccess.server.synth.mock import mock_paths, public_spent, published_mock
from safeaccess.server.synth.step import FILES_DIR as SYNTH_DIR
from safeaccess.server.withhold_budget import budget, opening_needs_approval

log = logging.getLogger("safeaccess.server")

try:
    RUNNER_VERSION = importlib.metadata.version("safeaccess-sandbox")
except importlib.metadata.PackageNotFoundError:  # pragma: no cover - source checkout
    RUNNER_VERSION = "unknown"

AWAITING_APPROVAL = Reason(
    check="withhold_budget",
    verdict="review",
    message="your withhold budget on this dataset is spent: an output checker must approve "
    "opening this sequence; run it again once approved",
)


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


def _utc(moment: datetime) -> datetime:
    """SQLite returns stored UTC times without their zone: the same moment must read the same
    whether it was just written or read back."""
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


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


class Service:
    """Everything the API does, over one data directory."""

    def __init__(self, root: Path, *, backend: Backend | None = None):
        self.data = DataDir(root)
        self.config: ServerConfig = self.data.load_config()
        self.signing_key = self.data.load_signing_key()
        self.store = Store(self.data.database_url(self.config))
        if backend is None:
            try:
                backend = make_backend(
                    self.config.sandbox, concurrency=self.config.max_concurrent_jobs
                )
            except SandboxError as exc:
                self.store.close()
                raise ConfigError(
                    f"the sandbox backend is unusable, so the server will not start: {exc}"
                ) from exc
        self.backend = backend
        self.trusted_cas: dict[str, Ed25519PublicKey] = {}
        for ca, path in self.config.trusted_cas.items():
            try:
                self.trusted_cas[ca] = load_public_key(self.data.root / path)
            except KeyFileError as exc:
                raise ConfigError(f"trusted CA {ca!r}: {exc}") from exc
        # Interactive steps and background scripts queue separately, each fair across
        # researchers: a researcher's own scripts never delay her answers (their run time is not
        # hers to observe), and nobody's jobs fill every slot.
        self._jobs = FairScheduler(
            self.config.max_concurrent_jobs, self.config.max_jobs_per_researcher
        )
        self._locks: dict[str, threading.Lock] = {}
        # DP ledgers and withhold budgets are shared by every replica: on PostgreSQL their locks
        # are advisory locks too (SQLite: this process's locks only).
        self._dp_locks = SharedLocks(self.store.engine, "dp-ledger", LOCK_TIMEOUT_SECONDS)
        self._budget_locks = SharedLocks(self.store.engine, "withhold-budget", LOCK_TIMEOUT_SECONDS)
        self.auditor = ScopeAuditor(self.data.root, self.store)
        self._ids: dict[int, Any] = {}
        self._population_of: dict[int, Population] = {}  # by dataset version id
        self._locks_guard = threading.Lock()
        # Shared by researchers' and auditors' authentication (their key ids are prefixed).
        # In the database, so that every replica counts every replica's failures.
        self.researchers = Authenticator(
            "researcher", self.store, self.config, DatabaseFailureLimiter(self.store)
        )
        self._rulesets: dict[str, RuleSet] = {}
        self.scripts = ScriptRuns(
            RunContext(
                store=self.store,
                backend=self.backend,
                limits=self.config.sandbox.limits,
                data_root=self.data.root,
                ruleset_for=self.ruleset_for,
            ),
            FairScheduler(self.config.max_concurrent_scripts, self.config.max_jobs_per_researcher),
        )
        resumed = self.scripts.resume()
        if resumed:
            log.info("resumed %d script run(s) left unfinished", resumed)
        self.audit = AuditService(self.store, self.config, self.signing_key, self.auth_limiter)
        log_configuration(
            self.store,
            configuration_record(self.config, self.server_public_key, self.trusted_cas),
        )

    def close(self) -> None:
        self.scripts.close()
        self.backend.close()
        self.store.close()

    def __enter__(self) -> Service:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def server_id(self) -> str:
        return self.config.server_id

    @property
    def server_fingerprint(self) -> str:
        return fingerprint(self.signing_key.public_key())

    @property
    def server_public_key(self) -> str:
        """The server's public key, 32 raw bytes in base64."""
        return base64.b64encode(public_key_raw(self.signing_key.public_key())).decode("ascii")

    # -- authentication -------------------------------------------------------------------------

    @property
    def auth_limiter(self) -> FailureLimiter:
        """The counter of failed authentications, shared by researchers and auditors."""
        return self.researchers.limiter

    @auth_limiter.setter
    def auth_limiter(self, limiter: FailureLimiter) -> None:
        # Both roles keep counting into one limiter (tests swap in an in-memory one).
        self.researchers.limiter = limiter
        if hasattr(self, "audit"):
            self.audit.auth_limiter = limiter

    def check_rate(self, key: str | None, address: str | None, who: str) -> None:
        """Refuse (429) a key id or client address past its limit of authentication failures,
        before its signature is checked."""
        check_rate(self.auth_limiter, key, address, who)

    def authenticate(
        self,
        method: str,
        path: str,
        query: str,
        headers: Mapping[str, str],
        body: bytes,
        address: str | None = None,
    ) -> str:
        """The researcher who signed this request, or raise Unauthenticated (TooManyFailures
        past the rate limit of failures per key id and per address)."""
        return self.researchers.authenticate(method, path, query, headers, body, address)

    # -- catalogue ------------------------------------------------------------------------------

    def ruleset_for(self, dataset: DatasetRow) -> RuleSet:
        """The dataset's rule set: its override file on top of the defaults, else the defaults."""
        # Read the path now, not from the (cached) row: `dataset rules` may have changed it.
        path = current_rules_path(self.store, dataset.id)
        if path is None:
            return DEFAULT_RULESET
        cached = self._rulesets.get(path)
        if cached is None:
            cached = load_ruleset(self.data.root / path, base=DEFAULT_RULESET)
            self._rulesets[path] = cached
        return cached

    def catalogue(self, researcher: str) -> list[DatasetView]:
        """Datasets of the researcher's projects: names, descriptions, column metadata, no data."""
        views = []
        for row in self.store.datasets_for(researcher):
            meta = DatasetMetadata.model_validate(row.dataset_metadata)
            rs = self.ruleset_for(row)
            views.append(
                DatasetView(
                    name=row.name,
                    version=row.version,
                    project=row.project,
                    description=meta.description,
                    rows=row.rows,
                    columns=[c.model_dump(mode="json") for c in meta.columns],
                    ruleset=rs.label,
                    rules={**rs.model_dump(mode="json"), "sha256": rs.content_hash()},
                    neighbours=meta.neighbours.model_dump(mode="json"),
                    dp=self.store.get_dp_config(row.name),
                    dp_budget=budgets.dp_budget(self.store, row, researcher),
                    withhold_budget=budget(self.store, rs, researcher, row.name),
                    mock=published_mock(self.data, row.path, row.version),
                )
            )
        return views

    def mock(self, researcher: str, name: str) -> dict[str, Any]:
        """The published mock of the latest version of a dataset of the researcher's projects:
        the signed manifest and the Parquet file (base64)."""
        rows = [r for r in self.store.datasets_for(researcher) if r.name == name]
        if not rows:
            raise NotFound(f"you have no dataset {name!r}")
        row = max(rows, key=lambda r: r.version)
        signed = published_mock(self.data, row.path, row.version)
        if signed is None:
            raise NotFound(f"dataset {name!r} has no published mock")
        parquet, _ = mock_paths(self.data, row.path, row.version)
        data = parquet.read_bytes()
        if sha256_hex(data) != signed["manifest"]["sha256"]:
            raise Unavailable(f"the mock of {name!r} does not match its signed manifest")
        return {**signed, "data": base64.b64encode(data).decode("ascii")}

    # -- sequences ------------------------------------------------------------------------------

    def _lock(self, sequence_id: str) -> threading.Lock:
        with self._locks_guard:
            return self._locks.setdefault(sequence_id, threading.Lock())

    def _record_ids(self, dataset: DatasetRow) -> Any:
        """The dataset version's positions -> stable record ids (read once per version)."""
        ids = self._ids.get(dataset.id)
        if ids is None:
            ids = read_ids(self.data.root / dataset.path, dataset.rows)
            with self._locks_guard:
                self._ids[dataset.id] = ids
        return ids

    def _populations(self, name: str) -> list[Population]:
        """Every registered version of dataset `name` as a population of record ids: the
        catalogue publishes their row counts, so the auditor admits them before any output."""
        populations = []
        for row in self.store.dataset_versions(name):
            population = self._population_of.get(row.id)
            if population is None:
                population = Population.of(row.version, self._record_ids(row))
                with self._locks_guard:
                    self._population_of[row.id] = population
            populations.append(population)
        return populations

    def _dp_guard(
        self, seq: SequenceRow, dataset: DatasetRow
    ) -> contextlib.AbstractContextManager[None]:
        """Serialises the steps charged to one DP ledger, from reading it to recording the
        charge, on every replica (the store's version check is the backstop); nothing on other
        datasets."""
        raw = self.store.get_dp_config(dataset.name)
        if raw is None:
            return contextlib.nullcontext()
        key, _ = ledger_key(
            dataset.name,
            raw.get("scope", "researcher"),
            researcher=seq.researcher,
            project=seq.project,
        )
        return _holding(self._dp_locks.lock(key), "the privacy ledger of this step")

    def _dp_context(self, seq: SequenceRow, dataset: DatasetRow) -> DPContext | None:
        """The dataset's DP configuration and the ledger this step would be charged to."""
        raw = self.store.get_dp_config(dataset.name)
        if raw is None:
            return None
        config = DPConfig.model_validate(raw)
        key, owner = ledger_key(
            dataset.name, config.scope, researcher=seq.researcher, project=seq.project
        )
        return DPContext(
            config=config,
            dataset=dataset.name,
            key=key,
            owner=owner,
            ledger=self.store.dp_ledger(key),
            ruleset_label=self.ruleset_for(dataset).label,
            ruleset_hash=self.ruleset_for(dataset).content_hash(),
            public_spent=public_spent(self.store, dataset.name),
        )

    def step_file(self, researcher: str, sequence_id: str, index: int) -> bytes:
        """The released file of one of the researcher's steps (synthetic data), hash-checked."""
        from safeaccess.server.synth.step import file_path

        seq = self._own_sequence(researcher, sequence_id)
        step = self.store.get_step(seq.id, index)
        output = step.public_output if step is not None else None
        if (
            step is None
            or StepState(step.state) != StepState.RELEASED
            or not isinstance(output, dict)
            or not isinstance(output.get("file"), dict)
        ):
            raise NotFound(f"step {index} of sequence {sequence_id} has no released file")
        digest = str(output["file"].get("sha256", ""))
        try:
            data = file_path(self.data.root / SYNTH_DIR, digest).read_bytes()
        except (ValueError, OSError) as exc:
            raise NotFound(f"the file of step {index} is not available") from exc
        if sha256_hex(data) != digest:
            raise Unavailable(f"the file of step {index} does not match its recorded hash")
        return data

    def _budget_lock(
        self, researcher: str, dataset: str
    ) -> contextlib.AbstractContextManager[None]:
        """Serialises a researcher's openings on one dataset name, on every replica, so that
        sequences opened at once are each counted against the withhold budget."""
        return _holding(
            self._budget_locks.lock(f"{researcher}\x00{dataset}"),
            "the withhold budget of this dataset",
        )

    def _own_sequence(self, researcher: str, sequence_id: str) -> SequenceRow:
        seq = self.store.get_sequence(sequence_id)
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
    ) -> SequenceVerifier:
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

    def open_sequence(self, researcher: str, request: OpenRequest) -> StepView:
        """Accept a signed header (once) and run step 1."""
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
        if fields.project not in self.store.projects_of(researcher):
            raise Forbidden(f"you are not a member of project {fields.project!r}")
        name, version = _split_dataset(fields.dataset)
        dataset = self.store.find_dataset(name, version)
        if dataset is None or dataset.project != fields.project:
            raise NotFound(f"project {fields.project!r} has no dataset {fields.dataset!r}")
        endorsements = [Endorsement.model_validate(e.model_dump()) for e in request.endorsements]
        verifier = self._verifier(request.header, request.signature, researcher, endorsements, None)
        try:
            verified = verifier.reveal(1, request.trace, request.body)
        except ProtocolError as exc:
            raise _rejected(exc) from exc
        revealed = Revealed.of(request.trace, request.body, last=verified.last)
        required = claim_gate.requirements(self.store, dataset.name)
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
        with self._lock(sequence_id):
            # The budget's lock covers reading the budget and recording the sequence (which then
            # counts as a possible withhold), not the step: it is shared with every replica.
            with self._budget_lock(researcher, dataset.name):
                held, budget_facts = opening_needs_approval(
                    self.store, self.ruleset_for(dataset), researcher, dataset.name
                )
                seq, step = self.store.create_sequence(
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
                        "reveal": self._reveal_data(request.trace, step),
                        "withhold_budget": budget_facts,
                    },
                    awaiting_approval=held,
                )
            if held:
                log.info("sequence %s by %s awaits approval (withhold budget)", seq.id, researcher)
                return self._view(seq, step, revealed)
            return self._compute(seq, step, dataset, revealed)

    def reveal(
        self, researcher: str, sequence_id: str, index: int, request: RevealRequest
    ) -> StepView:
        """Accept the reveal of step `index` after a release, or answer a repeated reveal."""
        with self._lock(sequence_id):
            seq = self._own_sequence(researcher, sequence_id)
            trace_hash = sha256_hex(request.trace)
            body_hash = sha256_hex(request.body)
            existing = self.store.get_step(sequence_id, index)
            if existing is not None:
                if existing.trace_hash != trace_hash or existing.body_hash != body_hash:
                    raise Conflict(
                        f"step {index} was already revealed with another trace or body",
                        code="step_already_revealed",
                    )
                if existing.state == StepState.RUNNING and seq.state == SequenceState.RUNNING:
                    # Computed but never recorded (the server stopped mid-step): run it again.
                    return self._compute(
                        seq,
                        existing,
                        self.store.get_dataset(seq.dataset_id),
                        Revealed.stored(existing.body, last=existing.last),
                    )
                return self._view(seq, existing)
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
            )
            try:
                verified = verifier.reveal(index, request.trace, request.body)
            except ProtocolError as exc:
                # Nothing is persisted: the sequence stays where it was.
                raise _rejected(exc) from exc
            revealed = Revealed.of(request.trace, request.body, last=verified.last)
            claim_gate.check_step(
                verifier.header.dataset,
                claim_gate.requirements_of(self.store, seq.dataset_id),
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
            step = self.store.begin_step(
                sequence_id,
                expected_version=seq.version,
                step=step,
                verifier_state=verifier.state.model_dump(mode="json"),
                event_data=self._reveal_data(request.trace, step),
            )
            seq = self._own_sequence(researcher, sequence_id)
            return self._compute(seq, step, self.store.get_dataset(seq.dataset_id), revealed)

    def _run_data(self) -> dict[str, Any]:
        """What a run starts with, for the audit log."""
        return {
            "backend": self.backend.name,
            "limits": self.config.sandbox.limits.model_dump(mode="json"),
            "runner_version": RUNNER_VERSION,
        }

    def _reveal_data(self, trace: bytes, step: StepRow) -> dict[str, Any]:
        """A reveal as logged: the trace itself (the auditor re-runs the chain from the logged
        header) and the body's digest (the analysis text stays with the centre)."""
        return {
            "trace": trace.hex(),
            "trace_sha256": step.trace_hash,
            "body_sha256": step.body_hash,
            "last": step.last,
            "run": self._run_data(),
        }

    def _settle_data(self, outcome: StepOutcome, ruleset: RuleSet) -> dict[str, Any]:
        """The audit-log fields of a settled step (see `audit_records`); features add their
        decision facts as further keys."""
        decision = outcome.decision or {}
        return {
            "run": {
                **self._run_data(),
                "backend": outcome.backend,
                "wall_seconds": outcome.wall_seconds,
                "error_code": outcome.error_code,
            },
            "checks": {
                "kind": outcome.kind,
                "ruleset": decision.get("ruleset"),
                "ruleset_sha256": outcome.ruleset_hash,
                "verdict": decision.get("verdict"),
                "findings": decision.get("findings", []),
            },
            "ruleset_contents": ruleset.model_dump(mode="json"),
            "leverage": leverage_record(outcome.output, ruleset),
        }

    def _compute(
        self, seq: SequenceRow, step: StepRow, dataset: DatasetRow, revealed: Revealed
    ) -> StepView:
        ruleset = self.ruleset_for(dataset)
        if revealed.is_script:
            return self._queue_script(seq, step, ruleset, revealed)
        metadata = DatasetMetadata.model_validate(dataset.dataset_metadata)
        admission = Admission(
            self.auditor,
            dataset=dataset.name,
            settings=self.store.qss_settings(dataset.name),
            threshold=ruleset.threshold,
            researcher=seq.researcher,
            project=seq.project,
            ids=self._record_ids(dataset),
            populations=lambda: self._populations(dataset.name),
            analysis=revealed.analysis_json,
            metadata=metadata,
        )
        # The DP ledger's lock (if the dataset has DP) covers the run and the record; the
        # scope's lock is taken by the admission and held until the step is recorded.
        with admission, self._dp_guard(seq, dataset):
            dp = self._dp_context(seq, dataset)
            with self._jobs.slot(seq.researcher):
                outcome = run_step(
                    job_id=f"{seq.id}-{step.index}",
                    revealed=revealed,
                    metadata=metadata,
                    dataset_path=self.data.root / dataset.path,
                    backend=self.backend,
                    limits=self.config.sandbox.limits,
                    ruleset=ruleset,
                    audit=admission.admit,
                    n_records=dataset.rows,
                    dp=dp,
                    synth_files=self.data.root / SYNTH_DIR,
                )

            def record(
                outcome: StepOutcome, commit: QssCommit | None, facts: dict[str, Any]
            ) -> tuple[SequenceRow, StepRow]:
                event_data = self._settle_data(outcome, ruleset)
                if outcome.dp_facts is not None:
                    event_data["dp"] = outcome.dp_facts
                if facts:
                    event_data["qss"] = facts
                return self.store.settle_step(
                    seq.id, step.index, outcome, event_data=event_data, qss=commit
                )

            (seq, step), outcome = admission.settle(outcome, record)
        log.info(
            "sequence %s step %d (%s) by %s: %s%s",
            seq.id,
            step.index,
            outcome.kind,
            seq.researcher,
            outcome.state.value,
            f" ({outcome.error_code})" if outcome.error_code else "",
        )
        return self._view(seq, step, revealed)

    def _queue_script(
        self, seq: SequenceRow, step: StepRow, ruleset: RuleSet, revealed: Revealed
    ) -> StepView:
        """Answer a script step "in review" now; run it in the background (script_runs.py)."""
        seq, step = self.store.settle_step(
            seq.id,
            step.index,
            queued_outcome(ruleset),
            event_data={
                "trace_sha256": step.trace_hash,
                "body_sha256": step.body_hash,
                "ruleset_sha256": ruleset.content_hash(),
                "script_run": "queued",
            },
        )
        self.scripts.submit(seq.id, step.index, seq.researcher)
        log.info("sequence %s step %d (script) by %s: queued", seq.id, step.index, seq.researcher)
        return self._view(seq, step, revealed)

    def _budget(self, seq: SequenceRow) -> BudgetView | None:
        dataset = self.store.get_dataset(seq.dataset_id)
        return budget(self.store, self.ruleset_for(dataset), seq.researcher, dataset.name)

    def _reasons(self, step: StepRow, decision: Decision | None) -> list[Reason]:
        state = StepState(step.state)
        if state == StepState.PENDING:
            return [AWAITING_APPROVAL]
        if state not in (StepState.WITHHELD, StepState.REVIEW):
            return []
        if step.kind == "script":
            # Whatever the run did (output, crash, limit): the same reason, from the analysis.
            return script_reasons()
        if decision is None:
            return []
        # A DP budget or risk-limit withhold depends only on the request and the public ledger,
        # so its own message is shown; every other withhold goes through `reasons.py`.
        return public_reasons(decision) or researcher_reasons(decision)

    # -- views ----------------------------------------------------------------------------------

    def _view(self, seq: SequenceRow, step: StepRow, revealed: Revealed | None = None) -> StepView:
        """The researcher's view of a step; `revealed` is the step's parsed body when the step
        was just revealed (a stored step's body is read here)."""
        state = StepState(step.state)
        decision = Decision.model_validate(step.decision) if step.decision else None
        analysis = revealed.shown if revealed is not None else shown_of(step.body)
        dataset = self.store.get_dataset(seq.dataset_id)
        return StepView(
            sequence_id=seq.id,
            index=step.index,
            dataset=dataset.name,
            dataset_version=dataset.version,
            state=state.value,
            last=step.last,
            kind=step.kind,
            analysis=analysis,
            output=step.public_output if state == StepState.RELEASED else None,
            reasons=self._reasons(step, decision),
            error=(
                ErrorInfo(code=step.error_code or "failed", message=step.error_message or "")
                if state == StepState.FAILED
                else None
            ),
            # A script's decision appears only when its run ends: not the researcher's to see.
            ruleset=decision.ruleset if decision and step.kind != "script" else None,
            ruleset_hash=(
                step.ruleset_hash
                if step.kind == "script"
                else decision.ruleset_hash
                if decision
                else None
            ),
            sequence_state=seq.state,
            updated_at=_utc(step.updated_at),
            receipt=sign_receipt(self.signing_key, self.server_id, seq, step),
            review_note=step.review_note if step.reviewer else None,
            withhold_budget=self._budget(seq),
        )

    def _sequence_view(self, seq: SequenceRow) -> SequenceView:
        dataset = self.store.get_dataset(seq.dataset_id)
        return SequenceView(
            id=seq.id,
            header_sha256=seq.header_hash,
            researcher=seq.researcher,
            project=seq.project,
            dataset=dataset.name,
            dataset_version=dataset.version,
            state=SequenceState(seq.state).value,
            current_index=seq.current_index,
            created_at=_utc(seq.created_at),
            updated_at=_utc(seq.updated_at),
            steps=[self._view(seq, s) for s in self.store.steps(seq.id)],
            withhold_budget=self._budget(seq),
        )

    def sequence(self, researcher: str, sequence_id: str) -> SequenceView:
        return self._sequence_view(self._own_sequence(researcher, sequence_id))

    def sequences(self, researcher: str) -> list[SequenceView]:
        return [self._sequence_view(s) for s in self.store.list_sequences(researcher)]

    def step(self, researcher: str, sequence_id: str, index: int) -> StepView:
        seq = self._own_sequence(researcher, sequence_id)
        step = self.store.get_step(sequence_id, index)
        if step is None:
            raise NotFound(f"step {index} of sequence {sequence_id} has not been revealed")
        return self._view(seq, step)

    # -- output checkers ------------------------------------------------------------------------

    def decide_review(
        self,
        sequence_id: str,
        index: int,
        *,
        approve: bool,
        reviewer: str,
        note: str = "",
        mitigation: review.Mitigation | None = None,
    ) -> StepView:
        """An output checker approves (release) or rejects (withhold, abort) a step in review;
        with `mitigation`, releases the table suppressed/rounded under the dataset's rules."""
        with self._lock(sequence_id):
            seq = self.store.get_sequence(sequence_id)
            ruleset = (
                self.ruleset_for(self.store.get_dataset(seq.dataset_id))
                if seq is not None and mitigation is not None
                else None
            )
            review.decide(
                self.store,
                sequence_id,
                index,
                approve=approve,
                reviewer=reviewer,
                note=note,
                mitigation=mitigation,
                ruleset=ruleset,
            )
            seq = self.store.get_sequence(sequence_id)
            step = self.store.get_step(sequence_id, index)
            assert seq is not None and step is not None
            return self._view(seq, step)

    def decide_opening(
        self, sequence_id: str, *, approve: bool, reviewer: str, note: str = ""
    ) -> StepView:
        """An output checker approves or rejects opening a sequence past the withhold budget."""
        with self._lock(sequence_id):
            review.decide_opening(
                self.store, sequence_id, approve=approve, reviewer=reviewer, note=note
            )
            seq = self.store.get_sequence(sequence_id)
            step = self.store.get_step(sequence_id, 1)
            assert seq is not None and step is not None
            return self._view(seq, step)
