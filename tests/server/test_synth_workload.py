"""The synthetic-data workload and noise step, from the analysis and the metadata alone: named
refusals, table shapes, the exact GDP charge, the decoding of codes, metadata checks at add."""

from __future__ import annotations

import itertools
import math
from datetime import date, timedelta

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import norm

from safeaccess.client.analyses import SyntheticData
from safeaccess.client.metadata import Column, DatasetMetadata, NeighbouringRelation
from safeaccess.client.synthetic import MAX_DATE_BINS, SynthInvalid, date_edges, synth_workload
from safeaccess.client.validation import AnalysisInvalid, validate
from safeaccess.rules.dp import gaussian_mu_for
from safeaccess.rules.ruleset import RuleSet
from safeaccess.server.config import DPConfig
from safeaccess.server.datasets import check_against_metadata
from safeaccess.server.dp import DPContext
from safeaccess.server.outcome import DPLedgerState, StepOutcome
from safeaccess.server.synth.measure import measure
from safeaccess.server.synth.step import decode, plan

META = DatasetMetadata(
    name="toy",
    columns=[
        Column(name="pid", type="identifier"),
        Column(name="firm", type="categorical", levels=[1, 2], contributor=True),
        Column(name="sex", type="categorical", levels=["F", "M"], nullable=False),
        Column(name="region", type="categorical", levels=["N", "S", "E"]),
        Column(name="age", type="integer", bounds=(16, 95)),
        Column(name="income", type="continuous", bounds=(0, 1000), synth_bins=[0, 10, 100, 1000]),
        Column(name="wealth", type="continuous"),
        Column(name="code", type="categorical"),
    ],
)


def _problems(analysis: SyntheticData, **limits: int) -> str:
    with pytest.raises(SynthInvalid) as info:
        synth_workload(analysis, META, **limits)
    return str(info.value)


def test_shapes_come_from_declared_levels_bins_and_nullability() -> None:
    work = synth_workload(
        SyntheticData(columns=["sex", "region", "age", "income"], epsilon=1, delta=1e-9), META
    )
    # sex: 2 levels, not nullable; region: 3 + null; age: 10 integer bins of 16..95 + null;
    # income: its 3 synth_bins + null
    assert [c.size for c in work.columns] == [2, 4, 11, 4]
    assert work.columns[2].edges == (16, 24, 32, 40, 48, 56, 63, 71, 79, 87, 95)
    assert len(work.pairs) == 6 and work.tables[:4] == ((0,), (1,), (2,), (3,))
    # none declared: every column a key, the first ten targets
    assert work.keys == (0, 1, 2, 3) and work.targets == (0, 1, 2, 3)


@pytest.mark.parametrize(
    ("columns", "bins", "words"),
    [
        (["pid", "sex"], {}, "identifier and is never synthesised"),
        (["firm", "sex"], {}, "contributor column and is never synthesised"),
        (["wealth", "sex"], {}, "without declared bounds"),
        (["code", "sex"], {}, "declares no levels"),
        (["age", "sex"], {"age": [10, 50]}, "must lie inside its bounds"),
        (["region", "sex"], {"region": [0, 1]}, "only numeric columns bin"),
        (["nope", "sex"], {}, "unknown column 'nope'"),
    ],
)
def test_refusals_from_metadata_are_named(
    columns: list[str], bins: dict[str, list[float]], words: str
) -> None:
    analysis = SyntheticData(columns=columns, epsilon=1, delta=1e-9, bins=bins)
    assert words in _problems(analysis)
    # and the client's validation reports the same before anything is sealed
    with pytest.raises(AnalysisInvalid, match=words.split("'")[0]):
        validate(analysis, META)


