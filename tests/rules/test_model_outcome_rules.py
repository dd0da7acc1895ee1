"""A model's outcome meets the summary rules (issue 41), run on the sandbox runner's real output.

Every family's fit gives the outcome's total over its records, OLS also its sum of squares, so
filters on the outcome are bounds, the total's dominance and the spread's concentration are
checked as for a summary, a binary outcome's classes need the threshold, and a Poisson fit's
statistics carrying sum log(y!) are not released (the likelihood-ratio statistic is, and equals
statsmodels'). Expected values come from statsmodels and pandas, not from the code under test.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import statsmodels.formula.api as smf

from safeaccess.client.analyses import parse_analysis
from safeaccess.client.metadata import DatasetMetadata
from safeaccess.rules.checks.regression import POISSON_WITHHELD, regression_release_view
from safeaccess.rules.engine import DEFAULT_RULESET, check
from safeaccess.rules.outputs import RegressionOutput, TransformStep
from safeaccess.sandbox.runner import execute

META = DatasetMetadata.model_validate(
    {
        "name": "m",
        "columns": [
            {"name": "age", "type": "integer", "bounds": [18, 99]},
            {"name": "income", "type": "integer", "bounds": [0, 200000]},
            {"name": "visits", "type": "integer"},
            {"name": "win", "type": "integer", "bounds": [0, 1]},
        ],
    }
)
PADDED = "age == 97 or income between 30000 and 30150"


def _frame(n: int = 300, seed: int = 3) -> pd.DataFrame:
    r = np.random.default_rng(seed)
    income = r.integers(31_000, 79_000, n)
    income[1:17] = r.integers(30_000, 30_151, 16)
    income[0] = 81_234
    age = r.integers(18, 90, n)
    age[0] = 97
    return pd.DataFrame(
        {
            "age": age,
            "income": income,
            "visits": r.poisson(2.0, n),
            "win": (r.random(n) < 0.4).astype(int),
        }
    )


FRAME = _frame()


def _fit(formula: str, family: str = "ols", where: str | None = None) -> RegressionOutput:
    body: dict[str, object] = {"kind": "regression", "formula": formula, "family": family}
    if where is not None:
        body["where"] = where
    out = execute(parse_analysis(body), FRAME, META)
    assert isinstance(out, RegressionOutput)
    return out


def _checks(out: RegressionOutput) -> set[str]:
    return {f.check for f in check(out, DEFAULT_RULESET).findings if f.verdict == "withhold"}


@pytest.mark.parametrize(
    ("formula", "family"),
    [("income ~ 1", "poisson"), ("income ~ 1", "ols"), ("income ~ age", "poisson")],
)
def test_a_fit_of_a_padded_set_is_withheld_by_the_filters_bounds(formula: str, family: str) -> None:
    out = _fit(formula, family, PADDED)
    assert out.n == 17
    assert "bounded_reconstruction" in _checks(out)


@pytest.mark.parametrize(
    ("formula", "family"),
    [
        ("income ~ age", "ols"),
        ("income ~ 1", "poisson"),
        ("visits ~ age", "poisson"),
        ("win ~ age", "logit"),
        ("win ~ age", "probit"),
        ("win ~ age", "ols"),  # a 0/1 outcome: its classes, not reconstruction, are checked
    ],
)
def test_ordinary_fits_pass_the_outcome_rules(formula: str, family: str) -> None:
    out = _fit(formula, family, "income > 40000" if formula.startswith("income") else None)
    assert check(out, DEFAULT_RULESET).verdict == "release", check(out, DEFAULT_RULESET).findings
    data = FRAME.query("income > 40000") if formula.startswith("income") else FRAME
    outcome = formula.split("~")[0].strip()
    assert out.facts.outcome is not None and out.facts.outcome.n == len(data)
    assert out.facts.outcome.total == pytest.approx(data[outcome].sum())


def test_a_rare_binary_outcome_is_a_small_count() -> None:
    frame = FRAME.copy()
    frame["win"] = 0
    frame.loc[[5, 50, 100, 150, 200], "win"] = 1  # five events: the intercept tells the count
    body = {"kind": "regression", "formula": "win ~ age", "family": "logit"}
    out = execute(parse_analysis(body), frame, META)
    assert isinstance(out, RegressionOutput)
    assert "binary_outcome" in _checks(out)


def test_a_dominated_outcome_total_is_withheld() -> None:
    # one income of 199 000 among incomes of 100: the mean is hers (N-K dominance of a total)
    frame = FRAME.copy()
    young = frame.index[frame["age"] < 30]
    frame.loc[young, "income"] = 100
    frame.loc[young[0], "income"] = 199_000
    body = {"kind": "regression", "formula": "income ~ 1", "family": "poisson", "where": "age < 30"}
    out = execute(parse_analysis(body), frame, META)
    assert isinstance(out, RegressionOutput)
    assert "nk_dominance" in _checks(out)


def test_a_poisson_fit_releases_no_statistic_carrying_the_log_factorials() -> None:
    out = _fit("visits ~ age", "poisson")
    reference = smf.poisson("visits ~ age", FRAME).fit(disp=0)
    # the runner computes what statsmodels gives ...
    assert out.fit["llf"] == pytest.approx(reference.llf)
    assert out.fit["llr"] == pytest.approx(reference.llr)
    # ... and the release view keeps only what the rules check
    released = regression_release_view(out, DEFAULT_RULESET)
    assert not set(POISSON_WITHHELD) & set(released.fit)
    assert set(released.fit_withheld) == {"llf", "llnull", "aic", "bic", "pseudo_r2"}
    assert released.fit["llr"] == pytest.approx(reference.llr)
    assert released.fit["llr_p_value"] == pytest.approx(reference.llr_pvalue)
    assert [c.estimate for c in released.coefficients] == pytest.approx(
        reference.params.to_list(), rel=1e-6
    )
    # other families are released whole
    logit = _fit("win ~ age", "logit")
    assert regression_release_view(logit, DEFAULT_RULESET).fit == logit.fit


# --- A transformed outcome: the ranges are compared on the column's scale (issue 41) --------

TRANSFORMED = ["log(income) ~ 1", "sqrt(income) ~ age", "I(income ** 2) ~ 1", "log1p(income) ~ 1"]


@pytest.mark.parametrize(
    ("formula", "family"),
    [*((f, "ols") for f in TRANSFORMED), ("I(income ** 2) ~ 1", "poisson")],
)
def test_a_transformed_outcome_of_a_padded_set_is_withheld_by_the_filters_bounds(
    formula: str, family: str
) -> None:
    # the filter's band on income pins the sixteen companions whatever the formula does to it
    # (a Poisson fit of a squared count was released before: no bounds on a transformed outcome)
    out = _fit(formula, family, PADDED)
    assert out.n == 17
    assert out.facts.outcome is not None and out.facts.outcome.transform
    assert "bounded_reconstruction" in _checks(out)


@pytest.mark.parametrize("formula", [*TRANSFORMED, "log(income) ~ age + visits"])
@pytest.mark.parametrize(
    "where", [None, "age >= 30", "income > 0", "income < 90000", "income > 40000"]
)
def test_an_ordinary_transformed_outcome_is_not_withheld_by_the_filters_bounds(
    formula: str, where: str | None
) -> None:
    # log of a column bounded below by 0 is unbounded below (`income > 0`, `income < 90000`):
    # an infinite end the transform creates is no claim of the release (the change taken back
    # before withheld these)
    out = _fit(formula, "ols", where)
    assert "bounded_reconstruction" not in _checks(out)


def test_a_transformed_outcome_keeps_its_bounds_on_the_columns_scale() -> None:
    out = _fit("log(income) ~ 1", "ols", PADDED)
    vf = out.facts.outcome
    assert vf is not None and vf.bounds is not None and vf.transform is not None
    assert [s.func for s in vf.transform] == ["log"]
    # sixteen companions in the band (income's scale, not log's) and the target in [0, 200 000]
    classes = {(c.low, c.high): c.count for c in vf.bounds}
    assert classes == {(30000.0, 30150.0): 16, (0.0, 200000.0): 1}


_FUNCS = {
    "log": np.log,
    "log1p": np.log1p,
    "exp": np.exp,
    "sqrt": np.sqrt,
    "abs": np.abs,
    "power2": lambda v: v**2,
    "power3": lambda v: v**3,
}


def _steps(names: list[str]) -> list[TransformStep]:
    return [
        TransformStep(func="power", exponent=int(n[-1]))
        if n.startswith("power")
        else TransformStep(func=n)  # type: ignore[arg-type]
        for n in names
    ]


@pytest.mark.parametrize(
    "chain",
    [["log"], ["log1p"], ["exp"], ["sqrt"], ["abs"], ["power2"], ["power3"], ["log", "abs"]],
)
def test_intervals_through_a_transform_agree_with_numpy_on_a_grid(chain: list[str]) -> None:
    from safeaccess.rules.reconstruction.transform import image, preimage_measure

    steps = _steps(chain)
    r = np.random.default_rng(11)
    # inside each first step's domain (the records a design uses are)
    floor = {"log": 0.01, "sqrt": 0.0, "log1p": -0.99}.get(chain[0], -3.0)
    for _ in range(40):
        lo = r.uniform(floor, 3)
        hi = lo + r.uniform(0.1, 4)
        grid = np.linspace(lo, hi, 20001)
        values = grid
        for name in chain:
            values = _FUNCS[name](values)
        got_lo, got_hi = image(steps, lo, hi)
        # the image is the values' hull (to the grid's resolution), never narrower
        assert got_lo <= values.min() + 1e-12 and got_hi >= values.max() - 1e-12
        assert np.isclose(got_lo, values.min(), atol=1e-3 * (1 + abs(got_lo)))
        assert np.isclose(got_hi, values.max(), atol=1e-3 * (1 + abs(got_hi)))
        # the preimage of a sub-interval of the image, cut to [lo, hi], measured on the grid
        a, b = np.sort(r.uniform(values.min(), values.max(), 2))
        inside = (values >= a) & (values <= b)
        measured = inside.mean() * (hi - lo)
        assert np.isclose(
            preimage_measure(steps, (a, b), (lo, hi)), measured, atol=2e-3 * (hi - lo)
        )


def test_an_unbounded_end_of_the_image_maps_back_to_the_columns_end() -> None:
    from safeaccess.rules.reconstruction.transform import image, preimage_measure

    log = _steps(["log"])
    # log of [0, 200 000]: unbounded below; a posterior range reaching far below maps back to
    # the whole prior range
    lo, hi = image(log, 0.0, 200_000.0)
    assert lo == -np.inf and np.isclose(hi, np.log(200_000))
    assert np.isclose(preimage_measure(log, (-500.0, hi), (0.0, 200_000.0)), 200_000.0)
    assert np.isclose(
        preimage_measure(log, (np.log(80_000), np.log(82_000)), (0.0, 200_000.0)), 2_000.0
    )


SALARIED = FRAME.assign(income=np.where(np.arange(len(FRAME)) >= 290, 150_000, FRAME["income"]))
TWO_PARTS = "age == 97 or income between 30000 and 30150 or income == 150000"


@pytest.mark.parametrize("formula", ["income ~ 1", "log(income) ~ 1", None])
def test_a_padded_set_in_two_parts_is_withheld_by_the_filters_bounds(formula: str | None) -> None:
    # ten companions on one salary give the residuals spread (the spread rule passes) and the
    # filter's hull (30 000..150 000) freed the sixteen in the band: the exact income came out
    body: dict[str, object] = (
        {"kind": "summary", "variables": ["income"], "statistics": ["count", "mean", "sd"]}
        if formula is None
        else {"kind": "regression", "formula": formula, "family": "ols"}
    )
    out = execute(parse_analysis({**body, "where": TWO_PARTS}), SALARIED, META)
    withheld = {f.check for f in check(out, DEFAULT_RULESET).findings if f.verdict == "withhold"}
    assert withheld == {"bounded_reconstruction"}
