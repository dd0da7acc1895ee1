"""Answering a differentially private step: sensitivity, calibration, budget, noise.

The pipeline calls this in three places:

1. `refusal(kind, config)` before anything runs: a rule-checked kind on a dataset where DP is
   mandatory, or a DP kind on a dataset without DP, fails with a clear message.
2. `plan(analysis, metadata, context)` before the sandbox runs: the L2 sensitivity Δ from the
   analysis, the declared bounds and the neighbouring relation (`safeaccess.client.dpquery`),
   the transformation weights when asked for, σ (calibrated by the analytic Gaussian mechanism
   or as requested), the budget check against the scope's ledger and the controller's TPR
   limit. A refusal here depends only on the public ledger and the request, never on data, so
   its message says exactly why and what is left.
3. `answer(plan, statistic, context)` after the sandbox returned the exact clipped statistic:
   the noise (OpenDP's Gaussian sampler), the answer the researcher receives, and the charge the
   store writes in the same transaction as the release.

Nothing the sandbox returns enters Δ or σ: its output is only checked to have the layout the
metadata implies.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from safeaccess.client.analyses import DP_KINDS, DPMean, DPMeanTest
from safeaccess.client.dpquery import (
    DPQuery,
    Layout,
    LayoutError,
    default_weights,
    layout,
    region_weights,
)
from safeaccess.client.metadata import DatasetMetadata
from safeaccess.client.protocol import canonical
from safeaccess.rules.decision import Decision, Finding
from safeaccess.rules.dp import (
    DPParameterError,
    GaussianLedger,
    analytic_gaussian_sigma,
    gaussian_mu_for,
    risk_report,
)
from safeaccess.rules.dp.noise import gaussian_noise
from safeaccess.rules.dp.transform import optimal_transform
from safeaccess.rules.outputs import (
    DPAnswerFacts,
    DPAnswerOutput,
    DPLedgerView,
    DPRisk,
    DPStatisticOutput,
    public,
)
from safeaccess.sandbox.dp_refusal import dp_refusal
from safeaccess.server.config import DPConfig
from safeaccess.server.outcome import DPCharge, DPLedgerState, StepOutcome
from safeaccess.server.schemas import Reason
from safeaccess.server.states import StepState

#: Checks whose findings depend only on the request and the public ledger: shown verbatim.
PUBLIC_CHECKS = frozenset({"dp_budget", "dp_policy"})


@dataclass(frozen=True)
class DPContext:
    """The DP configuration of the step's dataset and the ledger of the step's scope."""

    config: DPConfig
    dataset: str
    key: str
    owner: str
    ledger: DPLedgerState
    # The dataset's rule set (label, hash), named in DP decisions so that the audit log's rule-set
    # record stays the one in force; no rule applies to a DP answer. The DP configuration's own
    # hash is in the facts (`config_sha256`).
    ruleset_label: str = ""
    ruleset_hash: str = ""
    # mu^2 of the dataset's public ledger (its published mocks): every scope ledger composes
    # with it, so a release must fit the budget together with it
    public_spent: float = 0.0
    # The dataset version's record count, published in the catalogue: the plan-time judgement
    # of whether a DP mean can be useful rests on it (never on the data of a group).
    rows: int | None = None

    def charge(self, ledger_after: GaussianLedger) -> DPCharge:
        """The ledger's charge for a release leaving it at `ledger_after`, guarded by the
        version read (a DP answer's and a synthetic release's alike)."""
        return DPCharge(
            key=self.key,
            dataset=self.dataset,
            scope=self.config.scope,
            owner=self.owner,
            version=self.ledger.version,
            spent_after=ledger_after.spent,
            releases_after=ledger_after.releases,
        )


@dataclass(frozen=True)
class DPPlan:
    shape: Layout
    weights: list[float] | None
    sensitivity: float
    sigma: float
    records_per_unit: int
    ledger_after: GaussianLedger


def config_hash(config: DPConfig) -> str:
    return hashlib.sha256(canonical.dumps(config.model_dump(mode="json"))).hexdigest()


def refusal(kind: str, config: DPConfig | None, dataset: str) -> tuple[str, str] | None:
    """(error code, message) when this kind may not run on this dataset, else None."""
    # One implementation with the offline rehearsal's (`safeaccess.sandbox.dp_refusal`).
    return dp_refusal(
        kind,
        dataset,
        enabled=config is not None,
        mandatory=config is not None and config.mandatory,
    )


def _ledger(context: DPContext) -> GaussianLedger:
    return GaussianLedger(spent=context.ledger.spent, releases=context.ledger.releases)


def ledger_view(context: DPContext, ledger: GaussianLedger) -> DPLedgerView:
    cfg = context.config
    return DPLedgerView(
        scope=cfg.scope,
        epsilon_budget=cfg.epsilon,
        delta=cfg.delta,
        epsilon_spent=ledger.epsilon_at(cfg.delta),
        mu_spent=ledger.mu,
        mu_remaining=math.sqrt(ledger.remaining_for(cfg.epsilon, cfg.delta)),
        releases=ledger.releases,
    )


def _withheld(
    kind: str, check: str, message: str, context: DPContext, facts: dict[str, Any]
) -> StepOutcome:
    decision = Decision(
        verdict="withhold",
        findings=[Finding(check=check, verdict="withhold", message=message)],
        ruleset=context.ruleset_label,
        ruleset_hash=context.ruleset_hash,
    )
    return StepOutcome(
        state=StepState.WITHHELD,
        kind=kind,
        decision=decision.model_dump(mode="json"),
        ruleset_hash=decision.ruleset_hash,
        dp_facts={
            **facts,
            "verdict": "withhold",
            "withheld_by": check,
            "config_sha256": config_hash(context.config),
        },
    )


def policy_refusal(
    kind: str,
    tpr: float,
    release: tuple[str, str],
    ask: str,
    context: DPContext,
    facts: dict[str, Any],
) -> StepOutcome | None:
    """The withhold when the controller's cap on an attacker's true-positive rate at FPR 0.05
    (`max_tpr_at_5pct`) is below this release's `tpr`, else None. `release` names the release
    and its noise for the message; `ask` says what the researcher can change."""
    cap = context.config.max_tpr_at_5pct
    if cap is None or tpr <= cap:
        return None
    what, noise = release
    return _withheld(
        kind,
        "dp_policy",
        f"this {what} would let an attacker tell neighbouring datasets apart with TPR "
        f"{tpr:.4g} at FPR 0.05 ({noise}); the controller allows at most {cap:g}: {ask}.",
        context,
        facts,
    )


def public_reasons(decision: Decision) -> list[Reason] | None:
    """The reasons of a DP withhold, verbatim: they depend only on the request and the public
    ledger. None when the decision is not one (other withholds go through `steps/reasons.py`)."""
    fired = [f for f in decision.findings if f.verdict != "release"]
    if not fired or any(f.check not in PUBLIC_CHECKS for f in fired):
        return None
    return [Reason(check=f.check, verdict=f.verdict, item=None, message=f.message) for f in fired]


def plan(analysis: DPQuery, metadata: DatasetMetadata, context: DPContext) -> DPPlan | StepOutcome:
    """Δ, weights and σ of the release, or a withheld outcome when the budget or the
    controller's risk limit forbids it (decided from the request and the public ledger)."""
    assert analysis.kind in DP_KINDS
    try:
        shape = layout(analysis, metadata)
    except LayoutError as exc:  # validation catches this first; kept as a safety net
        return StepOutcome.invalid(analysis.kind, str(exc))
    m = metadata.neighbours.records_per_unit
    try:
        weights, sensitivity, sigma = _calibrate(analysis, shape, m)
        risk = risk_report(sensitivity, sigma)
    except DPParameterError as exc:
        # e.g. a column whose declared bounds have no width: nothing to protect or to answer.
        return StepOutcome.invalid(analysis.kind, f"this DP request cannot be calibrated: {exc}")
    useless = _useless_mean(analysis, shape, weights, sigma, context.rows)
    if useless is not None:
        return StepOutcome.invalid(analysis.kind, useless)
    cfg = context.config
    ledger = _ledger(context)
    facts = {
        "sensitivity": sensitivity,
        "sigma": sigma,
        "records_per_unit": m,
        "ledger": context.key,
        "spent_before": ledger.spent,
        "releases_before": ledger.releases,
    }
    composed = GaussianLedger(spent=ledger.spent + context.public_spent, releases=ledger.releases)
    if not composed.fits(sensitivity, sigma, cfg.epsilon, cfg.delta):
        remaining = composed.remaining_for(cfg.epsilon, cfg.delta)
        need = (
            f"this release fits only with sigma >= {sensitivity / math.sqrt(remaining):.6g}"
            if remaining > 0
            else "nothing is left"
        )
        return _withheld(
            analysis.kind,
            "dp_budget",
            f"the privacy budget of this {cfg.scope} on dataset {context.dataset!r} does not "
            f"cover this release: it would add (Δ/σ)² = {(sensitivity / sigma) ** 2:.6g} "
            f"(Δ = {sensitivity:.6g}, σ = {sigma:.6g}) but only {remaining:.6g} remains "
            f"({ledger.releases} releases have spent ε = {ledger.epsilon_at(cfg.delta):.6g} of "
            f"ε = {cfg.epsilon:g} at δ = {cfg.delta:g}); {need}.",
            context,
            facts,
        )
    refused = policy_refusal(
        analysis.kind,
        risk.tpr_at(0.05),
        ("release", f"Δ = {sensitivity:.6g}, σ = {sigma:.6g}"),
        "ask for more noise (a larger σ or a smaller ε)",
        context,
        facts,
    )
    if refused is not None:
        return refused
    return DPPlan(
        shape=shape,
        weights=weights,
        sensitivity=sensitivity,
        sigma=sigma,
        records_per_unit=m,
        ledger_after=ledger.charge(sensitivity, sigma),
    )