def test_too_many_cells_and_model_too_large_name_the_table_and_the_limit() -> None:
    analysis = SyntheticData(
        columns=["age", "income"], epsilon=1, delta=1e-9, bins={"age": list(range(16, 96))}
    )
    # age: 79 bins + null = 80 codes; income 4 codes: the pair has 320 cells
    message = _problems(analysis, max_cells=300)
    assert "too many cells: the table of (age, income) has 320 cells" in message
    assert "allows 300" in message
    # one-ways 80 + 4 and the one tree edge of 320 cells: 404
    message = _problems(analysis, max_model_cells=400)
    assert "model too large: its cliques have 404 cells" in message
    big_rows = SyntheticData(columns=["sex", "region"], epsilon=1, delta=1e-9, rows=50)
    assert "50 rows asked; the centre allows 10" in _problems(big_rows, max_rows=10)


def test_fixed_needs_marginals_of_at_most_three_columns() -> None:
    with pytest.raises(ValueError, match="needs at least one marginal"):
        SyntheticData(columns=["sex", "region"], epsilon=1, delta=1e-9, method="fixed")
    with pytest.raises(ValueError, match="1 to 3 distinct columns"):
        SyntheticData(
            columns=["sex", "region", "age", "income"],
            epsilon=1,
            delta=1e-9,
            method="fixed",
            marginals=[["sex", "region", "age", "income"]],
        )


@pytest.mark.parametrize(("method", "m"), [("mst", 1), ("fixed", 3)])
def test_the_charge_is_mu_squared_by_hand(method: str, m: int) -> None:
    meta = META.model_copy(
        update={"neighbours": NeighbouringRelation(unit="contributor", max_records_per_unit=m)}
    )
    analysis = SyntheticData(
        columns=["sex", "region", "income"],
        epsilon=1,
        delta=1e-9,
        method=method,  # type: ignore[arg-type]
        marginals=[["sex", "income"]] if method == "fixed" else [],
    )
    work = synth_workload(analysis, meta)
    rng = np.random.default_rng(1)
    tables = [rng.integers(0, 50, work.cells(t)).astype(float).tolist() for t in work.tables]
    released = measure(work, tables, 0.3, m)
    d = 3
    if method == "mst":
        k, p = 2, 3
        by_hand = (m**2) * (
            d / released.sigma_oneway**2
            + p / released.sigma_selection**2  # type: ignore[operator]
            + k / released.sigma_cliques**2
        )
        assert len(released.tree) == 2 and released.noisy_scores is not None
        assert released.sigma_oneway == pytest.approx(m * math.sqrt(3) / (0.3 * math.sqrt(0.25)))
    else:
        by_hand = (m**2) * (d / released.sigma_oneway**2 + 1 / released.sigma_cliques**2)
        assert released.sigma_selection is None and released.tree == ()
        assert released.sigma_cliques == pytest.approx(m * 1 / (0.3 * math.sqrt(0.75)))
    assert by_hand == pytest.approx(0.09, rel=1e-12)
    assert released.mu == pytest.approx(0.3, rel=1e-12)


def test_codes_decode_inside_levels_bins_and_bounds() -> None:
    work = synth_workload(
        SyntheticData(columns=["sex", "region", "age", "income"], epsilon=1, delta=1e-9), META
    )
    codes = np.array([[0, 3, 10, 3], [1, 0, 0, 2], [1, 2, 9, 0]] * 200)
    frame = decode(codes, work)
    assert set(frame["sex"]) == {"F", "M"}
    assert frame["region"].isna().sum() == 200  # code 3 is region's null
    ages = frame["age"].dropna()
    assert (ages % 1 == 0).all() and ages.between(16, 95).all()
    assert frame["age"].isna().sum() == 200 and frame["income"].isna().sum() == 200
    # age code 0 is [16, 24): integers 16..23; code 9 is the last bin [87, 95], closed
    assert set(ages[ages < 24]) <= set(range(16, 24)) and ages.max() <= 95
    incomes = frame["income"].dropna()
    assert incomes.between(0, 1000).all() and ((incomes < 10) | (incomes >= 100)).all()


def test_a_non_nullable_column_with_missing_values_is_refused_at_add() -> None:
    frame = pd.DataFrame(
        {
            "pid": [1, 2],
            "firm": [1, 1],
            "sex": ["F", None],
            "region": ["N", None],
            "age": [20, 30],
            "income": [1.0, 2.0],
            "wealth": [1.0, 2.0],
            "code": ["a", "b"],
        }
    )
    problems = check_against_metadata(frame, META)
    assert problems == ["sex: declared nullable: false but has missing values"]


