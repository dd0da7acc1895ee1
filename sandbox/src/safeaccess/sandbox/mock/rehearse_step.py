"""One analysis of a plan rehearsed on a mock: the one implementation both rehearsals run.

The centre's rehearsal (`safeaccess.server.steps.rehearsal`) and the offline one
(`safeaccess.sandbox.mock.offline`) call `rehearse_step` after their own refusals (the analysis
against the metadata, the DP setting, the budget): a model's parameter limits, then the runner's
compute code on the mock, the same release view and mitigations as the real step
(`safeaccess.sandbox.release`) and the dataset's output rules. Kinds whose release a mock cannot
stand in for are "not_rehearsed", with a note in plain words.

The answer is a plain dict shaped as the centre's `RehearsalStep` (the server validates it into
its schema; the offline client keeps the dict).
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from safeaccess.client.analyses import (
    DP_KINDS,
    SYNTH_KINDS,
    Analysis,
    FrequencyTable,
    Histogram,
    MagnitudeTable,
    ModelTraining,
    StatTest,
    Summary,
)
from safeaccess.client.metadata import DatasetMetadata
from safeaccess.rules.checks.models import param_problems
from safeaccess.rules.engine import check
from safeaccess.rules.ruleset import RuleSet
from safeaccess.sandbox.backend import RunnerRequest
from safeaccess.sandbox.failures import DECIDABLE_RUNNER_CODES
from safeaccess.sandbox.release import mitigate_output
from safeaccess.sandbox.runner import run_request

DISCLAIMER = (
    "A rehearsal on a mock predicts nothing about the real verdicts: the mock has the declared "
    "columns, levels, bounds and row count, and the published coarse shares of missing values "
    "and exact zeros, but values drawn independently, so real cells, groups and fits differ. "
    "Only what is refused by the analysis alone is certain."
)

SCRIPT_NOTE = "a script is not run on the mock; its output always goes to an output checker"
DP_NOTE = (
    "a DP answer is protected by its noise, not by output rules; only its budget is checked "
    "before sealing"
)
# Its release is decided by the noise and by the disclosure check of the sampled records
# against the real ones, neither of which a mock can stand in for.
SYNTH_NOTE = (
    "synthetic data is protected by its noise and released after a disclosure check of the "
    "sampled records against the real ones; only its budget is checked before sealing"
)


def refused_step(index: int, kind: str, message: str) -> dict[str, Any]:
    """A step refused by the analysis alone, whatever the data."""
    return {
        "index": index,
        "kind": kind,
        "refused": [message],
        "mock_verdict": "failed",
        "checks": [],
    }


def rehearse_step(
    index: int,
    analysis: Analysis,
    metadata: DatasetMetadata,
    frame: pd.DataFrame,
    rs: RuleSet,
    *,
    dp_mock: bool = False,
) -> dict[str, Any]:
    """Rehearse `analysis` (already checked against the metadata and the DP setting) on
    `frame`, the mock of `metadata`, under rule set `rs`; `dp_mock` when `frame` is the
    dataset's published DP mock rather than the mock drawn from the metadata."""
    kind = analysis.kind
    step: dict[str, Any] = {"index": index, "kind": kind, "refused": [], "checks": []}
    if isinstance(analysis, ModelTraining):
        broken = param_problems(
            analysis.family, analysis.params.model_dump(), len(analysis.features), rs
        )
        if broken:
            return {**step, "refused": list(broken), "mock_verdict": "failed"}
    not_rehearsed = (
        SCRIPT_NOTE
        if kind == "script"
        else DP_NOTE
        if kind in DP_KINDS
        else SYNTH_NOTE
        if kind in SYNTH_KINDS
        else None
    )
    if not_rehearsed is not None:
        return {**step, "mock_verdict": "not_rehearsed", "note": not_rehearsed}
    request = RunnerRequest(
        analysis=analysis.model_dump(mode="json"),
        metadata=metadata.model_dump(mode="json"),
        dataset_path="mock",
    )
    response = run_request(request, frame)
    if not response.ok or response.output is None:
        error = response.error
        code = error.code if error is not None else "analysis_failed"
        message = error.message if error is not None else "no output"
        if code not in DECIDABLE_RUNNER_CODES:
            # On real data such a failure is a withhold (`safeaccess.server.steps.failures`).
            note = (
                f"on the mock the computation failed ({code}: {message}); on real data such a "
                "failure is a withhold"
            )
            return {**step, "mock_verdict": "withhold", "note": note}
        return {**step, "refused": [message], "mock_verdict": "failed"}
    decision = check(mitigate_output(response.output, analysis, rs), rs)
    checks = [
        {"check": f.check, "verdict": f.verdict, "item": f.item, "message": f.message}
        for f in decision.findings
        if f.verdict != "release"
    ]
    out = {**step, "mock_verdict": decision.verdict, "checks": checks}
    joint = joint_note(analysis, dp_mock=dp_mock)
    if joint is not None and decision.verdict == "release":
        out["note"] = joint
    return out


def _joint_columns(analysis: Analysis) -> list[str]:
    """The columns whose combinations make the answer's cells (two or more: joint groups)."""
    if isinstance(analysis, FrequencyTable | MagnitudeTable):
        return [*analysis.rows, *analysis.cols]
    if isinstance(analysis, Histogram):
        return [*analysis.by, analysis.variable] if analysis.by else []
    if isinstance(analysis, Summary):
        return list(analysis.by)
    if isinstance(analysis, StatTest) and analysis.rows and analysis.cols:
        return [analysis.rows, analysis.cols]
    return []


def joint_note(analysis: Analysis, *, dp_mock: bool = False) -> str | None:
    """What a release on the mock cannot tell about cells of two or more columns together.

    The mock draws each column on its own from its published one-way shares; which cells of two
    columns are small is not published (docs/server.md, "Column profiles": a small-cell
    statement is a class disclosure waiting to happen and an unbudgeted oracle), so a cell small
    only in combination is small on the mock by chance alone. The published DP mock models
    pairs of columns, but with noise larger than the threshold on each cell, so the same holds."""
    names = _joint_columns(analysis)
    if len(names) < 2:
        return None
    drawn = (
        f"the DP mock's cells of {', '.join(names)} carry noise larger than the threshold"
        if dp_mock
        else f"the mock draws {', '.join(names)} each on its own"
    )
    head = (
        f"{drawn}, so a cell small only in their "
        "combination (a rare region among women) is not reproduced: on the real data such a "
    )
    if isinstance(analysis, FrequencyTable | MagnitudeTable):
        if analysis.mitigations.suppress:
            return head + "cell is suppressed, as you asked"
        return head + "cell withholds the table; ask for suppression (suppress=True) instead"
    return head + "cell withholds the step; group by fewer or coarser columns if one may be rare"
