"""Regressions: OLS, logit, probit, Poisson (DwB classes 9, 10 and 11).

Sources: DwB/SDAP guidelines: coefficients are safe with at least 10 residual degrees of
freedom; a saturated model on categorical regressors only is a table in disguise (its fitted
values are the cell means); binary regressors with few ones identify those records; estimation
residuals are never released. ACRO encodes the degrees-of-freedom rule (`MinimumDoFCheck` on
`df_resid`); DataSHIELD requires each level of a binary regressor to reach its table threshold.

Residuals: `RegressionOutput` carries coefficients and scalar fit statistics only, so no
per-record residual can be released through it; residuals computed in a `script` go to review.
"""

from __future__ import annotations

import math

from safeaccess.rules.checks.leverage import leverage_findings
from safeaccess.rules.checks.summary import variable_findings
from safeaccess.rules.decision import Finding
from safeaccess.rules.outputs import (
    RegressionOutput,
    SummaryFacts,
    SummaryGroup,
    SummaryGroupFacts,
    SummaryOutput,
    VariableSummary,
)
from safeaccess.rules.reconstruction import check as reconstruction_check
from safeaccess.rules.reconstruction.bounds import bounded_findings
from safeaccess.rules.ruleset import RuleSet

#: Fit statistics of a Poisson fit that carry sum log(y!) (statsmodels' llf keeps the
#: normalising constant): with the total, that is one more exact equation on the outcome's
#: values (`income ~ 1` on a padded set gives the one income outside the band), and on a small
#: count scale an integer relation between the exponents of 2, 3, 5, 7 in prod y!. No output
#: rule can check it, so these are not released; the likelihood-ratio statistic against the
#: intercept-only model (llr, llr_p_value) is: the constant cancels, leaving
#: beta'X'y - n ybar log ybar, what the coefficients already give.
POISSON_WITHHELD = ("llf", "llnull", "aic", "bic", "pseudo_r2")
#: Summary checks a model's outcome is not held to: the model's own records and degrees of
#: freedom are checked by `dof` and the query-set auditor; dominance with negative values is
#: left to the rules of the coefficients (a summary sends it to review).
_NOT_FOR_MODELS = frozenset({"threshold", "dof", "negative_values", "missing_values"})


def regression_findings(output: RegressionOutput, rs: RuleSet) -> list[Finding]:
    """Residual degrees of freedom, saturation, sparse binary regressors and leverage."""
    f = output.facts
    out: list[Finding] = []
    if f.df_resid < rs.dof:
        out.append(
            Finding(
                check="dof",
                verdict="withhold",
                item="model",
                message=f"the model has {f.df_resid:g} residual degrees of freedom; at least "
                f"{rs.dof} are needed. Use more records or fewer terms.",
            )
        )
    if f.categorical_only and f.saturated:
        out.append(
            Finding(
                check="saturated_model",
                verdict="withhold",
                item="model",
                message="the model has one parameter per combination of its categorical "
                "regressors, so its estimates are the cell means of a table: check that table "
                "instead, or drop an interaction.",
            )
        )
    for reg in f.regressors:
        if not reg.binary:
            continue
        for level, n in (("1", reg.ones), ("0", reg.zeros)):
            if n is not None and n < rs.threshold:
                out.append(
                    Finding(
                        check="binary_regressor",
                        verdict="withhold",
                        item=reg.term,
                        message=f"only {n} records have {reg.term} = {level}; its coefficient "
                        f"describes fewer than {rs.threshold} records. Merge that category.",
                    )
                )
    out += leverage_findings(f.leverage, rs, "model")
    out += outcome_findings(output, rs)
    spread = f.residual_spread
    if output.family == "ols" and spread is not None and spread.total > 0.0:
        # the spread concentration rule of summaries, on the residuals: `income ~ 1` on a
        # padded filter is a count, mean and sd in another form (docs/rules.md)
        share = sum(spread.top[: rs.spread_n]) / spread.total
        if share >= rs.spread_k:
            out.append(
                Finding(
                    check="spread_dominance",
                    verdict="withhold",
                    item="model",
                    message=f"the {rs.spread_n} largest residuals hold {share:.1%} of the "
                    f"residual sum of squares (limit {rs.spread_k:.0%}), so the standard "
                    "errors reveal how far those records lie from the fit.",
                )
            )
    return out


