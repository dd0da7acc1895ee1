"""The controller service: the facade the HTTP layer, the admin CLI and the tests call.

It wires the parts together and keeps their public method names: `auth.py` authenticates
researchers, `steps/flow.py` opens sequences and runs their steps, `steps/views.py` shows them,
`datasets.py` gives each dataset's rule set and the catalogue, `review/decisions.py` takes the output
checkers' decisions, `auditors.py` serves the auditors.
"""

from __future__ import annotations

import base64
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from safeaccess.client.keys import KeyFileError, fingerprint, load_public_key, public_key_raw
from safeaccess.rules.qss.admit import pin_one_blas_thread
from safeaccess.rules.ruleset import RuleSet
from safeaccess.sandbox.backend import Backend, SandboxError
from safeaccess.sandbox.factory import make_backend
from safeaccess.server import datasets, metrics
from safeaccess.server.auditors import (
    AuditService,
    configuration_record,
    log_configuration,
)
from safeaccess.server.auth import AUTHENTICATION_FAILED as AUTHENTICATION_FAILED
from safeaccess.server.auth import Authenticator, SignedRequest
from safeaccess.server.config import DataDir, ServerConfig
from safeaccess.server.digests import sha256_hex
from safeaccess.server.errors import ConfigError, NotFound, Unavailable
from safeaccess.server.qss.scope import LOCK_TIMEOUT_SECONDS
from safeaccess.server.ratelimit import DatabaseFailureLimiter, FailureLimiter
from safeaccess.server.readiness import ReadinessCheck, announce_sandbox
from safeaccess.server.review import decisions as review
from safeaccess.server.schemas import (
    DatasetView,
    OpenRequest,
    SequenceView,
    StepView,
)
from safeaccess.server.states import StepState
from safeaccess.server.steps.flow import Flow
from safeaccess.server.steps.orphans import OrphanSweeper
from safeaccess.server.steps.scheduler import FairScheduler
from safeaccess.server.steps.scripts import RunContext, ScriptRuns
from safeaccess.server.steps.views import AWAITING_APPROVAL as AWAITING_APPROVAL
from safeaccess.server.steps.views import Views
from safeaccess.server.store import Store, catalogue, queue
from safeaccess.server.store.queue import step_job
from safeaccess.server.store.schema import DatasetRow
from safeaccess.server.synth.mock import mock_paths, published_mock
from safeaccess.server.synth.step import FILES_DIR as SYNTH_DIR

if TYPE_CHECKING:  # PostgreSQL only (see Service.__init__)
    from safeaccess.server.store.sequence_leases import SequenceLeases
    from safeaccess.server.store.settled import SettledListener

log = logging.getLogger("safeaccess.server")

Role = Literal["api", "worker"]


#: How long closing a service waits for the auditor's background writes.
COMPACTION_WAIT_SECONDS = 60.0


