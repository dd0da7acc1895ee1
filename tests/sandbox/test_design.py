"""design_matrices, checked against patsy / statsmodels used as oracles on trusted formulas."""

from __future__ import annotations

import numpy as np
import pandas as pd
import patsy
import pytest
import statsmodels.formula.api as smf

from safeaccess.client.metadata import Column, DatasetMetadata
from safeaccess.sandbox.runner.design import MAX_COLUMNS, DesignError, design_matrices

log = np.log  # resolved by statsmodels' formula evaluation in this module's namespace
_ENV = patsy.EvalEnvironment(
    [{"log": np.log, "log1p": np.log1p, "exp": np.exp, "sqrt": np.sqrt, "abs": np.abs}]
)


@pytest.fixture(scope="module")
def frame() -> pd.DataFrame:
    rng = np.random.default_rng(7)
    n = 120
    df = pd.DataFrame(
        {
            "income": rng.lognormal(10, 0.5, n),
            "age": rng.uniform(18, 80, n),
            "hours": rng.normal(0, 2, n),
            "sex": rng.choice(["F", "M"], n),
            "region": rng.choice(["north", "south", "east"], n),
            "kids": rng.integers(0, 3, n),
        }
    )
    # missing values in a few rows (all levels stay present among the complete rows)
    df.loc[[3, 50], "age"] = np.nan
    df.loc[[7], "sex"] = None
    return df


PATSY_FORMULAS = [
    "income ~ age",
    "income ~ age + C(sex)",
    "log(income) ~ age * C(sex)",
    "income ~ age:C(sex)",
    "income ~ C(sex):C(region)",
    "income ~ C(region):C(sex) - 1",
    "income ~ C(sex) * C(region) * age",
    "income ~ age:C(sex):C(region) + C(region)",
    "income ~ I(age ** 2) + log(age) + sqrt(age) + abs(hours) + exp(hours) + log1p(age)",
    "income ~ (age + hours) * C(kids)",
    "income ~ sex + region",  # text columns used bare are categorical
    "income ~ age + 0",
    "income ~ 1",
]


@pytest.mark.parametrize("formula", PATSY_FORMULAS)
def test_same_columns_and_values_as_patsy(frame: pd.DataFrame, formula: str) -> None:
    ours = design_matrices(frame, formula)
    y, X = patsy.dmatrices(formula, frame, eval_env=_ENV, NA_action="drop", return_type="dataframe")
    assert ours.columns == list(X.columns)
    assert ours.y_name == y.columns[0]
    np.testing.assert_allclose(ours.X, X.to_numpy())
    np.testing.assert_allclose(ours.y, y.to_numpy()[:, 0])
    # rows: the positions patsy kept after dropping missing values
    assert ours.rows.tolist() == [frame.index.get_loc(i) for i in X.index]


def test_ols_coefficients_match_statsmodels(frame: pd.DataFrame) -> None:
    formula = "log(income) ~ age * C(sex) + C(region)"
    d = design_matrices(frame, formula)
    beta, *_ = np.linalg.lstsq(d.X, d.y, rcond=None)
    fit = smf.ols(formula, data=frame).fit()
    assert list(fit.params.index) == d.columns
    np.testing.assert_allclose(beta, fit.params.to_numpy(), rtol=1e-8)
    assert d.n == int(fit.nobs)


def _meta(*columns: Column) -> DatasetMetadata:
    return DatasetMetadata(name="t", columns=list(columns))


def test_declared_levels_set_reference_and_bare_categorical() -> None:
    df = pd.DataFrame({"y": [1.0, 2.0, 3.0, 4.0, 5.0], "grade": [3, 1, 2, 3, 1]})
    meta = _meta(
        Column(name="y", type="continuous"),
        Column(name="grade", type="ordinal", levels=[3, 2, 1]),
    )
    d = design_matrices(df, "y ~ grade", meta)
    # integer column declared ordinal -> categorical; reference = first declared level (3)
    assert d.columns == ["Intercept", "grade[T.2]", "grade[T.1]"]
    assert d.X[:, 1].tolist() == [0, 0, 1, 0, 0]
    assert d.X[:, 2].tolist() == [0, 1, 0, 0, 1]
    assert d.levels == {"grade": [3, 2, 1]}


