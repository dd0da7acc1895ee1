"""One `synthetic_data` step on the server: budget, noise, fit, file, disclosure check, outcome.

1. `plan`: the workload from the analysis and metadata (the rule set's `synth_max_*` limits), mu
   from (epsilon, delta), the budget and risk-limit checks against the ledger - all before the
   sandbox runs, so a refusal depends only on the request and the public ledger.
2. `release`: the exact tables from sandbox job 1 are noised here (`measure.py`), the worker
   process fits and samples (`worker_client.py`), the records are decoded and written as Parquet
   under the data directory, and sandbox job 2 checks them against the real records. The ledger
   charge (mu^2, whatever the verdict: the noise was drawn) travels in the outcome and is written
   in the step's transaction. A crash before that transaction releases and charges nothing, and a
   re-run draws fresh noise (docs/dp.md).
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import secrets
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import date
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from safeaccess.client.analyses import SyntheticData
from safeaccess.client.metadata import DatasetMetadata
from safeaccess.client.synthetic import (
    EPOCH_ORDINAL,
    SynthColumn,
    SynthInvalid,
    SynthWorkload,
    synth_workload,
)
from safeaccess.rules.decision import Decision, Finding
from safeaccess.rules.dp import GaussianLedger, gaussian_mu_for, risk_report
from safeaccess.rules.outputs import (
    DPRisk,
    SynthCheckFacts,
    SynthCheckOutput,
    SynthColumnView,
    SyntheticDataOutput,
    SynthFile,
    SynthMeasurement,
    SynthPrivacy,
    SynthReleaseFacts,
    SynthUtility,
    public,
)
from safeaccess.rules.ruleset import RuleSet
from safeaccess.sandbox.backend import (
    AnalysisFailed,
    Backend,
    Job,
    LimitExceeded,
    Limits,
    SandboxError,
)
from safeaccess.server.dp import DPContext, _withheld, config_hash, ledger_view, policy_refusal
from safeaccess.server.errors import Unavailable
from safeaccess.server.outcome import StepOutcome
from safeaccess.server.states import StepState
from safeaccess.server.steps.context import StepContext
from safeaccess.server.synth.measure import Measurement, SynthMeasurements, measure
from safeaccess.server.synth.protocol import WorkerMeasurement, WorkerRequest
from safeaccess.server.synth.worker_client import SynthWorkerFailed, run_worker

#: Released synthetic files, under the data directory, named by their SHA-256.
FILES_DIR = "synthetic"
#: The check job's kind (built by the server only; `runner.SYNTH_CHECK`).
CHECK_KIND = "synthetic_check"
_STATE = {"release": StepState.RELEASED, "review": StepState.REVIEW, "withhold": StepState.WITHHELD}


@dataclass(frozen=True)
class SynthPlan:
    work: SynthWorkload
    mu: float
    records_per_unit: int
    ledger_after: GaussianLedger


def workload(analysis: SyntheticData, metadata: DatasetMetadata, ruleset: RuleSet) -> SynthWorkload:
    """The workload under the rule set's limits; raises `SynthInvalid` naming the problem."""
    return synth_workload(
        analysis,
        metadata,
        max_cells=ruleset.synth_max_cells,
        max_model_cells=ruleset.synth_max_model_cells,
        max_rows=ruleset.synth_max_rows,
    )


def plan(
    analysis: SyntheticData, metadata: DatasetMetadata, context: DPContext, ruleset: RuleSet
) -> SynthPlan | StepOutcome:
    """The workload and mu, or the outcome refusing the step (invalid, over budget, policy)."""
    try:
        work = workload(analysis, metadata, ruleset)
    except SynthInvalid as exc:
        return StepOutcome.invalid(analysis.kind, str(exc))
    m = metadata.neighbours.records_per_unit
    mu = gaussian_mu_for(analysis.epsilon, analysis.delta)
    cfg = context.config
    ledger = GaussianLedger(spent=context.ledger.spent, releases=context.ledger.releases)
    facts = {"mu": mu, "records_per_unit": m, "ledger": context.key, "spent_before": ledger.spent}
    composed = GaussianLedger(spent=ledger.spent + context.public_spent, releases=ledger.releases)
    if not composed.fits(mu, 1.0, cfg.epsilon, cfg.delta):
        remaining = composed.remaining_for(cfg.epsilon, cfg.delta)
        return _withheld(
            analysis.kind,
            "dp_budget",
            f"the privacy budget of this {cfg.scope} on dataset {context.dataset!r} does not "
            f"cover this synthetic release: it would add mu^2 = {mu * mu:.6g} (epsilon "
            f"{analysis.epsilon:g}, delta {analysis.delta:g}) but only {remaining:.6g} remains "
            f"(epsilon {ledger.epsilon_at(cfg.delta):.6g} of {cfg.epsilon:g} spent at delta "
            f"{cfg.delta:g}"
            + (
                f", with the dataset's published mock's {context.public_spent:.6g}"
                if context.public_spent
                else ""
            )
            + "); ask for a smaller epsilon.",
            context,
            facts,
        )
    refused = policy_refusal(
        analysis.kind,
        risk_report(mu, 1.0).tpr_at(0.05),
        ("synthetic release", f"mu {mu:.6g}"),
        "ask for a smaller epsilon",
        context,
        facts,
    )
    if refused is not None:
        return refused
    return SynthPlan(work, mu, m, ledger.charge(mu, 1.0))


