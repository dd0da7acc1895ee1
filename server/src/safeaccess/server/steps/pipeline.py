"""One step of a sequence, from a revealed body to an outcome the caller records.

`run_step` reads top to bottom in three stages:
- `_admit`: what the analysis alone decides, before any data is touched (validity against the
  dataset's metadata, model parameters, DP refusals and DP/synthetic-data budget plans);
- `_run`: the sandbox job, and the mapping of its failures (`failures.py`: a data-dependent
  failure is a withhold, a centre's failure raises `Unavailable` and records nothing, so the
  step can be re-run);
- `_decide`: a DP answer or a synthetic-data release returns early with its noise as its
  protection; any other output is mitigated (if asked), checked by the rules, admitted by the
  query-set auditor (`qss/admission.py`, which the caller binds to the scope's state as
  `StepContext.audit`) and becomes the outcome.

The function is pure apart from the sandbox run; the caller records the outcome in one
transaction.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from safeaccess.client.analyses import Analysis, ModelTraining, SyntheticData
from safeaccess.client.dpquery import DP_QUERY_TYPES
from safeaccess.client.validation import AnalysisInvalid, validate
from safeaccess.rules.checks.models import param_problems as model_param_problems
from safeaccess.rules.engine import check
from safeaccess.rules.mitigation import MitigationError
from safeaccess.rules.outputs import (
    DPStatisticOutput,
    SynthTablesOutput,
    public,
)
from safeaccess.rules.ruleset import RuleSet
from safeaccess.sandbox.backend import (
    AnalysisFailed,
    Job,
    JobCrashed,
    LimitExceeded,
    Limits,
    RunResult,
    SandboxError,
)
from safeaccess.sandbox.release import mitigate_output
from safeaccess.server import dp as dp_release
from safeaccess.server import metrics
from safeaccess.server.digests import json_hash
from safeaccess.server.errors import Unavailable
from safeaccess.server.outcome import VERDICT_STATE, StepOutcome
from safeaccess.server.states import StepState
from safeaccess.server.steps.context import Audit as Audit
from safeaccess.server.steps.context import StepContext as StepContext
from safeaccess.server.steps.failures import failure_decision, is_data_dependent
from safeaccess.server.steps.revealed import SCRIPT_KIND, Revealed
from safeaccess.server.synth import step as synth_step


def _failed(code: str, message: str, kind: str | None) -> StepOutcome:
    return StepOutcome(state=StepState.FAILED, kind=kind, error_code=code, error_message=message)


def _withheld(code: str, message: str, kind: str, ruleset: RuleSet) -> StepOutcome:
    """A data-dependent failure: to the researcher exactly a withhold (see `failures.py`); the
    code and message stay on the step for output checkers."""
    decision = failure_decision(code, message, ruleset)
    return StepOutcome(
        state=StepState.WITHHELD,
        kind=kind,
        decision=decision.model_dump(mode="json"),
        ruleset_hash=decision.ruleset_hash,
        error_code=code,
        error_message=message,
    )


def lost_outcome(kind: str, ruleset: RuleSet, attempts: int) -> StepOutcome:
    """A step whose worker hosts all died under it: a withhold (see `failures.py`)."""
    return _withheld(
        "worker_lost",
        f"the worker running this step stopped {attempts} times (its lease expired)",
        kind,
        ruleset,
    )


@dataclass(frozen=True)
class _Admitted:
    """A step the analysis alone allows to run: its analysis, limits and budget plans."""

    analysis: Analysis
    limits: Limits
    dp_plan: dp_release.DPPlan | None = None
    synth_plan: synth_step.SynthPlan | None = None

    @property
    def kind(self) -> str:
        return self.analysis.kind


def _unavailable(code: str) -> Unavailable:
    return Unavailable(
        f"the sandbox could not run this step ({code}); retry the same reveal later",
        code="sandbox_unavailable",
    )


def run_step(revealed: Revealed, context: StepContext) -> StepOutcome:
    """Compute and check one revealed step (its body parsed once, in `revealed`). Raises
    `Unavailable` when the centre, not the analysis, failed (the step stays re-runnable)."""
    admitted = _admit(revealed, context)
    if isinstance(admitted, StepOutcome):
        return admitted
    result = _run(admitted, context)
    if isinstance(result, StepOutcome):
        return result
    return _decide(admitted, result, context)


def _admit(revealed: Revealed, context: StepContext) -> _Admitted | StepOutcome:
    """Parse, validate, check model parameters, refuse or plan DP: all before any data."""
    analysis = revealed.analysis
    if analysis is None:
        assert revealed.error is not None
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'analysis'}: {err['msg']}"
            for err in revealed.error.errors()[:5]
        )
        return _failed("invalid_analysis", f"the analysis is not valid: {problems}", None)
    kind, metadata, ruleset, dp = analysis.kind, context.metadata, context.ruleset, context.dp
    try:
        validate(analysis, metadata)
    except AnalysisInvalid as exc:
        return _failed("invalid_analysis", str(exc), kind)
    if isinstance(analysis, ModelTraining):
        limits_broken = model_param_problems(
            analysis.family, analysis.params.model_dump(), len(analysis.features), ruleset
        )
        if limits_broken:
            return _failed("invalid_analysis", "; ".join(limits_broken), kind)
    refused = dp_release.refusal(kind, dp.config if dp else None, metadata.name)
    if refused is not None:
        return _failed(*refused, kind)
    dp_plan: dp_release.DPPlan | None = None
    if dp is not None and isinstance(analysis, DP_QUERY_TYPES):
        planned = dp_release.plan(analysis, metadata, dp)
        if isinstance(planned, StepOutcome):
            return planned  # over budget or policy: decided before any data is touched
        dp_plan = planned
    synth_plan: synth_step.SynthPlan | None = None
    if dp is not None and isinstance(analysis, SyntheticData):
        synth_planned = synth_step.plan(analysis, metadata, dp, ruleset)
        if isinstance(synth_planned, StepOutcome):
            return synth_planned  # invalid, over budget or policy: decided before any data
        synth_plan = synth_planned
    limits = context.limits
    if context.n_records is not None:
        limits = limits.model_copy(
            update={"max_output_bytes": limits.max_output_bytes + 4 * context.n_records + 64}
        )
    return _Admitted(analysis, limits, dp_plan, synth_plan)


def _run(admitted: _Admitted, context: StepContext) -> RunResult | StepOutcome:
    """The sandbox job; its failures as outcomes, or `Unavailable` for the centre's own."""
    kind, ruleset = admitted.kind, context.ruleset
    job = Job(
        job_id=context.job_id,
        analysis=admitted.analysis.model_dump(mode="json"),
        metadata=context.metadata.model_dump(mode="json"),
        dataset=context.dataset_path,
        limits=admitted.limits,
    )
    backend = context.backend.name
    metrics.SANDBOX_RUNS.labels(backend=backend).inc()
    try:
        return context.backend.run(job)
    except SandboxError as exc:
        # (the analysis's own failures too: the dashboard tells them apart by reason)
        metrics.SANDBOX_FAILURES.labels(backend=backend, reason=exc.code).inc()
        return _failure_outcome(exc, kind, ruleset)