DATED = DatasetMetadata(
    name="dated",
    columns=[
        Column(name="sex", type="categorical", levels=["F", "M"], nullable=False),
        Column(name="admitted", type="date", date_bounds=("2019-01-01", "2020-12-31")),  # type: ignore[arg-type]
        Column(name="born", type="date", date_bounds=("1920-03-01", "2020-12-31")),  # type: ignore[arg-type]
        Column(name="joined", type="date", date_bounds=("2001-03-15", "2020-06-30")),  # type: ignore[arg-type]
        Column(name="seen", type="date"),
    ],
)


def _days(dates: list[pd.Timestamp]) -> tuple[float, ...]:
    return tuple(float(d.toordinal()) for d in dates)


def test_a_date_column_is_binned_by_calendar_months_or_years_of_its_date_bounds() -> None:
    analysis = SyntheticData(columns=["admitted", "born", "joined"], epsilon=1, delta=1e-9)
    admitted, born, joined = synth_workload(analysis, DATED).columns
    # two years: the 24 months (pandas' month starts), the last bin closed on the last day
    months = list(pd.date_range("2019-01-01", "2020-12-01", freq="MS"))
    assert admitted.edges == _days([*months, pd.Timestamp("2020-12-31")])
    assert admitted.size == 25 and admitted.type == "date" and admitted.levels is None
    # twenty years: whole calendar years, the first and last partial
    years = list(pd.date_range("2002-01-01", "2020-01-01", freq="YS"))
    ends = [pd.Timestamp("2001-03-15"), *years, pd.Timestamp("2020-06-30")]
    assert joined.edges == _days(ends)
    # 101 years: blocks of five years starting on years divisible by five (at most 24 bins)
    fives = list(pd.date_range("1925-01-01", "2020-01-01", freq="5YS"))
    assert born.edges == _days([pd.Timestamp("1920-03-01"), *fives, pd.Timestamp("2020-12-31")])
    assert born.values == 21


@pytest.mark.parametrize(
    ("columns", "bins", "words"),
    [
        (["seen", "sex"], {}, "'seen' is a date without declared date_bounds"),
        (["admitted", "sex"], {"admitted": [737060, 737400]}, "is a date; it is binned by"),
    ],
)
def test_a_date_column_without_bounds_or_with_bins_is_refused_in_one_line(
    columns: list[str], bins: dict[str, list[float]], words: str
) -> None:
    analysis = SyntheticData(columns=columns, epsilon=1, delta=1e-9, bins=bins)
    with pytest.raises(SynthInvalid) as info:
        synth_workload(analysis, DATED)
    assert words in str(info.value) and len(info.value.problems) == 1
    with pytest.raises(AnalysisInvalid) as refused:
        validate(analysis, DATED)
    assert words in str(refused.value) and str(refused.value).count("\n") == 1


def test_dates_code_by_their_month_and_decode_to_days_of_that_month() -> None:
    from safeaccess.sandbox.runner.compute.synthetic import code_column

    analysis = SyntheticData(columns=["admitted", "sex"], epsilon=1, delta=1e-9)
    work = synth_workload(analysis, DATED)
    col = work.columns[0]
    rng = np.random.default_rng(7)
    days = pd.Timestamp("2019-01-01") + pd.to_timedelta(rng.integers(0, 731, 400), unit="D")
    real = pd.Series(days).mask(rng.random(400) < 0.1)
    by_month = (real.dt.year - 2019) * 12 + real.dt.month - 1  # pandas' month of each date
    expected = by_month.fillna(24).astype(int).tolist()  # 24: the null code
    # the sandbox codes dates as the centre stores them, as 'YYYY-MM-DD' text and Python dates
    for stored in (real, real.dt.strftime("%Y-%m-%d"), real.map(lambda d: d.date(), "ignore")):
        assert code_column(stored, col).tolist() == expected
    codes = np.stack([np.repeat(np.arange(25), 40), np.zeros(1000, dtype=int)], axis=1)
    decoded = decode(codes, work)["admitted"]
    assert pd.api.types.is_datetime64_any_dtype(decoded)
    assert decoded.isna().sum() == 40  # the null code is missing
    kept = decoded.dropna()
    assert (kept == kept.dt.normalize()).all()  # whole days
    assert kept.between(pd.Timestamp("2019-01-01"), pd.Timestamp("2020-12-31")).all()
    # every synthetic date lies in the month its code stands for, and they come back as coded
    assert sorted(code_column(decoded, col).tolist()) == sorted(codes[:, 0].tolist())
    months = ((kept.dt.year - 2019) * 12 + kept.dt.month - 1).value_counts()
    assert months.to_dict() == dict.fromkeys(range(24), 40)
    assert len(set(kept.dt.day)) > 20  # drawn across each month's days, not one per bin