def component_sds(
    shape: Layout, weights: list[float] | None, sigma: float
) -> list[list[float | None]]:
    """The noise standard deviation of each component's estimate: sigma / sqrt(xi)."""
    k = len(shape.components)
    w = weights if weights is not None else [1.0] * shape.size
    flat = [sigma / math.sqrt(x) if x > 0 else None for x in w]
    return [flat[g * k : (g + 1) * k] for g in range(len(shape.groups))]


def _useless_mean(
    analysis: DPQuery,
    shape: Layout,
    weights: list[float] | None,
    sigma: float,
    rows: int | None,
) -> str | None:
    """Why a dp_mean cannot answer within its bounds' range, judged on public figures only: at
    the average group size (the published record count over the number of groups) the mean's
    standard error, sqrt(sigma_S^2 + h^2 sigma_n^2) / n at the worst mean (a bound), would make
    its 95 % interval wider than the bounds themselves."""
    if not isinstance(analysis, DPMean) or rows is None or rows <= 0:
        return None
    sds = component_sds(shape, weights, sigma)[0]
    d = len(analysis.variables)
    sd_n = sds[d]
    n = rows / len(shape.groups)
    for v, name in enumerate(analysis.variables):
        sd_s, h = sds[v], shape.psi[v]
        if sd_s is None or sd_n is None:
            continue  # a test transformation chose not to estimate this mean
        se = math.sqrt(sd_s**2 + (h * sd_n) ** 2) / n
        if 1.959963984540054 * se > h:
            asked = (
                f"epsilon = {analysis.epsilon:g}"
                if analysis.sigma is None
                else f"sigma = {analysis.sigma:g}"
            )
            return (
                f"dp_mean of {name!r} at {asked} cannot give a mean within its bounds' range: "
                f"for a group of the average size ({rows} records / {len(shape.groups)} groups "
                f"= {n:.6g}) its standard error would be up to {se:.6g}, so its 95 % interval "
                f"would be wider than the bounds [{shape.centres[v] - h:g}, "
                f"{shape.centres[v] + h:g}]; ask for a larger epsilon, fewer groups in 'by' or "
                "narrower declared bounds"
            )
    return None


