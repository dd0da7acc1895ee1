"""The DP mock of a dataset: the synthetic-data pipeline over every non-identifier column, run by
the controller, charged once to the dataset's public ledger and, after the checks pass,
published with a manifest signed by the centre's key.

Every scope ledger of the dataset composes with the public one: a release fits only if
mu_public^2 + mu_scope^2 + its own charge stays within the dataset's budget (`public_spent` of
`DPContext`), and a mock fits only if it keeps every existing scope ledger within it.
"""

from __future__ import annotations

import base64
import json
import math
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from safeaccess.client.analyses import SYNTH_MAX_EPSILON, SyntheticData
from safeaccess.client.metadata import HIDDEN_TYPES, DatasetMetadata
from safeaccess.client.protocol import canonical
from safeaccess.client.synthetic import SynthInvalid
from safeaccess.rules.dp import GaussianLedger
from safeaccess.rules.outputs import SynthTablesOutput
from safeaccess.rules.ruleset import RuleSet
from safeaccess.sandbox.backend import Backend, Job, Limits, SandboxError
from safeaccess.server.config import DataDir, DPConfig
from safeaccess.server.errors import ConfigError, InvalidRequest
from safeaccess.server.outcome import DPCharge
from safeaccess.server.store import catalogue, ledgers
from safeaccess.server.store.database import Database
from safeaccess.server.synth.measure import measure
from safeaccess.server.synth.protocol import WorkerMeasurement, WorkerRequest
from safeaccess.server.synth.step import _check, check_job, decode, workload, write_parquet
from safeaccess.server.synth.worker_client import SynthWorkerFailed, run_worker

PUBLIC = "public"
DEFAULT_MU = 0.2
DEFAULT_ROWS = 1000
MAX_ROWS = 10_000


def public_ledger_key(dataset: str) -> str:
    """The dataset-wide public ledger every scope ledger composes with."""
    return f"{dataset}|{PUBLIC}|{PUBLIC}"


def public_spent(store: Database, dataset: str) -> float:
    return ledgers.dp_ledger(store, public_ledger_key(dataset)).spent


def mock_paths(data: DataDir, dataset_path: str, version: int) -> tuple[Path, Path]:
    """(Parquet file, signed manifest) of a dataset version's published mock."""
    folder = (data.root / dataset_path).parent
    return folder / f"v{version}.mock.parquet", folder / f"v{version}.mock.json"


@dataclass(frozen=True)
class MockResult:
    verdict: str
    published: bool
    manifest: dict[str, Any]
    check: dict[str, Any]
    public_before: float
    public_after: float


def sign_manifest(key: Ed25519PrivateKey, manifest: dict[str, Any]) -> str:
    """Base64 Ed25519 signature over the manifest's canonical JSON (RFC 8785)."""
    return base64.b64encode(key.sign(canonical.dumps(manifest))).decode("ascii")


