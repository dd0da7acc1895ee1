"""The sub-groups a regression releases totals over travel as extra query sets.

Expected partitions are computed with pandas groupby on the generated frame, not by the code
under test: each dummy's level groups, each interaction cell, each few-valued numeric column's
value groups, all within the records the model used (the filter and missing values applied)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from safeaccess.client.analyses import parse_analysis
from safeaccess.client.metadata import DatasetMetadata
from safeaccess.rules.outputs import RegressionOutput
from safeaccess.sandbox.runner import execute
from safeaccess.sandbox.runner.compute.regression import FEW_VALUES

META = DatasetMetadata.model_validate(
    {
        "name": "m",
        "columns": [
            {"name": "sex", "type": "categorical", "levels": ["F", "M"]},
            {"name": "region", "type": "categorical", "levels": ["N", "S", "E"]},
            {"name": "children", "type": "integer"},
            {"name": "age", "type": "integer"},
            {"name": "income", "type": "continuous"},
        ],
    }
)


def _frame(n: int = 400, seed: int = 5) -> pd.DataFrame:
    r = np.random.default_rng(seed)
    frame = pd.DataFrame(
        {
            "sex": pd.Categorical(r.choice(["F", "M"], n), categories=["F", "M"]),
            "region": pd.Categorical(r.choice(["N", "S", "E"], n), categories=["N", "S", "E"]),
            "children": r.integers(0, 4, n),
            "age": r.integers(18, 90, n),
            "income": r.normal(30_000, 8_000, n),
        }
    )
    frame.loc[r.choice(n, 15, replace=False), "income"] = np.nan  # listwise deletion
    return frame


def _partitions(output: RegressionOutput) -> list[frozenset[frozenset[int]]]:
    out = []
    for qs in output.facts.extra_query_sets:
        cells = qs.to_array()
        out.append(
            frozenset(
                frozenset(int(i) for i in np.flatnonzero(cells == c))
                for c in np.unique(cells[cells >= 0])
            )
        )
    return out


def _groups(frame: pd.DataFrame, used: pd.Series, *by: str) -> frozenset[frozenset[int]]:
    sub = frame[used]
    return frozenset(
        frozenset(int(i) for i in idx)
        for idx in sub.groupby(list(by), observed=True).groups.values()
    )


def _run(formula: str, frame: pd.DataFrame, where: str | None = None) -> RegressionOutput:
    body: dict[str, object] = {"kind": "regression", "formula": formula}
    if where is not None:
        body["where"] = where
    output = execute(parse_analysis(body), frame, META)
    assert isinstance(output, RegressionOutput)
    return output


def test_dummy_groups_and_the_model_set_are_admitted() -> None:
    frame = _frame()
    output = _run("income ~ C(sex) + C(region) + age", frame, where="age >= 30")
    used = frame["income"].notna() & (frame["age"] >= 30)
    model = output.facts.query_set
    assert model is not None
    assert set(np.flatnonzero(model.to_array() >= 0)) == set(np.flatnonzero(used.to_numpy()))
    parts = _partitions(output)
    # sex[T.M] splits the used records by sex; each region dummy splits them into that region
    # and the rest
    assert _groups(frame, used, "sex") in parts
    for level in ("S", "E"):
        mask = used & (frame["region"] == level)
        split = frozenset(
            {
                frozenset(int(i) for i in np.flatnonzero(mask.to_numpy())),
                frozenset(int(i) for i in np.flatnonzero((used & ~mask).to_numpy())),
            }
        )
        assert split in parts
    # age has more than FEW_VALUES distinct values: its level sets are not admitted
    assert frame.loc[used, "age"].nunique() > FEW_VALUES
    assert all(len(p) <= FEW_VALUES for p in parts)


def test_interaction_cells_are_admitted() -> None:
    frame = _frame()
    output = _run("income ~ C(sex) * C(region)", frame)
    used = frame["income"].notna()
    parts = _partitions(output)
    # each interaction column is one sex x region cell against the rest of the model's records
    for sex, region in (("M", "S"), ("M", "E")):
        mask = used & (frame["sex"] == sex) & (frame["region"] == region)
        cell = frozenset(int(i) for i in np.flatnonzero(mask.to_numpy()))
        assert any(cell in p for p in parts), (sex, region)


def test_a_few_valued_numeric_regressor_gives_its_value_groups_once() -> None:
    frame = _frame()
    output = _run("income ~ children + I(children**2) + I(children**3)", frame)
    used = frame["income"].notna()
    parts = _partitions(output)
    assert parts == [_groups(frame, used, "children")]  # x, x², x³: one partition, given once
    # ... as weighted rows (issue 41): each column's values over the groups (X'y) and X'X's
    # entries, x^a · x^b for a, b in 1..3 (x^2 .. x^6)
    (qs,) = output.facts.extra_query_sets
    values = np.sort(frame.loc[used, "children"].unique()).astype(float)
    expected = {tuple(values**p) for p in (1, 2, 3, 4, 5, 6)}
    assert qs.weights is not None and {tuple(row) for row in qs.weights} == expected
    assert len(qs.weights) == len(expected)


def test_a_logit_on_a_few_valued_regressor_adds_its_hessian_and_likelihood_rows() -> None:
    import statsmodels.api as sm

    frame = _frame()
    frame["sick"] = (frame["age"] > 50).astype(int)
    frame.loc[frame.index[:40], "sick"] = 1 - frame.loc[frame.index[:40], "sick"]
    meta = META.model_copy(
        update={"columns": [*META.columns, META.columns[3].model_copy(update={"name": "sick"})]}
    )
    output = execute(
        parse_analysis({"kind": "regression", "formula": "sick ~ children", "family": "logit"}),
        frame,
        meta,
    )
    assert isinstance(output, RegressionOutput)
    values = np.sort(frame["children"].unique()).astype(float)
    fit = sm.Logit(frame["sick"], sm.add_constant(frame["children"].astype(float))).fit(disp=0)
    eta = fit.params.iloc[0] + fit.params.iloc[1] * values
    mu = 1.0 / (1.0 + np.exp(-eta))
    w = mu * (1.0 - mu)
    patterns = [q for q in output.facts.extra_query_sets if q.weights and len(q.weights) == 4]
    (glm,) = patterns
    assert glm.weights is not None
    expected = [w, w * values, w * values**2, np.log1p(np.exp(eta))]
    for row, want in zip(glm.weights, expected, strict=True):
        np.testing.assert_allclose(row, want, rtol=1e-6)


def test_two_categorical_terms_give_their_cross_cells() -> None:
    # X'X's entry of the sex and region dummies is a sex x region count (issue 41): every fit
    # family gives the cells of the two terms crossed, over the model's records
    frame = _frame()
    frame["high"] = (frame["income"] > 30_000).astype(int)
    meta = META.model_copy(
        update={"columns": [*META.columns, META.columns[3].model_copy(update={"name": "high"})]}
    )
    for family, outcome in (("ols", "income"), ("logit", "high"), ("probit", "high")):
        body = {"kind": "regression", "formula": f"{outcome} ~ C(sex) + C(region)"}
        output = execute(parse_analysis({**body, "family": family}), frame, meta)
        assert isinstance(output, RegressionOutput)
        used = frame[outcome].notna()
        assert _groups(frame, used, "sex", "region") in _partitions(output), family


def test_a_categorical_and_a_few_valued_term_give_per_cell_sums() -> None:
    # X'X's entries of a region dummy and children (and children squared) are the region's
    # sums of children and children^2: weighted rows over region x children groups whose
    # values, applied to the groups' counts, are pandas' per-region sums
    frame = _frame()
    output = _run("income ~ C(region) + children + I(children**2)", frame)
    used = frame["income"].notna()
    (cross,) = [
        q
        for q in output.facts.extra_query_sets
        if q.weights is not None and any(" | " in name for name in q.row_labels or [])
    ]
    cells = cross.to_array()
    counts = np.bincount(cells[cells >= 0], minlength=len(cross.labels)).astype(float)
    assert _groups(frame, used, "region", "children") in _partitions(output)
    released = {
        name: float(np.dot(row, counts))
        for row, name in zip(cross.weights or [], cross.row_labels or [], strict=True)
    }
    sub = frame[used].assign(sq=frame["children"] ** 2)
    for region, group in sub.groupby("region", observed=True):
        total, squares = float(group["children"].sum()), float(group["sq"].sum())
        cubes, fourth = (float((group["children"] ** p).sum()) for p in (3, 4))
        mine = {v for name, v in released.items() if name.endswith(f"| region = {region}")}
        # x, x^2 (also x^2's own row), x · x^2 and (x^2)^2
        assert mine == {total, squares, cubes, fourth}


def test_two_few_valued_numeric_columns_give_their_cross_products() -> None:
    # X'X's entry of children and visits is sum children * visits over the model's records:
    # a weighted row over the children x visits groups (issue 41)
    frame = _frame()
    frame["visits"] = np.random.default_rng(8).integers(0, 5, len(frame))
    meta = META.model_copy(
        update={"columns": [*META.columns, META.columns[2].model_copy(update={"name": "visits"})]}
    )
    output = execute(
        parse_analysis({"kind": "regression", "formula": "income ~ children + visits"}),
        frame,
        meta,
    )
    assert isinstance(output, RegressionOutput)
    used = frame["income"].notna()
    (pair,) = [
        q
        for q in output.facts.extra_query_sets
        if q.row_labels and "weighted: children*visits" in q.row_labels
    ]
    assert _groups(frame, used, "children", "visits") in _partitions(output)
    cells = pair.to_array()
    counts = np.bincount(cells[cells >= 0], minlength=len(pair.labels)).astype(float)
    row = (pair.weights or [])[(pair.row_labels or []).index("weighted: children*visits")]
    sub = frame[used]
    assert float(np.dot(row, counts)) == float((sub["children"] * sub["visits"]).sum())