def _failure_outcome(exc: SandboxError, kind: str, ruleset: RuleSet) -> StepOutcome:
    """A sandbox run's failure as the step's outcome, or `Unavailable` for the centre's own."""
    if isinstance(exc, AnalysisFailed):
        # Runner messages and codes for declarative kinds come from our own code. A script
        # controls the runner process and can answer on its response pipe itself, so neither its
        # error text nor its error code may reach the researcher: both could carry data.
        if kind == SCRIPT_KIND:
            return _failed("script_failed", "the script failed", kind)
        if is_data_dependent(exc.runner_code):
            return _withheld(exc.runner_code, str(exc), kind, ruleset)
        return _failed(exc.runner_code, str(exc), kind)
    if isinstance(exc, LimitExceeded):
        message = f"the analysis exceeded the {exc.limit} limit"
        if kind == SCRIPT_KIND:
            return _failed("limit_exceeded", message, kind)
        # How long or how much memory a declarative analysis takes depends on the records.
        return _withheld("limit_exceeded", message, kind, ruleset)
    if isinstance(exc, JobCrashed) and kind == SCRIPT_KIND:
        # The script controls its process: a crash or a forged answer is its own doing. Were
        # it a retryable outage, the researcher could re-run the script without limit and
        # without review, reading data from whether (and when) it crashes.
        return _failed("script_crashed", "the script ended without a valid result", kind)
    raise _unavailable(exc.code) from exc


def _decide(admitted: _Admitted, result: RunResult, context: StepContext) -> StepOutcome:
    """Mitigate, check, audit: the outcome of a run (a DP answer or synthetic data returns
    early, its protection being the noise)."""
    analysis, kind, ruleset, dp = admitted.analysis, admitted.kind, context.ruleset, context.dp
    if admitted.synth_plan is not None and dp is not None:
        assert isinstance(result.output, SynthTablesOutput)  # the backend checked the type
        assert isinstance(analysis, SyntheticData) and context.synth_files is not None
        try:
            outcome = synth_step.release(
                analysis, admitted.synth_plan, result.output.facts.tables, context, admitted.limits
            )
        except ValueError as exc:  # the sandbox's tables do not have the declared layout
            raise _unavailable("job_crashed") from exc
        return replace(outcome, backend=result.backend, wall_seconds=result.wall_seconds)
    if admitted.dp_plan is not None and dp is not None:
        # Differential privacy branch: the answer's protection is the noise, so no rule
        # checks, no differencing history and no query-set auditor apply.
        assert isinstance(result.output, DPStatisticOutput)  # the backend checked the type
        assert isinstance(analysis, DP_QUERY_TYPES)
        try:
            outcome = dp_release.answer(analysis, admitted.dp_plan, result.output, dp)
        except dp_release.LayoutMismatch as exc:
            raise _unavailable("job_crashed") from exc
        return replace(outcome, backend=result.backend, wall_seconds=result.wall_seconds)
    try:
        output = mitigate_output(result.output, analysis, ruleset)
    except MitigationError as exc:
        return _failed("mitigation_failed", str(exc), kind)
    decision = check(output, ruleset)
    if context.audit is not None:
        decision = context.audit(output, decision)
    # The stored output keeps the query set's labels only: its per-record array is folded into
    # the scope's audit state and never stored with the output.
    full = output.model_dump(mode="json")
    return StepOutcome(
        state=VERDICT_STATE[decision.verdict],
        kind=kind,
        output=full,
        public_output=public(output),
        output_hash=json_hash(full),
        decision=decision.model_dump(mode="json"),
        ruleset_hash=decision.ruleset_hash,
        backend=result.backend,
        wall_seconds=result.wall_seconds,
    )