def make_mock(
    data: DataDir,
    store: Database,
    backend: Backend,
    signing_key: Ed25519PrivateKey,
    ruleset: RuleSet,
    limits: Limits,
    name: str,
    *,
    mu: float = DEFAULT_MU,
    rows: int = DEFAULT_ROWS,
    publish: bool = False,
) -> MockResult:
    """Generate (and, with `publish` and passing checks, publish) the mock of `name`'s latest
    version. Refusals that depend only on the request and the ledgers raise before anything runs;
    once the noise is drawn the public ledger is charged whatever the verdict."""
    if not 1 <= rows <= MAX_ROWS:
        raise InvalidRequest(f"--rows must be 1..{MAX_ROWS}, got {rows}")
    if not (math.isfinite(mu) and mu > 0):
        raise InvalidRequest(f"mu must be a positive number, got {mu}")
    row = catalogue.find_dataset(store, name)
    if row is None:
        raise InvalidRequest(f"no dataset {name!r}")
    raw = catalogue.get_dp_config(store, name)
    if raw is None:
        raise ConfigError(
            f"dataset {name!r} has no DP budget: enable it with 'safeaccess-server dataset dp' "
            "first (the mock is charged to its public ledger)"
        )
    config = DPConfig.model_validate(raw)
    metadata = DatasetMetadata.model_validate(row.dataset_metadata)
    columns = [c.name for c in metadata.columns if c.type not in HIDDEN_TYPES and not c.contributor]
    allowed = GaussianLedger().remaining_for(config.epsilon, config.delta)
    pub = ledgers.dp_ledger(store, public_ledger_key(name))
    charge = mu * mu
    worst = max(
        [pub.spent]
        + [pub.spent + r.spent for r in ledgers.dp_ledgers(store, name) if r.scope != PUBLIC]
    )
    if worst + charge > allowed:
        raise InvalidRequest(
            f"the mock's mu^2 = {charge:.6g} does not fit: the public ledger holds "
            f"{pub.spent:.6g} and the fullest scope ledger with it {worst:.6g} of {allowed:.6g} "
            f"(epsilon {config.epsilon:g} at delta {config.delta:g}); ask for a smaller --mu"
        )
    epsilon = GaussianLedger(spent=charge, releases=1).epsilon_at(config.delta)
    analysis = SyntheticData(
        columns=columns,
        epsilon=min(epsilon, SYNTH_MAX_EPSILON),
        delta=config.delta,
        rows=rows,
    )
    try:
        work = workload(analysis, metadata, ruleset)
    except SynthInvalid as exc:  # e.g. a date column without date_bounds: nothing has run
        why = "; ".join(message for _, message in exc.problems)
        raise InvalidRequest(f"the mock of {name!r} cannot be made: {why}") from exc
    job_id = f"mock-{name}-v{row.version}-{datetime.now(UTC).strftime('%Y%m%d%H%M%S')}"
    dataset_file = data.root / row.path
    try:
        result = backend.run(
            Job(
                job_id=job_id,
                analysis=analysis.model_dump(mode="json"),
                metadata=metadata.model_dump(mode="json"),
                dataset=dataset_file,
                limits=limits,
            )
        )
    except SandboxError as exc:
        raise ConfigError(f"the sandbox could not compute the mock's tables: {exc}") from exc
    assert isinstance(result.output, SynthTablesOutput)
    m = metadata.neighbours.records_per_unit
    released = measure(work, result.output.facts.tables, mu, m)
    request = WorkerRequest(
        domain=[(c.name, c.size) for c in work.columns],
        measurements=[
            WorkerMeasurement(
                clique=[work.columns[i].name for i in x.clique],
                values=x.values.tolist(),
                sigma=x.sigma,
            )
            for x in released.all
        ],
        rows=rows,
    )
    try:
        fitted = run_worker(request)
    except SynthWorkerFailed as exc:  # nothing left the centre: nothing charged
        raise ConfigError(f"the synthesis failed: {exc}; run the command again") from exc
    parquet, manifest_path = mock_paths(data, row.path, row.version)
    staging = parquet.parent / ".mock-staging"
    file = write_parquet(
        decode(fitted.codes, work), staging, {"mock": 1, "dataset": name, "mu": released.mu}
    )
    facts = _check(
        check_job(job_id, analysis, fitted.codes, metadata, dataset_file, limits, ruleset),
        backend,
        ruleset,
    )
    after = GaussianLedger(spent=pub.spent, releases=pub.releases).charge(released.mu, 1.0)
    names = [[work.columns[i].name for i in x.clique] for x in released.all]
    manifest = {
        "dataset": name,
        "version": row.version,
        "rows": file.rows,
        "sha256": file.sha256,
        "mu": released.mu,
        "epsilon": epsilon,
        "delta": config.delta,
        "sigmas": [released.sigma_oneway, released.sigma_selection, released.sigma_cliques],
        "tree": [[work.columns[a].name, work.columns[b].name] for a, b in released.tree],
        "workload": names,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "mock": True,
    }
    published = publish and facts.verdict == "release"
    ledgers.charge_public_ledger(
        store,
        DPCharge(
            key=public_ledger_key(name),
            dataset=name,
            scope=PUBLIC,
            owner=PUBLIC,
            version=pub.version,
            spent_after=after.spent,
            releases_after=after.releases,
        ),
        event_data={
            "mock": manifest,
            "published": published,
            "public_spent_before": pub.spent,
            "public_spent_after": after.spent,
            "check": facts.model_dump(mode="json"),
        },
    )
    staged = staging / f"{file.sha256}.parquet"
    if published:
        staged.replace(parquet)
        signed = {"manifest": manifest, "signature": sign_manifest(signing_key, manifest)}
        tmp = manifest_path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(signed, sort_keys=True))
        tmp.replace(manifest_path)
    else:
        staged.unlink(missing_ok=True)
    return MockResult(
        verdict=facts.verdict,
        published=published,
        manifest=manifest,
        check=facts.model_dump(mode="json"),
        public_before=pub.spent,
        public_after=after.spent,
    )


def published_mock(data: DataDir, dataset_path: str, version: int) -> dict[str, Any] | None:
    """The signed manifest of a version's published mock (None when none is published)."""
    _, manifest_path = mock_paths(data, dataset_path, version)
    if not manifest_path.exists():
        return None
    signed: dict[str, Any] = json.loads(manifest_path.read_text())
    return signed