# -- decoding and the file ----------------------------------------------------------------------


def _as_dates(days: np.ndarray, null: np.ndarray) -> pd.Series:
    """Day numbers (ordinals) as dates at midnight, NaT where null: what the centre stores for a
    date column (`datasets.as_dates`), so code written on synthetic records or the mock (e.g.
    `.dt.year`) runs alike on the sandbox's frame."""
    stamps = (days - EPOCH_ORDINAL).astype("datetime64[D]").astype("datetime64[ms]")
    stamps[null] = np.datetime64("NaT")
    return pd.Series(stamps)


def _decode_column(codes: np.ndarray, col: SynthColumn, rng: np.random.Generator) -> pd.Series:
    """Values of one column: its level, or a uniform draw in its bin (integers and dates: a
    uniform integer, a date's day number), clipped to the bounds; the null code is missing."""
    null = codes == col.null_code if col.null_code is not None else np.zeros(codes.size, bool)
    safe = np.where(null, 0, codes)
    if col.levels is not None:
        labels = np.asarray(col.levels, dtype=object)[safe]
        labels[null] = None
        if all(isinstance(v, int) for v in col.levels):
            return pd.Series(labels, dtype="Int64")
        return pd.Series(labels, dtype=object)
    assert col.edges is not None and col.bounds is not None
    edges = np.asarray(col.edges, dtype=np.float64)
    lo, hi = edges[safe], edges[safe + 1]
    if col.type in ("integer", "date"):
        last = safe == len(edges) - 2
        low = np.ceil(lo)
        high = np.where(last, np.floor(hi), np.ceil(hi) - 1)
        high = np.maximum(high, low)
        x = np.floor(low + rng.random(codes.size) * (high - low + 1))
        x = np.clip(x, math.ceil(col.bounds[0]), math.floor(col.bounds[1]))
        if col.type == "date":
            return _as_dates(x.astype(np.int64), null)
        out = pd.Series(x.astype(np.int64), dtype="Int64")
    else:
        x = np.clip(lo + rng.random(codes.size) * (hi - lo), col.bounds[0], col.bounds[1])
        out = pd.Series(x, dtype="Float64")
    out[null] = pd.NA
    return out


def decode(codes: np.ndarray, work: SynthWorkload) -> pd.DataFrame:
    """The synthetic records as values, in a random order (post-processing: OS randomness)."""
    rng = np.random.default_rng(secrets.randbits(128))
    order = rng.permutation(codes.shape[0])
    return pd.DataFrame(
        {c.name: _decode_column(codes[order, i], c, rng) for i, c in enumerate(work.columns)}
    )


def write_parquet(frame: pd.DataFrame, directory: Path, meta: dict[str, Any]) -> SynthFile:
    """Write `frame` as `<sha256>.parquet` in `directory` (atomically); its hash and size."""
    table = pa.Table.from_pandas(frame, preserve_index=False)
    kv = {
        **(table.schema.metadata or {}),
        b"safeaccess.synthetic": b"1",
        b"safeaccess.release": json.dumps(meta, sort_keys=True).encode(),
    }
    buffer = io.BytesIO()
    pq.write_table(table.replace_schema_metadata(kv), buffer)
    data = buffer.getvalue()
    digest = hashlib.sha256(data).hexdigest()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{digest}.parquet"
    if not path.exists():
        tmp = directory / f".{digest}.{secrets.token_hex(4)}.tmp"
        tmp.write_bytes(data)
        os.chmod(tmp, 0o640)
        os.replace(tmp, path)
    return SynthFile(sha256=digest, rows=len(frame), bytes=len(data))


def file_path(directory: Path, sha256: str) -> Path:
    """Where a released synthetic file lives (the hash is checked to be hex)."""
    if len(sha256) != 64 or any(ch not in "0123456789abcdef" for ch in sha256):
        raise ValueError("not a SHA-256")
    return directory / f"{sha256}.parquet"


# -- reports ------------------------------------------------------------------------------------