class Service:
    """Everything the API does, over one data directory."""

    def __init__(self, root: Path, *, backend: Backend | None = None, role: Role = "api"):
        """`role`: "api" serves requests; "worker" (`safeaccess-server worker`) runs the
        queue's jobs through the same flow, and neither waits for steps nor logs the
        configuration (the API replicas do)."""
        # Every admission would otherwise set and restore the limit (`pin_one_blas_thread`).
        pin_one_blas_thread()
        self.data = DataDir(root)
        self.role = role
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
        # Shared by researchers' and auditors' authentication (their key ids are prefixed).
        # In the database, so that every replica counts every replica's failures.
        self.researchers = Authenticator(
            "researcher", self.store, self.config, DatabaseFailureLimiter(self.store)
        )
        self.rulesets = datasets.Rulesets(self.store, self.data.root)
        queued = self.config.execution == "queue"
        replicas_run_steps = (
            not queued and role == "api" and self.store.engine.dialect.name == "postgresql"
        )
        self.scripts = ScriptRuns(
            RunContext(
                store=self.store,
                backend=self.backend,
                limits=self.config.sandbox.limits,
                data_root=self.data.root,
                ruleset_for=self.ruleset_for,
            ),
            FairScheduler(self.config.max_concurrent_scripts, self.config.max_jobs_per_researcher),
            enqueue=self._enqueue_script if queued else None,
        )
        self.views = Views(self.store, self.signing_key, self.server_id, self.ruleset_for)
        # Both speak to PostgreSQL through psycopg, which only the `postgresql` extra installs:
        # imported here, where PostgreSQL is configured, so that SQLite needs no extra.
        listener: SettledListener | None = None
        leases: SequenceLeases | None = None
        if queued and role == "api":
            from safeaccess.server.store.settled import SettledListener

            listener = SettledListener(self.data.database_url(self.config))
        if replicas_run_steps:
            from safeaccess.server.store.sequence_leases import SequenceLeases

            leases = SequenceLeases(self.data.database_url(self.config), LOCK_TIMEOUT_SECONDS)
        self.flow = Flow(
            data=self.data,
            config=self.config,
            store=self.store,
            backend=self.backend,
            researchers=self.researchers,
            trusted_cas=self.trusted_cas,
            scripts=self.scripts,
            ruleset_for=self.ruleset_for,
            views=self.views,
            listener=listener,
            leases=leases,
        )
        # Replicas running steps themselves on PostgreSQL run again the steps of one that died.
        self.orphans = OrphanSweeper(self.flow) if replicas_run_steps else None
        self.audit = AuditService(self.store, self.config, self.signing_key, self.auth_limiter)
        self.readiness = ReadinessCheck(self)
        announce_sandbox(self.backend, role)
        # The queue's state in the metrics, from the API replicas (the workers report their
        # own runs; each replica reports the same cluster-wide queue: take their maximum).
        self._stop_queue_metrics = (
            metrics.register_queue(self.store) if queued and role == "api" else None
        )
        if role == "api":
            resumed = self.scripts.resume()
            if resumed:
                log.info("resumed %d script run(s) left unfinished", resumed)
            log_configuration(
                self.store,
                configuration_record(self.config, self.server_public_key, self.trusted_cas),
            )

    def _enqueue_script(self, sequence_id: str, index: int, researcher: str) -> None:
        """Queue a script run that has no job (after a restart, execution = "queue")."""
        with self.store.transaction() as s:
            queue.ensure(
                s,
                step_job(
                    self.config,
                    sequence_id=sequence_id,
                    index=index,
                    researcher=researcher,
                    dataset="",
                    script=True,
                ),
            )

    def close(self) -> None:
        if self._stop_queue_metrics is not None:
            self._stop_queue_metrics()
            self._stop_queue_metrics = None
        if self.orphans is not None:
            self.orphans.close()
        # The auditor's full states being written in the background are written before the
        # service lets go of its data directory (a caller may remove it next).
        self.flow.auditor.files.flush(timeout=COMPACTION_WAIT_SECONDS)
        if self.flow.leases is not None:
            self.flow.leases.close()
        if self.flow.listener is not None:
            self.flow.listener.close()
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

    # -- authentication (auth.py) ---------------------------------------------------------------

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

    def authenticate_key(self, request: SignedRequest) -> tuple[str, Ed25519PublicKey]:
        """The researcher who signed this request and the key the signature was checked
        against, or raise Unauthenticated (TooManyFailures past the rate limit of failures per
        key id and per address)."""
        return self.researchers.authenticate_key(request)

    # -- catalogue (datasets.py) ----------------------------------------------------------------

    def ruleset_for(self, dataset: DatasetRow) -> RuleSet:
        """The dataset's rule set: its override file on top of the defaults, else the defaults."""
        return self.rulesets.ruleset_for(dataset)

    def catalogue(self, researcher: str) -> list[DatasetView]:
        """Datasets of the researcher's projects: names, descriptions, column metadata, no data."""
        return datasets.catalogue(
            self.store,
            self.data,
            self.ruleset_for,
            researcher,
            self.config.timing,
            reserve=self.config.reserve_standard_tables,
        )

    def mock(self, researcher: str, name: str) -> dict[str, Any]:
        """The published mock of the latest version of a dataset of the researcher's projects:
        the signed manifest and the Parquet file (base64)."""
        rows = [r for r in catalogue.datasets_for(self.store, researcher) if r.name == name]
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

    # -- sequences (steps/flow.py, steps/views.py) ----------------------------------------------

    def open_sequence(
        self, researcher: str, request: OpenRequest, *, key: Ed25519PublicKey | None = None
    ) -> StepView:
        """Accept a signed header (once) and run step 1; `key` is the researcher's key as the
        request's authentication read it (None: read it now)."""
        return self.flow.open_sequence(researcher, request, key=key)

    def sequence(self, researcher: str, sequence_id: str) -> SequenceView:
        return self.views.sequence(self.flow.own_sequence(researcher, sequence_id))

    def sequences(self, researcher: str) -> list[SequenceView]:
        return [self.views.sequence(s) for s in self.store.list_sequences(researcher)]

    def step(self, researcher: str, sequence_id: str, index: int) -> StepView:
        seq = self.flow.own_sequence(researcher, sequence_id)
        step = self.store.get_step(sequence_id, index)
        if step is None:
            raise NotFound(f"step {index} of sequence {sequence_id} has not been revealed")
        return self.views.step(seq, step)

    def step_file(self, researcher: str, sequence_id: str, index: int) -> bytes:
        """The released file of one of the researcher's steps (synthetic data), hash-checked."""
        from safeaccess.server.synth.step import file_path

        seq = self.flow.own_sequence(researcher, sequence_id)
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
        with self.flow.lock(sequence_id):
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
            return self.views.step(seq, step)

    def decide_opening(
        self, sequence_id: str, *, approve: bool, reviewer: str, note: str = ""
    ) -> StepView:
        """An output checker approves or rejects opening a sequence past the withhold budget."""
        with self.flow.lock(sequence_id):
            review.decide_opening(
                self.store, sequence_id, approve=approve, reviewer=reviewer, note=note
            )
            seq = self.store.get_sequence(sequence_id)
            step = self.store.get_step(sequence_id, 1)
            assert seq is not None and step is not None
            return self.views.step(seq, step)