def _outcome_name(output: RegressionOutput) -> str:
    return output.formula.split("~", 1)[0].strip() or "the outcome"


def outcome_findings(output: RegressionOutput, rs: RuleSet) -> list[Finding]:
    """The summary rules on the moments of the outcome the fit encodes.

    Every family releases the outcome's total over the model's records (the intercept of
    `y ~ 1` is its mean or a link of it; with regressors the score equations X'y = X'mu and the
    standard errors give it back); OLS also its sum of squares (R^2, F and the residual spread
    give the total sum of squares). So the fit is checked as a summary with count, mean (and sd
    for OLS): dominance of the total, spread concentration, filters on the outcome as bounds
    (`bounded_reconstruction`) and, on a small-integer scale, exact reconstruction. A binary
    outcome's total is a count: each class needs `threshold` records."""
    f = output.facts
    vf = f.outcome
    item = f"{_outcome_name(output)} (the model's outcome)"
    if vf is None:
        return [
            Finding(
                check="facts_missing",
                verdict="review",
                item=item,
                message="the outcome's facts were not recorded, so what the fit tells about its "
                "total and spread could not be checked; an output checker must review it.",
            )
        ]
    out: list[Finding] = []
    n = vf.n
    # A 0/1 outcome's total is a count: the threshold on each class is its rule, not the
    # reconstruction check (on two values the mean fixes the multiset, which says nothing of
    # who has which value).
    binary = output.family in ("logit", "probit") or vf.scale == (0, 1)
    if binary and vf.total is not None:
        ones = round(vf.total)
        for level, count in (("1", ones), ("0", n - ones)):
            if count < rs.threshold:
                out.append(
                    Finding(
                        check="binary_outcome",
                        verdict="withhold",
                        item=item,
                        message=f"only {count} of the model's records have outcome {level}; the "
                        f"fit tells that count (a table cell), and at least {rs.threshold} are "
                        "needed. Use more records or a more common outcome.",
                    )
                )
    if n < 1 or vf.total is None:
        return out
    stats: dict[str, float | None] = {"count": float(n), "mean": vf.total / n}
    if output.family == "ols" and n > 1:
        squares = next((s for s in vf.spread or [] if s.power == 2), None)
        stats["sd"] = math.sqrt(squares.total / (n - 1)) if squares is not None else None
    names = [k for k, v in stats.items() if v is not None]
    out += [x for x in variable_findings(item, names, vf, rs) if x.check not in _NOT_FOR_MODELS]
    if vf.bounds:
        out += bounded_findings(item, stats, vf, None, float(rs.p_ratio))
    if vf.scale is not None and not binary and rs.reconstruction:
        variable = _outcome_name(output)
        summary = SummaryOutput(
            by=[],
            statistics=names,
            groups=[
                SummaryGroup(
                    labels=[], variables=[VariableSummary(variable=variable, n=n, stats=stats)]
                )
            ],
            facts=SummaryFacts(
                groups=[SummaryGroupFacts(labels=[], n=n, variables={variable: vf})], n_total=n
            ),
        )
        found = reconstruction_check.reconstruction_findings(summary, rs)
        # bounds were checked above, with the model's item name
        out += [x for x in found if x.check != "bounded_reconstruction"]
    return out


def regression_release_view(output: RegressionOutput, rs: RuleSet) -> RegressionOutput:
    """The output as it may leave: a Poisson fit without the statistics that carry sum log(y!)
    (`POISSON_WITHHELD`), named in `fit_withheld`."""
    del rs  # the same for every rule set: nothing can check these statistics
    if output.family != "poisson":
        return output
    withheld = [k for k in POISSON_WITHHELD if k in output.fit]
    if not withheld:
        return output
    fit = {k: v for k, v in output.fit.items() if k not in POISSON_WITHHELD}
    return output.model_copy(
        update={"fit": fit, "fit_withheld": sorted({*output.fit_withheld, *withheld})}
    )