def _calibrate(
    analysis: DPQuery, shape: Layout, records_per_unit: int
) -> tuple[list[float] | None, float, float]:
    """(weights, L2 sensitivity, sigma) of the release."""
    if isinstance(analysis, DPMeanTest):
        # The Hotelling release is one mu-GDP Gaussian mechanism over statistics with their own
        # sensitivities and noise; it is booked as sensitivity 1 with sigma = 1 / mu.
        if analysis.epsilon is None or analysis.delta is None:
            raise DPParameterError("a DP mean test is calibrated by 'epsilon' and 'delta'")
        if any(h <= 0 for h in shape.psi):
            raise DPParameterError("every variable's declared bounds must have a positive width")
        return None, 1.0, 1.0 / gaussian_mu_for(analysis.epsilon, analysis.delta)
    weights = _weights(analysis, shape)
    if weights is None and analysis.sigma is None:
        # No planned inference of the researcher's: shape the noise for the kind's own answer
        # (the mean's error, the missing count at no extra cost), at the plain query's Δ.
        weights = default_weights(analysis, shape)
    # Block-aware: one unit moves one group's components (at most m groups' with m records),
    # which is never looser than the whole-vector sensitivity of the transform's Lemma 1.
    sensitivity = shape.l2_sensitivity(weights, records_per_unit=records_per_unit)
    if analysis.sigma is not None:
        return weights, sensitivity, float(analysis.sigma)
    assert analysis.epsilon is not None and analysis.delta is not None
    return (
        weights,
        sensitivity,
        analytic_gaussian_sigma(analysis.epsilon, analysis.delta, sensitivity),
    )