def _counts(codes: np.ndarray, work: SynthWorkload, clique: tuple[int, ...]) -> np.ndarray:
    flat = np.zeros(codes.shape[0], dtype=np.int64)
    for i in clique:
        flat = flat * work.columns[i].size + codes[:, i]
    return np.bincount(flat, minlength=work.cells(clique)).astype(np.float64)


def utility(
    codes: np.ndarray, work: SynthWorkload, released: SynthMeasurements
) -> list[SynthUtility]:
    """TVD of the synthetic marginals to the noisy ones, and the TVD noise alone would give:
    released quantities only (the real marginals would disclose more)."""
    out = []
    n_hat = max(released.total, 1.0)
    for m in released.all:
        syn = _counts(codes, work, m.clique)
        noisy = np.clip(m.values, 0.0, None)
        p = syn / syn.sum() if syn.sum() > 0 else syn
        q = noisy / noisy.sum() if noisy.sum() > 0 else noisy
        out.append(
            SynthUtility(
                clique=[work.columns[i].name for i in m.clique],
                tvd=float(0.5 * np.abs(p - q).sum()),
                expected_noise_tvd=float(
                    m.values.size * m.sigma * math.sqrt(2 / math.pi) / (2 * n_hat)
                ),
            )
        )
    return out


def _names(work: SynthWorkload, clique: tuple[int, ...]) -> list[str]:
    return [work.columns[i].name for i in clique]


def _column_views(work: SynthWorkload) -> list[SynthColumnView]:
    return [
        SynthColumnView(
            name=c.name,
            type=c.type,
            levels=list(c.levels) if c.levels is not None else None,
            bins=list(c.edges) if c.edges is not None else None,
            date_bins=[date.fromordinal(int(e)).isoformat() for e in c.edges]
            if c.type == "date" and c.edges is not None
            else None,
            nullable=c.nullable,
        )
        for c in work.columns
    ]


# -- the step -----------------------------------------------------------------------------------


def check_job(
    job_id: str,
    analysis: SyntheticData,
    codes: np.ndarray,
    metadata: DatasetMetadata,
    dataset: Path,
    limits: Limits,
    ruleset: RuleSet,
) -> Job:
    """Sandbox job 2: the synthetic codes travel in the request, the real data stay put."""
    from safeaccess.sandbox.runner.compute.synthetic import encode_codes

    return Job(
        job_id=f"{job_id}-check",
        analysis={
            "kind": CHECK_KIND,
            "analysis": analysis.model_dump(mode="json"),
            "synthetic": encode_codes(codes),
            "rules": asdict(ruleset.synth_rules),
            # key sets and samples reproducible per step, unknown to nobody but the centre
            "seed": int.from_bytes(hashlib.sha256(job_id.encode()).digest()[:4], "big"),
        },
        metadata=metadata.model_dump(mode="json"),
        dataset=dataset,
        limits=limits,
    )


def _check(job: Job, backend: Backend, ruleset: RuleSet) -> SynthCheckFacts:
    """The check's facts; a check that cannot run gives the rule set's error action."""
    try:
        result = backend.run(job)
    except (AnalysisFailed, LimitExceeded) as exc:
        action = ruleset.synth_action_on_check_error
        return SynthCheckFacts(
            verdict=action,
            outcomes=[
                {"rule": "synth_action_on_check_error", "action": action, "detail": str(exc)}
            ],
            checks={},
            error=str(exc),
        )
    except SandboxError as exc:
        raise Unavailable(
            f"the sandbox could not run this step ({exc.code}); retry the same reveal later",
            code="sandbox_unavailable",
        ) from exc
    assert isinstance(result.output, SynthCheckOutput)  # the backend checked the type
    return result.output.facts


def worker_request(
    analysis: SyntheticData, work: SynthWorkload, measured: Sequence[Measurement]
) -> WorkerRequest:
    """What the data-less worker fits and samples: the domain, the noisy marginals and the
    researcher's `rows` (None: the noisy total)."""
    return WorkerRequest(
        domain=[(c.name, c.size) for c in work.columns],
        measurements=[
            WorkerMeasurement(
                clique=_names(work, m.clique), values=m.values.tolist(), sigma=m.sigma
            )
            for m in measured
        ],
        rows=analysis.rows,
    )


