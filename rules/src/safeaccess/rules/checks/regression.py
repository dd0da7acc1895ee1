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

from safeaccess.rules.checks.leverage import leverage_findings
from safeaccess.rules.decision import Finding
from safeaccess.rules.outputs import RegressionOutput
from safeaccess.rules.ruleset import RuleSet


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
