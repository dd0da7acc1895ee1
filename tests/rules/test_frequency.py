"""Frequency tables: threshold, zeros, class disclosure and margins, on hand-made examples."""

from __future__ import annotations

from _rules_kit import count_table

from safeaccess.rules.engine import DEFAULT_RULESET, check


def _flags(table, rs=DEFAULT_RULESET) -> set[tuple[str, str | None]]:  # type: ignore[no-untyped-def]
    return {(f.check, f.item) for f in check(table, rs).findings}


def test_guideline_example_three_regions_by_sex() -> None:
    #          F   M
    # North   25  12   row 37: 25/37 = 68 %        fine
    # South    8  30   8 < 10                      threshold
    # East     0  41   empty cell                  zeros
    #                  41/41 = 100 % of East > 90%  class disclosure
    # column F total 33: 25/33 = 76 %; column M total 83: 41/83 = 49 %
    table = count_table([[25, 12], [8, 30], [0, 41]], ["North", "South", "East"], ["F", "M"])
    d = check(table)
    assert d.verdict == "withhold"
    assert _flags(table) == {
        ("threshold", "region=South, sex=F"),
        ("zeros", "region=East, sex=F"),
        ("class_disclosure", "region=East, sex=M"),
    }
    msg = next(f.message for f in d.findings if f.check == "threshold")
    assert "8 records" in msg and "at least 10" in msg


def test_safe_table_is_released_with_no_findings() -> None:
    # every cell >= 10, no zeros, largest share 30/50 = 60 % (row B) and 30/45 = 67 % (col M)
    table = count_table([[15, 15], [20, 30]], ["A", "B"], ["F", "M"])
    d = check(table)
    assert d.verdict == "release" and d.findings == []


def test_threshold_boundary_is_inclusive_at_the_threshold() -> None:
    # 10 passes, 9 fails (at least 10 records)
    table = count_table([[10, 12], [9, 12]], ["A", "B"], ["F", "M"])
    assert _flags(table) == {("threshold", "region=B, sex=F")}


def test_zeros_not_disclosive_when_rule_set_says_so() -> None:
    table = count_table([[0, 20], [20, 20]], ["A", "B"], ["F", "M"])
    rs = DEFAULT_RULESET.with_overrides({"zeros_disclosive": False, "class_disclosure": None})
    assert check(table, rs).verdict == "release"
    assert ("zeros", "region=A, sex=F") in _flags(table)


def test_class_disclosure_just_above_and_at_ninety_percent() -> None:
    # row A: 91/(91+9)... use counts >= 10 to isolate the rule: 95/(95+10) = 90.5 % > 90 %
    # row B: 90/(90+10) = 90.0 %, not above 90 %: allowed ("no cell above 90 %")
    # columns: F 95/185 = 51 %, M 10/20 = 50 %
    table = count_table([[95, 10], [90, 10]], ["A", "B"], ["F", "M"])
    assert _flags(table) == {("class_disclosure", "region=A, sex=F")}


def test_class_disclosure_in_one_way_table_uses_the_column() -> None:
    # one-way table: 190 of 200 = 95 % in one class
    table = count_table([[190], [10]], ["yes", "no"], ["n"])
    assert ("class_disclosure", "region=yes, sex=n") in _flags(table)


def test_class_disclosure_can_be_switched_off() -> None:
    table = count_table([[95, 10], [90, 10]], ["A", "B"], ["F", "M"])
    rs = DEFAULT_RULESET.with_overrides({"class_disclosure": None})
    assert check(table, rs).verdict == "release"


def test_margins_are_checked_but_not_for_class_disclosure() -> None:
    #          F   M | All
    # A       12  15 |  27
    # B       14  11 |  25
    # All     26  26 |  52   all >= 10; margin cells are not compared with their own totals
    table = count_table([[12, 15], [14, 11]], ["A", "B"], ["F", "M"], margins=True)
    assert check(table).verdict == "release"
    # a margin resting on few records is itself a released small number
    small = count_table([[3, 4], [30, 40]], ["A", "B"], ["F", "M"], margins=True)
    flags = _flags(small)
    assert ("threshold", "region=A, all columns") in flags  # 3 + 4 = 7 < 10
    assert ("threshold", "all rows, sex=F") not in flags  # 33


def test_suppressed_cells_are_not_released_so_not_checked() -> None:
    table = count_table([[3, 20], [20, 20]], ["A", "B"], ["F", "M"])
    hidden = table.model_copy(update={"suppressed": [[True, False], [False, False]]})
    assert ("threshold", "region=A, sex=F") in _flags(table)
    assert ("threshold", "region=A, sex=F") not in _flags(hidden)