def _weights(analysis: DPQuery, shape: Layout) -> list[float] | None:
    """The transformation xi the researcher's planned inference calls for (Shoham & Rinott)."""
    transform = getattr(analysis, "transform", None)
    if transform is None:
        return None
    if transform.goal == "region":
        # Theorem 1 per part: a record moves the statistic or its missing count, not both.
        return region_weights(shape)
    xi = optimal_transform(shape.psi_vector(), transform.goal, transform.eta)
    return [float(w) for w in xi]


class LayoutMismatch(Exception):
    """The sandbox's statistic does not have the layout the metadata implies."""


def _check_layout(statistic: DPStatisticOutput, shape: Layout) -> None:
    values = statistic.facts.values
    if (
        statistic.groups != shape.groups
        or statistic.components != shape.components
        or len(values) != len(shape.groups)
        or any(len(row) != len(shape.components) for row in values)
        or not all(math.isfinite(v) for row in values for v in row)
    ):
        raise LayoutMismatch("the sandbox's DP statistic does not have the declared layout")


def answer(
    analysis: DPQuery, dp_plan: DPPlan, statistic: DPStatisticOutput, context: DPContext
) -> StepOutcome:
    """The released outcome: the noisy answer, with the ledger charge to record with it."""
    shape = dp_plan.shape
    _check_layout(statistic, shape)
    k = len(shape.components)
    cfg = context.config
    risk = risk_report(dp_plan.sensitivity, dp_plan.sigma)
    test: dict[str, Any] | None = None
    sds = component_sds(shape, dp_plan.weights, dp_plan.sigma)
    if isinstance(analysis, DPMeanTest):
        noisy, test = _mean_test(analysis, dp_plan, statistic)
        # Its statistics carry their own noise (the documented shares of mu^2), not sigma.
        d = len(analysis.variables)
        block: list[float | None] = [float(test["sigma_sum"])] * d
        block.append(float(test["sigma_count"]))
        sds = [list(block) for _ in shape.groups]
    else:
        exact = [v for row in statistic.facts.values for v in row]
        weights = dp_plan.weights
        query = (
            [math.sqrt(w) * v for w, v in zip(weights, exact, strict=True)] if weights else exact
        )
        noisy = [float(v) for v in gaussian_noise(query, dp_plan.sigma)]
    transform = getattr(analysis, "transform", None)
    output = DPAnswerOutput(
        kind=statistic.kind,
        by=shape.by,
        groups=shape.groups,
        components=shape.components,
        values=[noisy[g * k : (g + 1) * k] for g in range(len(shape.groups))],
        sigma=dp_plan.sigma,
        sensitivity=dp_plan.sensitivity,
        epsilon=analysis.epsilon,
        delta=analysis.delta,
        centres=shape.centres,
        weights=dp_plan.weights,
        noise_sd=sds,
        transform=transform.model_dump(mode="json") if transform is not None else None,
        test=test,
        risk=DPRisk(
            tpr_at_fpr={f"{a:g}": risk.tpr_at(a) for a in (0.01, 0.05, 0.1)},
            auc=risk.auc,
            auc_two_releases=risk.two_release_auc,
        ),
        ledger=ledger_view(context, dp_plan.ledger_after),
        facts=DPAnswerFacts(
            records_per_unit=dp_plan.records_per_unit,
            charge=dp_plan.ledger_after.spent - context.ledger.spent,
        ),
    )
    decision = Decision(
        verdict="release",
        findings=[
            Finding(
                check="dp",
                verdict="release",
                message=f"Gaussian mechanism, Δ = {dp_plan.sensitivity:.6g}, "
                f"σ = {dp_plan.sigma:.6g}; ledger {context.key} now spent "
                f"ε = {output.ledger.epsilon_spent:.6g} of {cfg.epsilon:g} at δ = {cfg.delta:g}",
            )
        ],
        ruleset=context.ruleset_label,
        ruleset_hash=context.ruleset_hash,
    )
    return StepOutcome(
        state=StepState.RELEASED,
        kind=analysis.kind,
        output=output.model_dump(mode="json"),
        public_output=public(output),
        decision=decision.model_dump(mode="json"),
        ruleset_hash=decision.ruleset_hash,
        dp_charge=context.charge(dp_plan.ledger_after),
        dp_facts=dp_facts(output, context, dp_plan),
    )


