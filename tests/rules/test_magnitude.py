"""Magnitude tables: threshold on contributors, N-K, p-ratio, negatives, zeros, missing."""

from __future__ import annotations

from _rules_kit import magnitude_table

from safeaccess.rules.engine import DEFAULT_RULESET, check
from safeaccess.rules.outputs import CellFacts, TableFacts, TableOutput


def _by_cell(table, rs=DEFAULT_RULESET) -> dict[str, set[str]]:  # type: ignore[no-untyped-def]
    out: dict[str, set[str]] = {}
    for f in check(table, rs).findings:
        out.setdefault(f.item or "", set()).add(f.check)
    return out


def test_nk_dominance_two_firms_make_ninety_percent() -> None:
    # s0: 500 + 400 + ten firms of 10 = 1000; top two = 900 / 1000 = 90 % >= 90 % -> NK fails
    #     p-ratio: (1000 - 500 - 400) / 500 = 0.2 >= 0.1 -> passes
    # s1: twelve firms of 10 = 120; top two 20/120 = 17 %; p = 100/10 = 10 -> both pass
    table = magnitude_table([[[500, 400, *[10] * 10], [10] * 12]])
    assert _by_cell(table) == {"sector=C, size=s0": {"nk_dominance"}}
    msg = check(table).findings[0].message
    assert "90" in msg and "2 largest" in msg


def test_p_ratio_without_nk_with_a_looser_k() -> None:
    # [100, ten of 1]: total 110, top two 101/110 = 91.8 % (passes NK at k = 0.95)
    # p-ratio: (110 - 100 - 1) / 100 = 0.09 < 0.10 -> fails
    table = magnitude_table([[[100, *[1] * 10]]])
    rs = DEFAULT_RULESET.with_overrides({"nk_k": 0.95})
    assert _by_cell(table, rs) == {"sector=C, size=s0": {"p_ratio"}}
    # under the default k = 0.9 both rules fire
    assert _by_cell(table) == {"sector=C, size=s0": {"p_ratio", "nk_dominance"}}


def test_negative_contribution_sends_dominance_to_review() -> None:
    # a loss of -50 among eleven contributors: dominance is not defined -> review, not withhold
    table = magnitude_table([[[900, 10, 10, 10, 10, 10, 10, 10, 10, 10, -50]]])
    d = check(table)
    assert d.verdict == "review"
    assert {f.check for f in d.findings} == {"negative_values"}
    rs = DEFAULT_RULESET.with_overrides({"negative_values": "withhold"})
    assert check(table, rs).verdict == "withhold"


def test_all_zero_contributions_reveal_every_value() -> None:
    table = magnitude_table([[[0.0] * 12]])
    assert _by_cell(table) == {"sector=C, size=s0": {"all_zero"}}


def test_threshold_and_empty_cell_in_a_mean_table() -> None:
    # s0 has 4 contributors (< 10); s1 is empty (no value released, but the zero tells)
    table = magnitude_table([[[5, 6, 7, 8], []]], statistic="mean")
    cells = _by_cell(table)
    assert "threshold" in cells["sector=C, size=s0"]
    assert cells["sector=C, size=s1"] == {"zeros"}


def _unit_table(counts: int, units: int) -> TableOutput:
    return TableOutput(
        source="magnitude_table",
        statistic="sum",
        value="wages",
        row_vars=["sector"],
        col_vars=[],
        row_labels=[["C"]],
        col_labels=[[]],
        values=[[1200.0]],
        facts=TableFacts(
            cells=CellFacts(
                counts=[[counts]],
                contributors=[[units]],
                top=[[[300.0, 300.0, 200.0]]],
                total=[[1200.0]],
                negative=[[False]],
            ),
            n_total=counts,
        ),
    )


def test_threshold_counts_distinct_contributor_units() -> None:
    # 40 employees of 3 employers: 3 contributors < 10 even though there are 40 records
    # (top two employers 600/1200 = 50 %, p = 600/300 = 2: dominance passes)
    d = check(_unit_table(40, 3))
    assert [(f.check, f.verdict) for f in d.findings] == [("threshold", "withhold")]
    assert "3 contributors" in d.findings[0].message
    assert check(_unit_table(40, 12)).verdict == "release"


def test_missing_values_review_only_when_asked() -> None:
    table = magnitude_table([[[10] * 12]])
    cells = table.facts.cells.model_copy(update={"missing": [[2]]})
    table = table.model_copy(update={"facts": table.facts.model_copy(update={"cells": cells})})
    assert check(table).verdict == "release"
    rs = DEFAULT_RULESET.with_overrides({"missing_values": "review"})
    d = check(table, rs)
    assert d.verdict == "review" and d.findings[0].check == "missing_values"


def test_missing_dominance_facts_go_to_review() -> None:
    table = magnitude_table([[[10] * 12]])
    cells = table.facts.cells.model_copy(update={"top": None})
    table = table.model_copy(update={"facts": table.facts.model_copy(update={"cells": cells})})
    d = check(table)
    assert d.verdict == "review" and d.findings[0].check == "facts_missing"