@settings(max_examples=150, deadline=None)
@given(
    first=st.dates(min_value=date(1800, 1, 1), max_value=date(2060, 12, 31)),  # pandas ends in 2262
    span=st.integers(min_value=1, max_value=200 * 366),
)
def test_date_bins_are_at_most_24_calendar_periods_covering_the_bounds(
    first: date, span: int
) -> None:
    last = first + timedelta(days=span)
    edges = [date.fromordinal(int(e)) for e in date_edges(first, last)]
    assert edges[0] == first and edges[-1] == last and len(edges) - 1 <= MAX_DATE_BINS
    assert all(a < b for a, b in itertools.pairwise(edges))
    # every bin's days lie in one month (when the bounds touch at most 24 months) or one block
    # of whole years, and every inner edge starts a month or a year (pandas' periods)
    touched = pd.period_range(first, last, freq="M").size
    for a, b in itertools.pairwise(edges[:-1]):
        end = pd.Timestamp(b) - pd.Timedelta(days=1)
        if touched <= MAX_DATE_BINS:
            assert pd.Period(a, "M") == pd.Period(end, "M")
        else:
            assert pd.Timestamp(b).is_year_start and pd.Period(end, "Y").year >= a.year


def test_a_single_key_is_not_a_default_target_and_never_the_only_key_of_one() -> None:
    # keys=["sex"] alone: the default targets leave sex out (no other key would attack it),
    # so the disclosure check meets no target without a key.
    work = synth_workload(
        SyntheticData(columns=["sex", "region", "age"], epsilon=1, delta=1e-9, keys=["sex"]), META
    )
    assert work.keys == (0,) and work.targets == (1, 2)
    # named as a target too: refused at plan time, naming the field to fix
    words = _problems(
        SyntheticData(
            columns=["sex", "region"], epsilon=1, delta=1e-9, keys=["sex"], targets=["sex"]
        )
    )
    assert "keys" in words and "'sex' is a target and the only key column" in words


def test_a_synthetic_release_over_the_controllers_tpr_cap_is_withheld_naming_it() -> None:
    analysis = SyntheticData(columns=["sex", "region"], epsilon=1, delta=1e-9)
    context = DPContext(
        config=DPConfig(epsilon=50.0, delta=1e-5, max_tpr_at_5pct=0.06),
        dataset="toy",
        key="toy|researcher|r",
        owner="r",
        ledger=DPLedgerState(spent=0.0, releases=0, version=0),
    )
    outcome = plan(analysis, META, context, RuleSet())
    assert isinstance(outcome, StepOutcome) and outcome.decision is not None
    # The TPR is the Gaussian test's power at level 0.05 for that mu (scipy's normal).
    mu = gaussian_mu_for(1, 1e-9)
    tpr = norm.cdf(mu - norm.ppf(0.95))
    assert outcome.decision["findings"][0]["message"] == (
        "this synthetic release would let an attacker tell neighbouring datasets apart with TPR "
        f"{tpr:.4g} at FPR 0.05 (mu {mu:.6g}); the controller allows at most 0.06: ask for a "
        "smaller epsilon."
    )
    assert outcome.dp_facts is not None and outcome.dp_facts["withheld_by"] == "dp_policy"
