"""One step of a sequence, from a verified body to a recorded outcome.

parse analysis -> validate against dataset metadata -> sandbox run -> mitigations (if the analysis
asks for them) -> rules check with the release history -> decision. The function is pure apart
from the sandbox run; the caller records the outcome in one transaction. Failures of the analysis
itself (invalid, bad filter, limits) become a `failed` outcome; failures of the centre (sandbox
unavailable) raise `Unavailable` and record nothing, so the step can be re-run.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import rfc8785
from pydantic import TypeAdapter, ValidationError

from safeaccess.client.analyses import Analysis, parse_analysis
from safeaccess.client.metadata import DatasetMetadata
from safeaccess.client.validation import AnalysisInvalid, validate
from safeaccess.rules.engine import check
from safeaccess.rules.mitigation import MitigationError, mitigate
from safeaccess.rules.outputs import Output, public
from safeaccess.rules.ruleset import RuleSet
from safeaccess.sandbox.backend import (
    AnalysisFailed,
    Backend,
    Job,
    JobCrashed,
    LimitExceeded,
    Limits,
    SandboxError,
)
from safeaccess.server.errors import Unavailable
from safeaccess.server.failures import failure_decision, is_data_dependent
from safeaccess.server.states import StepState
from safeaccess.server.store import StepOutcome

_OUTPUT: TypeAdapter[Output] = TypeAdapter(Output)
_VERDICT_STATE = {
    "release": StepState.RELEASED,
    "withhold": StepState.WITHHELD,
    "review": StepState.REVIEW,
}


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def json_hash(value: Any) -> str:
    """SHA-256 of the canonical JSON (RFC 8785) of a value: stable across processes."""
    return sha256_hex(rfc8785.dumps(value))


def load_outputs(raw: Sequence[dict[str, Any]]) -> list[Output]:
    """Typed outputs from their stored JSON."""
    return [_OUTPUT.validate_python(item) for item in raw]


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


def _parse(body: bytes) -> Analysis:
    return parse_analysis(body)


def _mitigate(output: Output, analysis: Analysis, ruleset: RuleSet) -> Output:
    mitigations = getattr(analysis, "mitigations", None)
    if mitigations is None or (mitigations.round_to is None and not mitigations.suppress):
        return output
    result: Output = mitigate(
        output, ruleset, round_to=mitigations.round_to, suppress=mitigations.suppress
    )
    return result


def run_step(
    *,
    job_id: str,
    body: bytes,
    metadata: DatasetMetadata,
    dataset_path: Path,
    backend: Backend,
    limits: Limits,
    ruleset: RuleSet,
    history: Sequence[Output],
) -> StepOutcome:
    """Compute and check one revealed step. Raises `Unavailable` when the centre, not the
    analysis, failed (the step stays re-runnable)."""
    try:
        analysis = _parse(body)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'analysis'}: {err['msg']}"
            for err in exc.errors()[:5]
        )
        return _failed("invalid_analysis", f"the analysis is not valid: {problems}", None)
    kind = analysis.kind
    try:
        validate(analysis, metadata)
    except AnalysisInvalid as exc:
        return _failed("invalid_analysis", str(exc), kind)
    job = Job(
        job_id=job_id,
        analysis=analysis.model_dump(mode="json"),
        metadata=metadata.model_dump(mode="json"),
        dataset=dataset_path,
        limits=limits,
    )
    try:
        result = backend.run(job)
    except AnalysisFailed as exc:
        # Runner messages and codes for declarative kinds come from our own code. A script
        # controls the runner process and can answer on its response pipe itself, so neither its
        # error text nor its error code may reach the researcher: both could carry data.
        if kind == "script":
            return _failed("script_failed", "the script failed", kind)
        if is_data_dependent(exc.runner_code):
            return _withheld(exc.runner_code, str(exc), kind, ruleset)
        return _failed(exc.runner_code, str(exc), kind)
    except LimitExceeded as exc:
        message = f"the analysis exceeded the {exc.limit} limit"
        if kind == "script":
            return _failed("limit_exceeded", message, kind)
        # How long or how much memory a declarative analysis takes depends on the records.
        return _withheld("limit_exceeded", message, kind, ruleset)
    except JobCrashed as exc:
        if kind == "script":
            # The script controls its process: a crash or a forged answer is its own doing. Were
            # it a retryable outage, the researcher could re-run the script without limit and
            # without review, reading data from whether (and when) it crashes.
            return _failed("script_crashed", "the script ended without a valid result", kind)
        raise Unavailable(
            f"the sandbox could not run this step ({exc.code}); retry the same reveal later",
            code="sandbox_unavailable",
        ) from exc
    except SandboxError as exc:
        raise Unavailable(
            f"the sandbox could not run this step ({exc.code}); retry the same reveal later",
            code="sandbox_unavailable",
        ) from exc
    try:
        output = _mitigate(result.output, analysis, ruleset)
    except MitigationError as exc:
        return _failed("mitigation_failed", str(exc), kind)
    # The history makes the engine check differencing and reconstruction across releases.
    decision = check(output, ruleset, history=history)
    full = output.model_dump(mode="json")
    released = public(output)
    return StepOutcome(
        state=_VERDICT_STATE[decision.verdict],
        kind=kind,
        output=full,
        public_output=released,
        output_hash=json_hash(full),
        decision=decision.model_dump(mode="json"),
        ruleset_hash=decision.ruleset_hash,
        backend=result.backend,
        wall_seconds=result.wall_seconds,
    )
