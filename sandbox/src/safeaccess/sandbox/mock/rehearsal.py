"""Rehearse a plan on a published DP mock, locally, with the runner's own compute code.

No sandbox, no centre, no budget: every analysis runs on the mock's records as the runner would
run it on the real ones, and rule-checked outputs go through the default output rules. Every
result is a statement about the mock: it predicts nothing about the real data's results or
verdicts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd

from safeaccess.client.analyses import DP_KINDS, SYNTH_KINDS, Analysis
from safeaccess.client.metadata import DatasetMetadata
from safeaccess.client.validation import AnalysisInvalid, validate

LABEL = "REHEARSAL ON A DP MOCK: results predict nothing about the real data or its verdicts"


@dataclass(frozen=True)
class MockStep:
    index: int
    kind: str
    outcome: str  # what the step did on the mock
    detail: str


@dataclass(frozen=True)
class MockRehearsal:
    steps: tuple[MockStep, ...]

    def __str__(self) -> str:
        lines = [LABEL]
        for s in self.steps:
            lines.append(f"  step {s.index} ({s.kind}): {s.outcome} - {s.detail}")
        return "\n".join(lines)


def rehearse_on_mock(
    analyses: Sequence[Analysis], mock: pd.DataFrame, metadata: DatasetMetadata
) -> MockRehearsal:
    """Run each analysis on the mock's records; report per step what happened."""
    from safeaccess.rules.engine import check
    from safeaccess.sandbox.runner import execute
    from safeaccess.sandbox.runner.compute._common import AnalysisError

    frame = mock.reset_index(drop=True)
    steps = []
    for i, analysis in enumerate(analyses, start=1):
        kind = analysis.kind
        try:
            validate(analysis, metadata)
        except AnalysisInvalid as exc:
            steps.append(MockStep(i, kind, "invalid", str(exc)))
            continue
        if kind == "script":
            steps.append(MockStep(i, kind, "not run", "scripts run only in the centre's sandbox"))
            continue
        try:
            output = execute(analysis, frame, metadata)
        except AnalysisError as exc:
            steps.append(MockStep(i, kind, "failed on the mock", exc.message))
            continue
        except Exception as exc:  # a mock can break an analysis the real data would not
            steps.append(MockStep(i, kind, "failed on the mock", type(exc).__name__))
            continue
        if kind in DP_KINDS:
            steps.append(
                MockStep(i, kind, "computed", "exact statistic on the mock; the centre adds noise")
            )
        elif kind in SYNTH_KINDS:
            steps.append(
                MockStep(
                    i, kind, "computed", "exact tables on the mock; the centre noises and fits"
                )
            )
        else:
            decision = check(output, None)
            steps.append(MockStep(i, kind, f"rules on the mock: {decision.verdict}", output.type))
    return MockRehearsal(tuple(steps))
