"""Rehearse an unsealed plan on a mock of the dataset built from its published metadata.

Each analysis goes through the refusals that depend on the analysis alone (the DP budget, risk
limit and setting via `budgets.plan_check`; a model's parameter limits), then the same compute
code as the sandbox (`safeaccess.sandbox.runner.run_request`) on the mock, the same mitigations
and the same output rules of the dataset's rule set. Nothing touches the real records, nothing is
logged, stored or charged, and everything in the answer is computable from the metadata and the
request: the mock (`safeaccess.sandbox.mock.data`) is drawn from the metadata alone (with the
coarse shares of missing values and zeros registration published) with a seed fixed by the
dataset's name and version. The step itself is `safeaccess.sandbox.mock.rehearse_step`, the
same code the offline rehearsal runs.

What it does not rehearse, and says so: scripts (they always go to an output checker), DP answers
and synthetic data (their protection is noise, and synthetic data's release a check against the
real records; only the budget is checked), and the query-set audit
across outputs (it depends on what was released, which a mock cannot stand in for).
"""

from __future__ import annotations

from collections.abc import Callable

from safeaccess.client.analyses import parse_analysis
from safeaccess.client.metadata import DatasetMetadata
from safeaccess.rules.ruleset import RuleSet
from safeaccess.sandbox.mock.data import mock_frame, mock_notes, mock_rows
from safeaccess.sandbox.mock.rehearse_step import DISCLAIMER, refused_step, rehearse_step
from safeaccess.server.errors import InvalidRequest
from safeaccess.server.schemas import PlanCheckRequest, RehearsalStep, RehearsalView
from safeaccess.server.steps import budgets
from safeaccess.server.store.database import Database
from safeaccess.server.store.schema import DatasetRow

#: Most analyses one rehearsal runs (each is computed on the mock in the API process).
MAX_REHEARSED = 100


def rehearse(
    store: Database,
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
            step = refused_step(index, str(body.get("kind")), refused[index])
        else:
            # The same step code as the offline rehearsal (`safeaccess.sandbox.mock.offline`).
            step = rehearse_step(index, parse_analysis(body), metadata, frame, rs)
        steps.append(RehearsalStep.model_validate(step))
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
