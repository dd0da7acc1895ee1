"""What a researcher may know before sealing: her budgets, and what her plan is doomed by.

Both depend only on public state the researcher could compute herself: the DP configuration and
the ledger of her scope (its remaining budget is already stated in every DP budget refusal and
every DP answer), her own withholds, and the analyses she sends. Nothing here reads data.

`plan_check` runs each analysis of an unsealed plan through the same refusals the pipeline
applies before the sandbox (a kind the dataset's DP setting refuses; a DP request the ledger or
the controller's risk limit cannot cover, with the plan's earlier DP requests counted as spent),
so the researcher finds out before binding herself, instead of paying a withhold for it.
"""

from __future__ import annotations

import math

from safeaccess.client.analyses import (
    DP_KINDS,
    DPCount,
    DPHistogram,
    DPMean,
    DPMeanTest,
    DPSum,
    parse_analysis,
)
from safeaccess.client.metadata import DatasetMetadata
from safeaccess.client.validation import AnalysisInvalid, validate
from safeaccess.rules.decision import Decision
from safeaccess.rules.dp import GaussianLedger, gaussian_epsilon
from safeaccess.server import dp as dp_release
from safeaccess.server.config import DPConfig, ledger_key
from safeaccess.server.dp import DPContext, DPPlan
from safeaccess.server.errors import InvalidRequest, NotFound
from safeaccess.server.outcome import DPLedgerState, StepOutcome
from safeaccess.server.schemas import DPBudgetView, PlanCheckRequest, PlanCheckView, PlanProblem
from safeaccess.server.store import catalogue, ledgers
from safeaccess.server.store.database import Database
from safeaccess.server.store.schema import DatasetRow


def dataset_for(store: Database, researcher: str, name: str, version: int | None) -> DatasetRow:
    """The dataset version of the researcher's projects, or NotFound (as for a missing one)."""
    rows = [r for r in catalogue.datasets_for(store, researcher) if r.name == name]
    if version is not None:
        rows = [r for r in rows if r.version == version]
    if not rows:
        raise NotFound(f"the catalogue has no dataset {name!r} you may analyse")
    return max(rows, key=lambda r: r.version)


def _config(store: Database, dataset: DatasetRow) -> DPConfig | None:
    raw = catalogue.get_dp_config(store, dataset.name)
    return DPConfig.model_validate(raw) if raw is not None else None


def _view(config: DPConfig, ledger: GaussianLedger) -> DPBudgetView:
    remaining = ledger.remaining_for(config.epsilon, config.delta)
    return DPBudgetView(
        scope=config.scope,
        epsilon=config.epsilon,
        delta=config.delta,
        epsilon_spent=ledger.epsilon_at(config.delta),
        epsilon_remaining=gaussian_epsilon(math.sqrt(remaining), config.delta),
        releases=ledger.releases,
    )


def _context(store: Database, dataset: DatasetRow, researcher: str, config: DPConfig) -> DPContext:
    key, owner = ledger_key(
        dataset.name, config.scope, researcher=researcher, project=dataset.project
    )
    return DPContext(
        config=config,
        dataset=dataset.name,
        key=key,
        owner=owner,
        ledger=ledgers.dp_ledger(store, key),
        rows=dataset.rows,
    )


def dp_budget(store: Database, dataset: DatasetRow, researcher: str) -> DPBudgetView | None:
    """The DP budget of the researcher's scope on `dataset`, or None without DP."""
    config = _config(store, dataset)
    if config is None:
        return None
    ledger = _context(store, dataset, researcher, config).ledger
    return _view(config, GaussianLedger(spent=ledger.spent, releases=ledger.releases))


def _refusal_message(outcome: StepOutcome) -> str:
    if outcome.decision is not None:
        decision = Decision.model_validate(outcome.decision)
        return "; ".join(f.message for f in decision.findings if f.verdict != "release")
    return str(outcome.error_message)


def plan_check(
    store: Database, researcher: str, name: str, request: PlanCheckRequest
) -> PlanCheckView:
    """The refusals the analyses of an unsealed plan would meet whatever the data."""
    dataset = dataset_for(store, researcher, name, request.version)
    metadata = DatasetMetadata.model_validate(dataset.dataset_metadata)
    config = _config(store, dataset)
    context = _context(store, dataset, researcher, config) if config is not None else None
    ledger = (
        GaussianLedger(spent=context.ledger.spent, releases=context.ledger.releases)
        if context is not None
        else None
    )
    problems: list[PlanProblem] = []
    dp_before = 0
    for index, body in enumerate(request.analyses):
        try:
            validate(body, metadata)
            analysis = parse_analysis(body)
        except AnalysisInvalid as exc:
            raise InvalidRequest(f"analyses[{index}]: {exc}") from exc
        refused = dp_release.refusal(analysis.kind, config, dataset.name)
        if refused is not None:
            problems.append(PlanProblem(index=index, kind=analysis.kind, message=refused[1]))
            continue
        if analysis.kind not in DP_KINDS or context is None or ledger is None:
            continue
        # The plan's earlier DP requests count as spent: they will be charged first.
        ctx = DPContext(
            config=context.config,
            dataset=context.dataset,
            key=context.key,
            owner=context.owner,
            ledger=DPLedgerState(spent=ledger.spent, releases=ledger.releases),
            public_spent=context.public_spent,
            rows=context.rows,
        )
        assert isinstance(analysis, DPCount | DPSum | DPMean | DPHistogram | DPMeanTest)
        planned = dp_release.plan(analysis, metadata, ctx)
        if isinstance(planned, DPPlan):
            ledger = planned.ledger_after
        else:
            before = (
                f"counting the {dp_before} DP request(s) before it in this plan as spent, "
                if dp_before
                else ""
            )
            left = _view(context.config, ledger)
            problems.append(
                PlanProblem(
                    index=index,
                    kind=analysis.kind,
                    message=f"{before}{_refusal_message(planned)} Remaining: one more request "
                    f"may ask for at most ε = {left.epsilon_remaining:.4g} at δ = {left.delta:g}.",
                )
            )
        dp_before += 1
    return PlanCheckView(
        dataset=dataset.name,
        version=dataset.version,
        problems=problems,
        dp_budget=dp_budget(store, dataset, researcher),
        dp_budget_after=_view(config, ledger) if config is not None and ledger else None,
    )