def dp_facts(output: DPAnswerOutput, context: DPContext, dp_plan: DPPlan) -> dict[str, Any]:
    """The JSON facts of a DP release for the audit log (`event_data["dp"]`): no microdata."""
    return {
        "verdict": "release",
        "ledger": context.key,
        "scope": context.config.scope,
        "sensitivity": output.sensitivity,
        "sigma": output.sigma,
        "records_per_unit": dp_plan.records_per_unit,
        "charge": output.facts.charge,
        "spent_before": context.ledger.spent,
        "spent_after": dp_plan.ledger_after.spent,
        "releases_after": output.ledger.releases,
        "epsilon_spent": output.ledger.epsilon_spent,
        "config_sha256": config_hash(context.config),
        "transformed": output.weights is not None,
    }


def _mean_test(
    analysis: DPMeanTest, dp_plan: DPPlan, statistic: DPStatisticOutput
) -> tuple[list[float], dict[str, Any]]:
    """The privatised two-sample statistics and the DP Hotelling test on them.

    An empty group is answered as if it held one record at the centre of the box: a neighbour
    of the true data, so the release stays DP, and the step never fails on a property of the data.
    """
    from safeaccess.rules.dp.hotelling import (
        GroupStatistics,
        hotelling_test,
        release_mean_comparison,
    )

    shape = dp_plan.shape
    d = len(analysis.variables)
    centre = np.asarray(shape.centres[:d], dtype=np.float64)
    half = np.asarray(shape.psi[:d], dtype=np.float64)
    moments = statistic.facts.second_moments
    if moments is None or len(moments) != 2:
        raise LayoutMismatch("the sandbox's mean-test statistic lacks its second moments")
    groups = []
    for g in range(2):
        row = statistic.facts.values[g]
        n = round(row[-1])
        sums = np.asarray(row[:d], dtype=np.float64)
        scatter = np.asarray(moments[g], dtype=np.float64)
        if scatter.shape != (d, d):
            raise LayoutMismatch("the sandbox's second moments have the wrong shape")
        if n == 0:
            n, sums, scatter = 1, np.zeros(d), np.zeros((d, d))
        offset = sums / n
        cov = (scatter - n * np.outer(offset, offset)) / (n - 1) if n > 1 else np.zeros((d, d))
        groups.append(
            GroupStatistics(
                n=n,
                mean=np.clip(centre + offset, centre - half, centre + half).tolist(),
                covariance=cov.tolist(),
            )
        )
    mu = 1.0 / dp_plan.sigma / dp_plan.records_per_unit
    release = release_mean_comparison(
        groups[0], groups[1], (centre - half).tolist(), (centre + half).tolist(), mu, gaussian_noise
    )
    result = hotelling_test(release, alpha=analysis.alpha)
    noisy = [v for grp in release.groups for v in [*grp.centred_sum, grp.count]]
    test = {
        **result.model_dump(mode="json"),
        "sigma_count": release.sigma_count,
        "sigma_sum": release.sigma_sum,
        "sigma_moments": release.sigma_moments,
        "centred_moments": [grp.centred_moments for grp in release.groups],
    }
    return noisy, test
