"""Rehearse an unsealed plan on a mock of the dataset built from its published metadata.

Each analysis goes through the refusals that depend on the analysis alone (the DP budget, risk
limit and setting via `budgets.plan_check`; a model's parameter limits), then the same compute
code as the sandbox (`safeaccess.sandbox.runner.run_request`) on the mock, the same mitigations
and the same output rules of the dataset's rule set. Nothing touches the real records, nothing is
logged, stored or charged, and everything in the answer is computable from the metadata and the
request: the mock (`safeaccess.sandbox.mock.data`) is drawn from the metadata alone with a
seed fixed by the dataset's name and version.

What it does not rehearse, and says so: scripts (they always go to an output checker), DP answers
and synthetic data (their protection is noise, and synthetic data's release a check against the
real records; only the budget is checked), and the query-set audit
across outputs (it depends on what was released, which a mock cannot stand in for).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pandas as pd

from safeaccess.client.analyses import DP_KINDS, SYNTH_KINDS, ModelTraining, parse_analysis
from safeaccess.client.metadata import DatasetMetadata
from safeaccess.rules.checks.models import param_problems
from safeaccess.rules.engine import check
from safeaccess.rules.ruleset import RuleSet
from safeaccess.sandbox.backend import RunnerRequest
from safeaccess.sandbox.mock.data import mock_frame, mock_notes, mock_rows
from safeaccess.sandbox.runner import run_request
from safeaccess.server.errors import InvalidRequest
from safeaccess.server.schemas import (
    PlanCheckRequest,
    Reason,
    RehearsalStep,
    RehearsalView,
)
from safeaccess.server.steps import budgets
from safeaccess.server.steps.failures import is_data_dependent
from safeaccess.server.steps.pipeline import mitigate_output
from safeaccess.server.store import Store
from safeaccess.server.store.schema import DatasetRow

#: Most analyses one rehearsal runs (each is computed on the mock in the API process).
MAX_REHEARSED = 100

DISCLAIMER = (
    "A rehearsal on a mock predicts nothing about the real verdicts: the mock has the declared "
    "columns, levels, bounds and row count but values drawn uniformly and independently, so "
    "real cells, groups and fits differ. Only what is refused by the analysis alone is certain."
)


def _step(
    index: int, body: dict[str, Any], metadata: DatasetMetadata, frame: pd.DataFrame, rs: RuleSet
) -> RehearsalStep:
    analysis = parse_analysis(body)
    kind = analysis.kind
    if isinstance(analysis, ModelTraining):
        broken = param_problems(
            analysis.family, analysis.params.model_dump(), len(analysis.features), rs
        )
        if broken:
            return RehearsalStep(index=index, kind=kind, refused=broken, mock_verdict="failed")
    if kind == "script":
        return RehearsalStep(
            index=index,
            kind=kind,
            mock_verdict="not_rehearsed",
            note="a script is not run on the mock; its output always goes to an output checker",
        )
    if kind in DP_KINDS:
        return RehearsalStep(
            index=index,
            kind=kind,
            mock_verdict="not_rehearsed",
            note="a DP answer is protected by its noise, not by output rules; only its budget "
            "is checked before sealing",
        )
    if kind in SYNTH_KINDS:
        # Its release is decided by the noise and by the disclosure check of the sampled records
        # against the real ones, neither of which a mock can stand in for.
        return RehearsalStep(
            index=index,
            kind=kind,
            mock_verdict="not_rehearsed",
            note="synthetic data is protected by its noise and released after a disclosure "
            "check of the sampled records against the real ones; only its budget is checked "
            "before sealing",
        )
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
        if is_data_dependent(code):
            return RehearsalStep(
                index=index,
                kind=kind,
                mock_verdict="withhold",
                note=f"on the mock the computation failed ({code}: {message}); on real data "
                "such a failure is a withhold",
            )
        return RehearsalStep(index=index, kind=kind, refused=[message], mock_verdict="failed")
    output = mitigate_output(response.output, analysis, rs)
    decision = check(output, rs)
    return RehearsalStep(
        index=index,
        kind=kind,
        mock_verdict=decision.verdict,
        checks=[
            Reason(check=f.check, verdict=f.verdict, item=f.item, message=f.message)
            for f in decision.findings
            if f.verdict != "release"
        ],
    )


def rehearse(
    store: Store,
    ruleset_of: Callable[[DatasetRow], RuleSet],
    researcher: str,
    name: str,
    request: PlanCheckRequest,
) -> RehearsalView:
    """Rehearse the plan in `request` on the mock of dataset `name` (see the module doc)."""
    if len(request.analyses) > MAX_REHEARSED:
        raise InvalidRequest(f"a rehearsal runs at most {MAX_REHEARSED} analyses")
    checked = budgets.plan_check(store, researcher, name, request)  # validates every analysis
    dataset = budgets.dataset_for(store, researcher, name, request.version)
    metadata = DatasetMetadata.model_validate(dataset.dataset_metadata)
    rs = ruleset_of(dataset)
    frame = mock_frame(metadata, dataset.rows, dataset.version)
    refused = {p.index: p.message for p in checked.problems}
    steps = []
    for index, body in enumerate(request.analyses):
        if index in refused:
            kind = str(body.get("kind"))
            steps.append(
                RehearsalStep(
                    index=index, kind=kind, refused=[refused[index]], mock_verdict="failed"
                )
            )
            continue
        steps.append(_step(index, body, metadata, frame, rs))
    return RehearsalView(
        dataset=dataset.name,
        version=dataset.version,
        rows=dataset.rows,
        mock_rows=mock_rows(dataset.rows),
        ruleset=rs.label,
        notes=mock_notes(metadata, dataset.rows),
        disclaimer=DISCLAIMER,
        steps=steps,
    )