def release(
    analysis: SyntheticData,
    synth_plan: SynthPlan,
    tables: list[list[float]],
    step: StepContext,
    limits: Limits,
    *,
    worker_timeout: float = 600.0,
) -> StepOutcome:
    """Noise, fit, write, check; the outcome with its ledger charge. `step` is the step's
    context (its DP context, dataset, backend, rule set and files directory, all set for a
    synthetic-data step); `limits` the admitted job's limits, which its check job runs under."""
    assert step.dp is not None and step.synth_files is not None  # a synthetic step's context
    context, files, ruleset = step.dp, step.synth_files, step.ruleset
    work = synth_plan.work
    released = measure(work, tables, synth_plan.mu, synth_plan.records_per_unit)
    request = worker_request(analysis, work, released.all)
    try:
        fitted = run_worker(request, timeout=worker_timeout)
    except SynthWorkerFailed as exc:
        # Nothing has left the centre: no charge, and the re-run draws fresh noise.
        raise Unavailable(
            f"the synthesis could not complete ({exc}); retry the same reveal later",
            code="synth_unavailable",
        ) from exc
    codes = fitted.codes
    frame = decode(codes, work)
    cfg = context.config
    meta = {
        "mu": released.mu,
        "epsilon": analysis.epsilon,
        "delta": analysis.delta,
        "method": work.method,
        "cliques": [_names(work, m.clique) for m in released.all],
    }
    file = write_parquet(frame, files, meta)
    try:
        facts = _check(
            check_job(
                step.job_id, analysis, codes, step.metadata, step.dataset_path, limits, ruleset
            ),
            step.backend,
            ruleset,
        )
    except Unavailable:
        # nothing is recorded: the re-run writes its own file (fresh noise, another hash)
        file_path(files, file.sha256).unlink(missing_ok=True)
        raise
    risk = risk_report(released.mu, 1.0)
    ledger_after = GaussianLedger(
        spent=context.ledger.spent, releases=context.ledger.releases
    ).charge(released.mu, 1.0)
    output = SyntheticDataOutput(
        file=file,
        columns=_column_views(work),
        privacy=SynthPrivacy(
            mu=released.mu,
            epsilon=analysis.epsilon,
            delta=analysis.delta,
            method=work.method,
            sigma_oneway=released.sigma_oneway,
            sigma_selection=released.sigma_selection,
            sigma_cliques=released.sigma_cliques,
            noisy_scores=released.noisy_scores.tolist()
            if released.noisy_scores is not None
            else None,
            tree=[_names(work, e) for e in released.tree],
            cliques=[_names(work, m.clique) for m in released.cliques],
            noisy_total=released.total,
            noisy_total_sd=released.total_sd,
            risk=DPRisk(
                tpr_at_fpr={f"{a:g}": risk.tpr_at(a) for a in (0.01, 0.05, 0.1)},
                auc=risk.auc,
            ),
            ledger=ledger_view(context, ledger_after),
        ),
        measurements=[
            SynthMeasurement(clique=_names(work, m.clique), values=m.values.tolist(), sigma=m.sigma)
            for m in released.all
        ],
        utility=utility(codes, work, released),
        checks={
            "result": "passed" if facts.verdict == "release" else facts.verdict,
            "ruleset": ruleset.label,
            "ruleset_sha256": ruleset.content_hash(),
        },
        facts=SynthReleaseFacts(
            records_per_unit=synth_plan.records_per_unit,
            charge=ledger_after.spent - context.ledger.spent,
            check=facts,
        ),
    )
    findings = [
        Finding(
            check=o.get("rule", "synth"),
            verdict=o.get("action", "review"),
            message=o.get("detail", ""),
        )
        for o in facts.outcomes
    ] or [
        Finding(
            check="synthetic_data",
            verdict="release",
            message=f"MST-style synthesis at mu {released.mu:.6g}; every synth_* check passed",
        )
    ]
    decision = Decision(
        verdict=facts.verdict,
        findings=findings,
        ruleset=ruleset.label,
        ruleset_hash=ruleset.content_hash(),
    )
    full = output.model_dump(mode="json")
    return StepOutcome(
        state=_STATE[facts.verdict],
        kind=analysis.kind,
        output=full,
        public_output=public(output),
        output_hash=hashlib.sha256(json.dumps(full, sort_keys=True).encode()).hexdigest(),
        decision=decision.model_dump(mode="json"),
        ruleset_hash=decision.ruleset_hash,
        dp_charge=context.charge(ledger_after),
        dp_facts={
            "verdict": facts.verdict,
            "ledger": context.key,
            "scope": cfg.scope,
            "mu": released.mu,
            "charge": output.facts.charge,
            "spent_before": context.ledger.spent,
            "spent_after": ledger_after.spent,
            "releases_after": ledger_after.releases,
            "config_sha256": config_hash(cfg),
            "synthetic": {
                "file_sha256": file.sha256,
                "tree": [_names(work, e) for e in released.tree],
                "sigmas": [released.sigma_oneway, released.sigma_selection, released.sigma_cliques],
                "noisy_total": released.total,
                "check": facts.model_dump(mode="json"),
            },
        },
    )


__all__ = [
    "Measurement",
    "SynthPlan",
    "decode",
    "file_path",
    "plan",
    "release",
    "worker_request",
    "workload",
]
