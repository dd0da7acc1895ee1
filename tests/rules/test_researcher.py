"""Researcher-side crosstab / pivot_table: tables, per-cell status and decisions."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import safeaccess.rules as rules
from safeaccess.rules.outputs import SummaryFacts, SummaryOutput
from safeaccess.rules.tabulate import TabulationError


@pytest.fixture
def df() -> pd.DataFrame:
    # 3 regions x 2 sexes; East/F has 4 records, the rest 20 or more (built by hand)
    rows = (
        [("North", "F", 100.0)] * 20
        + [("North", "M", 110.0)] * 25
        + [("South", "F", 90.0)] * 22
        + [("South", "M", 95.0)] * 30
        + [("East", "F", 80.0)] * 4
        + [("East", "M", 85.0)] * 21
    )
    frame = pd.DataFrame(rows, columns=["region", "sex", "pay"])
    frame.loc[frame.index[(frame.region == "South") & (frame.sex == "M")][0], "pay"] = 100_000.0
    return frame


def test_crosstab_table_status_and_decision(df: pd.DataFrame) -> None:
    res = rules.crosstab(df.region, df.sex, margins=True)
    expected = pd.crosstab(df.region, df.sex, margins=True).astype(float)
    pd.testing.assert_frame_equal(res.table, expected, check_names=True)
    assert res.cell_status.shape == res.table.shape
    assert res.cell_status.loc["East", "F"] == "threshold"
    assert (res.cell_status.drop(index="East", columns="F", errors="ignore") == "ok").all().all()
    assert res.verdict == "withhold"
    assert res.cell_status.loc["East", "All"] == "ok"  # 25 records


def test_pivot_table_mean_with_dominance(df: pd.DataFrame) -> None:
    res = rules.pivot_table(df, values="pay", index="region", columns="sex", aggfunc="mean")
    ref = pd.pivot_table(df, values="pay", index="region", columns="sex", aggfunc="mean")
    pd.testing.assert_frame_equal(res.table, ref, check_names=False)
    # South/M: 100 000 among 29 x 95: top two 100 095 / 102 755 = 97 % -> NK and p-ratio
    assert res.cell_status.loc["South", "M"] == "nk_dominance; p_ratio"
    assert res.cell_status.loc["East", "F"] == "threshold"
    assert res.cell_status.loc["North", "F"] == "ok"


def test_suppression_requested_by_researcher(df: pd.DataFrame) -> None:
    res = rules.crosstab(df.region, df.sex, margins=True, suppress=True)
    # East/F (4) is primary; East is a row of two, so East/M goes too; column F then needs a
    # second cell: the smallest other is North/F (20); row North then needs North/M (25).
    assert res.cell_status.loc["East", "F"] == "suppressed"
    assert res.cell_status.loc["East", "M"] == "suppressed"
    assert np.isnan(res.table.loc["East", "F"])
    assert res.verdict == "release"
    assert "suppressed at your request" in res.decision.findings[0].message


def test_one_way_and_multi_index(df: pd.DataFrame) -> None:
    res = rules.crosstab([df.region, df.sex], None)
    assert list(res.table.index.names) == ["region", "sex"]
    assert res.table.loc[("East", "F")].iloc[0] == 4


def test_unsupported_aggfunc_is_explained(df: pd.DataFrame) -> None:
    with pytest.raises(TabulationError, match="median"):
        rules.crosstab(df.region, df.sex, values=df.pay, aggfunc="median")
    with pytest.raises(TabulationError, match="no column"):
        rules.pivot_table(df, values="wage", index="region")


def test_package_level_check_works_for_any_output() -> None:
    out = SummaryOutput(by=[], statistics=[], groups=[], facts=SummaryFacts(groups=[], n_total=0))
    d = rules.check(out, rules.DEFAULT_RULESET.with_overrides({"reconstruction": False}))
    assert d.verdict == "release" and d.ruleset == "default+overrides@1"


def test_every_package_export_resolves() -> None:
    for name in rules.__all__:
        assert getattr(rules, name) is not None
    with pytest.raises(AttributeError):
        _ = rules.no_such_name