def test_declared_levels_absent_from_data_are_dropped() -> None:
    df = pd.DataFrame({"y": [1.0, 2.0, 3.0, 4.0], "g": ["b", "c", "b", "c"]})
    meta = _meta(
        Column(name="y", type="continuous"),
        Column(name="g", type="categorical", levels=["a", "b", "c"]),
    )
    d = design_matrices(df, "y ~ C(g)", meta)
    assert d.columns == ["Intercept", "C(g)[T.c]"]
    assert d.levels["g"] == ["b", "c"]


def test_value_outside_declared_levels_is_refused_without_quoting_it() -> None:
    df = pd.DataFrame({"y": [1.0, 2.0], "g": ["a", "secret-value"]})
    meta = _meta(
        Column(name="y", type="continuous"), Column(name="g", type="categorical", levels=["a", "b"])
    )
    with pytest.raises(DesignError, match="declared levels") as info:
        design_matrices(df, "y ~ g", meta)
    assert "secret-value" not in str(info.value)


def test_listwise_deletion_and_where() -> None:
    df = pd.DataFrame(
        {
            "y": [1.0, np.nan, 3.0, 4.0, 5.0, 6.0],
            "x": [1.0, 2.0, np.nan, 4.0, 5.0, 6.0],
            "z": [0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
            "g": ["a", "b", "a", "b", "a", "b"],
        }
    )
    d = design_matrices(df, "y ~ x", where="g = 'a' or x > 5")
    # row 1 (y missing) and row 2 (x missing) dropped; where keeps rows 0, 2, 4, 5
    assert d.rows.tolist() == [0, 4, 5]
    assert d.y.tolist() == [1.0, 5.0, 6.0]
    assert d.X[:, 1].tolist() == [1.0, 5.0, 6.0]


def test_term_info_marks_dummies_and_counts_records() -> None:
    df = pd.DataFrame(
        {
            "y": [1.0, 2.0, 3.0, 4.0, 5.0],
            "x": [0.5, 1.0, 0.0, 2.0, 1.0],
            "s": list("FMFFM"),
            "d": [0, 1, 0, 0, 1],
        }
    )
    d = design_matrices(df, "y ~ x + C(s) + d")
    info = {t.name: t for t in d.terms}
    assert [t.name for t in d.terms] == d.columns
    assert not info["Intercept"].binary and not info["Intercept"].categorical
    assert info["C(s)[T.M]"].categorical and info["C(s)[T.M]"].binary
    assert info["C(s)[T.M]"].nonzero == 2
    assert not info["x"].categorical and not info["x"].binary
    assert info["d"].binary and not info["d"].categorical


@pytest.mark.parametrize(
    ("formula", "fragment"),
    [
        ("y ~ log(x)", "'x' has zero or negative"),
        ("y ~ sqrt(x)", "'x' has negative"),
        ("y ~ log1p(w)", "-1 or less"),
        ("y ~ exp(big)", "overflows"),
        ("y ~ log(s)", "categorical"),
        ("s ~ x", "response"),
        ("y ~ nope", "'nope'"),
        ("y ~ x +", "invalid formula"),
        ("y ~ pid", "identifier"),
    ],
)
def test_errors(formula: str, fragment: str) -> None:
    df = pd.DataFrame(
        {
            "y": [1.0, 2.0, 3.0],
            "x": [-1.25, 2.0, 3.0],
            "w": [-1.0, 0.0, 1.0],
            "big": [1.0, 800.0, 2.0],
            "s": ["a", "b", "a"],
            "pid": [11, 12, 13],
        }
    )
    meta = _meta(
        Column(name="y", type="continuous"),
        Column(name="x", type="continuous"),
        Column(name="w", type="continuous"),
        Column(name="big", type="continuous"),
        Column(name="s", type="categorical"),
        Column(name="pid", type="identifier"),
    )
    with pytest.raises(DesignError, match=fragment) as info:
        design_matrices(df, formula, meta)
    assert "-1.25" not in str(info.value)  # data values never appear in messages


def test_log_error_only_considers_rows_used() -> None:
    df = pd.DataFrame({"y": [1.0, 2.0, 3.0, 4.0], "x": [-1.0, 2.0, 3.0, 5.0]})
    d = design_matrices(df, "y ~ log(x)", where="x > 0")
    np.testing.assert_allclose(d.X[:, 1], np.log([2.0, 3.0, 5.0]))


def test_too_many_columns_is_refused() -> None:
    n = MAX_COLUMNS + 5
    df = pd.DataFrame({"y": np.arange(n, dtype=float), "g": [f"v{i}" for i in range(n)]})
    with pytest.raises(DesignError, match="too many levels"):
        design_matrices(df, "y ~ C(g)")
