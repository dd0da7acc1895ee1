"""The vectorised table builder against pandas as an independent reference."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import safeaccess.rules.tabulate as tabulate_module
from safeaccess.rules.tabulate import TabulationError, build_table, code_levels, top3
from safeaccess.rules.tabulate import _codes as tabulate_codes


def _data(n: int = 3000, seed: int = 7) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    df = pd.DataFrame(
        {
            "region": rng.choice(["N", "S", "E", "W"], n),
            "sex": rng.choice(["F", "M"], n),
            "band": rng.integers(1, 6, n),
            "firm": rng.integers(0, 400, n),
            "pay": rng.gamma(2.0, 1000.0, n).round(2),
        }
    )
    df.loc[rng.choice(n, 30, replace=False), "pay"] = np.nan
    df.loc[rng.choice(n, 5, replace=False), "pay"] = -100.0
    df.loc[rng.choice(n, 12, replace=False), "region"] = None
    return df


def test_counts_match_pandas_crosstab() -> None:
    df = _data()
    t = build_table([df.region, df.band], [df.sex], row_names=["region", "band"], col_names=["sex"])
    ref = pd.crosstab([df.region, df.band], df.sex, dropna=False)
    # pandas keeps a NaN level when dropna=False; records with a missing key are in no cell here
    ref = ref[ref.index.get_level_values(0).notna()]
    assert t.row_labels == [list(ix) for ix in ref.index]
    assert t.col_labels == [[c] for c in ref.columns]
    assert np.array_equal(np.array(t.facts.cells.counts), ref.to_numpy())
    assert t.facts.n_total == int(df.region.notna().sum())


def test_margins_match_pandas() -> None:
    df = _data()
    t = build_table([df.region], [df.sex], margins=True)
    ref = pd.crosstab(df.region, df.sex, margins=True)
    assert np.array_equal(np.array(t.values), ref.to_numpy(dtype=float))
    assert t.row_labels[-1] == ["All"] and t.col_labels[-1] == ["All"]


def test_magnitude_facts_match_groupby() -> None:
    df = _data().dropna(subset=["region"])
    t = build_table([df.region], [df.sex], values=df.pay, statistic="mean")
    g = df.groupby(["region", "sex"])["pay"]
    ref_mean = g.mean().unstack()
    assert np.allclose(np.array(t.values, dtype=float), ref_mean.to_numpy())
    assert np.allclose(np.array(t.facts.cells.total), g.sum().unstack().to_numpy())
    ref_missing = g.apply(lambda s: int(s.isna().sum())).unstack().to_numpy()
    assert np.array_equal(np.array(t.facts.cells.missing), ref_missing)
    ref_top = g.apply(lambda s: list(s.dropna().nlargest(3))).unstack()
    for i, r in enumerate(ref_top.index):
        for j, c in enumerate(ref_top.columns):
            assert np.allclose(t.facts.cells.top[i][j], ref_top.loc[r, c])  # type: ignore[index]
    ref_neg = g.apply(lambda s: bool((s < 0).any())).unstack().to_numpy()
    assert np.array_equal(np.array(t.facts.cells.negative), ref_neg)


def test_contributor_units_sum_per_unit_and_count_distinct() -> None:
    df = _data().dropna(subset=["region", "pay"])
    t = build_table(
        [df.region], [df.sex], values=df.pay, statistic="sum", contributor=df.firm, margins=True
    )
    per_unit = df.groupby(["region", "sex", "firm"])["pay"].sum()
    units = df.groupby(["region", "sex"])["firm"].nunique().unstack().to_numpy()
    assert np.array_equal(np.array(t.facts.cells.contributors)[:-1, :-1], units)
    top = per_unit.groupby(level=[0, 1]).nlargest(3)
    first = top.groupby(level=[0, 1]).apply(list).unstack()
    assert np.allclose(t.facts.cells.top[0][0], first.iloc[0, 0])  # type: ignore[index]
    # margins count a firm once even when it appears under both sexes
    row_units = df.groupby("region")["firm"].nunique().to_numpy()
    assert np.array_equal(np.array(t.facts.cells.contributors)[:-1, -1], row_units)
    assert t.facts.cells.contributors[-1][-1] == df.firm.nunique()  # type: ignore[index]
    row_top = df.groupby(["region", "firm"])["pay"].sum().groupby(level=0).nlargest(3)
    first_row = list(row_top.loc[t.row_labels[0][0]])
    assert np.allclose(t.facts.cells.top[0][-1], first_row)  # type: ignore[index]


def test_categorical_keeps_unobserved_levels() -> None:
    s = pd.Series(pd.Categorical(["a", "a", "b"], categories=["a", "b", "c"]), name="k")
    t = build_table([s])
    assert t.row_labels == [["a"], ["b"], ["c"]]
    assert t.facts.cells.counts == [[2], [1], [0]]


def test_query_set_maps_records_to_body_cells() -> None:
    rows = pd.Series(["x", "y", None, "x"])
    cols = pd.Series(["a", "b", "a", "b"])
    t = build_table([rows], [cols], query_set=True)
    assert t.facts.query_set is not None
    # cells in row-major order: (x,a)=0 (x,b)=1 (y,a)=2 (y,b)=3; the None key is in no cell
    assert t.facts.query_set.to_array().tolist() == [0, 3, -1, 1]


def test_bad_input_is_refused() -> None:
    with pytest.raises(TabulationError):
        build_table([np.arange(3)], [np.arange(4)])
    with pytest.raises(TabulationError):
        build_table([np.arange(3)], statistic="mean")
    with pytest.raises(TabulationError):
        build_table([np.arange(3)], values=np.arange(3))
    with pytest.raises(TabulationError, match="cells"):
        build_table([np.arange(2000)], [np.arange(2000)], max_cells=1_000_000)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 5), st.integers(-3, 6)), min_size=0, max_size=80),
    st.booleans(),
)
def test_top3_matches_sorting(pairs: list[tuple[int, int]], big: bool) -> None:
    g = np.array([p[0] for p in pairs], dtype=np.int64)
    v = np.array([p[1] for p in pairs], dtype=float)
    if big:  # exercise the candidate-pruning path (>= 30 000 records)
        reps = 30_000 // max(len(g), 1) + 1
        g, v = np.tile(g, reps), np.tile(v, reps)
    got = top3(g, v, 6)
    for k in range(6):
        expect = sorted(v[g == k].tolist(), reverse=True)[:3]
        expect += [0.0] * (3 - len(expect))
        assert got[k].tolist() == expect


def test_a_record_without_a_value_is_in_no_cell() -> None:
    """Counts of a magnitude table are values, as pandas' `count` (and ACRO's threshold); a
    record without one is only in `missing` and outside the query set."""
    df = _data().dropna(subset=["region"]).reset_index(drop=True)
    t = build_table([df.region], [df.sex], values=df.pay, statistic="sum", query_set=True)
    ref = df.groupby(["region", "sex"])["pay"].count().unstack().to_numpy()
    assert np.array_equal(np.array(t.facts.cells.counts), ref)
    assert t.facts.n_total == int(df.pay.notna().sum())
    assert t.facts.query_set is not None
    index = t.facts.query_set.to_array()
    assert np.array_equal(index < 0, df.pay.isna().to_numpy())


def test_largest_contributions_are_those_made() -> None:
    """No zero stands in for a missing contributor: a cell or margin of k < 3 contributions
    lists k, negative ones included."""
    df = pd.DataFrame({"r": ["a", "a", "b"], "c": ["x", "y", "x"], "v": [-2.0, -5.0, 4.0]})
    t = build_table([df.r], [df.c], values=df.v, statistic="sum", margins=True)
    # rows a, b, All; columns x, y, All; (b, y) is empty
    assert t.facts.cells.top == [
        [[-2.0], [-5.0], [-2.0, -5.0]],
        [[4.0], [], [4.0]],
        [[4.0, -2.0], [-5.0], [4.0, -2.0, -5.0]],
    ]


def test_unknown_contributor_is_a_unit_of_its_own() -> None:
    df = pd.DataFrame(
        {"r": ["a"] * 5, "firm": [1, 1, None, None, 2], "v": [1.0, 2.0, 10.0, 20.0, 4.0]}
    )
    t = build_table([df.r], values=df.v, statistic="sum", contributor=df.firm)
    # units: firm 1 (1 + 2), firm 2 (4), and each record without a firm (10, 20)
    assert t.facts.cells.contributors == [[4]]
    assert t.facts.cells.top == [[[20.0, 10.0, 4.0]]]


def test_declared_levels_come_first_and_stay() -> None:
    """`levels=`: declared levels in declared order, kept when empty; undeclared values follow,
    sorted; whole floats are labelled as ints (the server's rule)."""
    rows = pd.Series(["m", "k", "z", "k", None])
    cols = pd.Series([2.0, 1.0, 1.0, 3.0, 2.0])
    t = build_table([rows], [cols], levels=[["z", "q", "k"], None])
    assert t.row_labels == [["z"], ["q"], ["k"], ["m"]]
    assert t.col_labels == [[1], [2], [3]]
    assert t.facts.cells.counts == [[1, 0, 0], [0, 0, 0], [1, 0, 1], [0, 1, 0]]
    with pytest.raises(TabulationError, match="levels"):
        build_table([rows], [cols], levels=[["z"]])


def test_one_way_margins_are_a_total_row() -> None:
    df = _data()
    t = build_table([df.region], values=df.pay, statistic="sum", margins=True)
    assert t.row_labels[-1] == ["All"] and t.col_labels == [[]]
    ref = df.groupby("region")["pay"].sum()
    assert np.allclose([row[0] for row in t.values[:-1]], ref.to_numpy())
    assert t.values[-1][0] == pytest.approx(ref.sum())


@settings(max_examples=60, deadline=None)
@given(
    st.one_of(
        st.lists(st.integers(-300, 300), max_size=60).map(lambda v: np.array(v, dtype=np.int64)),
        st.lists(st.integers(-100, 100), max_size=60).map(lambda v: np.array(v, dtype=np.int8)),
        st.lists(st.integers(0, 10**12), max_size=30).map(lambda v: np.array(v, dtype=np.int64)),
        st.lists(st.sampled_from(["b", "a", "ä", "Z", None]), max_size=60).map(pd.Series),
    )
)
def test_keys_are_coded_as_pandas_sorts_them(values: object) -> None:
    """The counting (small integer spans) and sort-the-distinct-values paths give pandas'
    `factorize(sort=True)` codes and levels."""
    codes, levels = tabulate_codes(values)
    ref_codes, ref_levels = pd.factorize(pd.Series(values), sort=True)
    assert codes.tolist() == ref_codes.tolist()
    assert levels == list(pd.Index(ref_levels).tolist())


def test_declared_categorical_codes_count_missing_apart() -> None:
    """Categorical codes of a narrow type (-1 = missing) are counted without a masked copy;
    a missing value is never taken for the last category."""
    cats = [f"c{i}" for i in range(127)]  # int8 codes: -1 would be 255 as unsigned
    s = pd.Series(pd.Categorical(["c126", None, "c0"], categories=cats))
    codes, levels = code_levels(s, None)
    assert codes.tolist() == [126, -1, 0] and levels == cats
    codes, levels = code_levels(s, ["c126", "c5"])  # declared levels only: undeclared used follow
    assert codes.tolist() == [0, -1, 2] and levels == ["c126", "c5", "c0"]


@pytest.mark.parametrize("margins", [False, True])
@pytest.mark.parametrize("statistic", ["count", "sum", "std"])
def test_variables_coded_one_by_one_give_the_same_table(
    monkeypatch: pytest.MonkeyPatch, margins: bool, statistic: str
) -> None:
    """Too many distinct value combinations for one joint count: each variable is coded to its
    levels first. Both ways must give the same table and query set."""
    df = _data()
    kw = {} if statistic == "count" else {"values": df.pay, "contributor": df.firm}
    args = ([df.region, df.band], [df.sex])

    def table() -> object:
        out = build_table(
            *args,
            margins=margins,
            statistic=statistic,
            query_set=True,
            **kw,  # type: ignore[arg-type]
        )
        assert out.facts.query_set is not None
        return out.model_dump(), out.facts.query_set.to_array().tolist()

    joint = table()
    monkeypatch.setattr(tabulate_module, "_JOINT_LIMIT", 0)
    assert table() == joint
