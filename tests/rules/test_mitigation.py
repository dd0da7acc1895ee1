"""Suppression with secondary suppression and recomputed margins; rounding; refusals."""

from __future__ import annotations

import numpy as np
import pytest
from _rules_kit import count_table, magnitude_table
from hypothesis import given, settings
from hypothesis import strategies as st

from safeaccess.rules.engine import check, mitigate
from safeaccess.rules.mitigation import MitigationError
from safeaccess.rules.outputs import QuerySet, ScriptFacts, ScriptOutput, TableOutput


def _worked_example() -> TableOutput:
    #          a   b   c | All
    # x       20  15   3 |  38
    # y       12  25  30 |  67
    # z       18  11  14 |  43
    # All     50  51  47 | 148
    return count_table(
        [[20, 15, 3], [12, 25, 30], [18, 11, 14]], ["x", "y", "z"], ["a", "b", "c"], margins=True
    )


def test_suppression_worked_example() -> None:
    out = mitigate(_worked_example(), suppress=True)
    assert isinstance(out, TableOutput)
    # primary: (x, c) = 3. Row x then has one suppressed cell: its smallest other is (x, b) 15.
    # Column c has one: its smallest other is (z, c) 14. Column b now has one: (z, b) 11.
    # Rows x, z and columns b, c each hold two suppressed cells: stable.
    expected = {(0, 2), (0, 1), (2, 2), (2, 1)}
    assert out.suppressed is not None
    got = {(i, j) for i in range(3) for j in range(3) if out.suppressed[i][j]}
    assert got == expected
    # margins recomputed from the released cells only, by hand:
    # rows: x 20, y 12+25+30 = 67, z 18; columns: a 50, b 25, c 30; total 20+67+18 = 105
    assert [row[3] for row in out.values[:3]] == [20.0, 67.0, 18.0]
    assert out.values[3] == [50.0, 25.0, 30.0, 105.0]
    assert all(out.values[i][j] is None for i, j in expected)
    # no row or column leaves exactly one suppressed cell to be recovered by subtraction
    sup = np.array(out.suppressed)[:3, :3]
    assert 1 not in set(sup.sum(axis=0)) | set(sup.sum(axis=1))
    d = check(out)
    assert d.verdict == "release"
    assert [f.check for f in d.findings] == ["suppression"]  # said, never silent


def test_original_is_unchanged_and_checks_still_withhold_it() -> None:
    table = _worked_example()
    before = table.model_dump()
    mitigate(table, suppress=True, round_to=5)
    assert table.model_dump() == before
    assert check(table).verdict == "withhold"


def test_rounding_to_base_five_rebuilds_margins_and_keeps_checks() -> None:
    out = mitigate(_worked_example(), round_to=5)
    assert isinstance(out, TableOutput)
    # nearest multiple of 5: 20 15 3->5 / 12->10 25 30 / 18->20 11->10 14->15
    assert out.values[:3] == [[20, 15, 5, 40], [10, 25, 30, 65], [20, 10, 15, 45]]
    assert out.values[3] == [50, 50, 50, 150]  # margins add up the rounded cells
    assert out.rounded_to == 5
    d = check(out)
    # rounding does not make the 3-record cell safe: the facts are unrounded
    assert d.verdict == "withhold"
    assert {"threshold", "rounding"} <= {f.check for f in d.findings}


def test_suppress_then_round() -> None:
    out = mitigate(_worked_example(), suppress=True, round_to=10)
    assert isinstance(out, TableOutput)
    assert out.values[1][:3] == [10, 30, 30]  # 12 -> 10; 25 -> 30 (halves round up); 30
    d = check(out)
    assert d.verdict == "release"
    assert {f.check for f in d.findings} == {"suppression", "rounding"}


def test_magnitude_suppression_recomputes_mean_margins() -> None:
    # one row of three cells with margins is built by the tabulator elsewhere; here a sum table
    table = magnitude_table([[[500, 400, *[10] * 10], [10] * 12, [20] * 15]])
    out = mitigate(table, suppress=True)
    assert isinstance(out, TableOutput)
    # s0 is dominated (NK); the row has three cells so a second one must go: the smallest
    # non-empty other by count is s1 (12 records)
    assert out.suppressed == [[True, True, False]]
    assert check(out).verdict == "release"


def test_query_set_drops_records_of_suppressed_cells() -> None:
    table = count_table([[20, 3], [12, 25]], ["x", "y"], ["a", "b"])
    index = np.array([0] * 20 + [1] * 3 + [2] * 12 + [3] * 25 + [-1] * 5, dtype=np.int32)
    qs = QuerySet.from_array(["x,a", "x,b", "y,a", "y,b"], index)
    table = table.model_copy(update={"facts": table.facts.model_copy(update={"query_set": qs})})
    out = mitigate(table, suppress=True)
    assert isinstance(out, TableOutput) and out.facts.query_set is not None
    # (x,b) primary; row x -> (x,a); column b -> (y,b); column a has (x,a) -> (y,a): all four
    kept = out.facts.query_set.to_array()
    assert out.suppressed == [[True, True], [True, True]]
    assert (kept == -1).all()


def test_refusals() -> None:
    with pytest.raises(MitigationError, match="tables only"):
        mitigate(ScriptOutput(stdout="", facts=ScriptFacts(stdout_bytes=0)), suppress=True)
    with pytest.raises(MitigationError, match="positive"):
        mitigate(_worked_example(), round_to=0)
    once = mitigate(_worked_example(), round_to=5)
    with pytest.raises(MitigationError, match="already"):
        mitigate(once, round_to=5)
    table = _worked_example()
    assert mitigate(table) is table  # nothing requested: unchanged


def test_a_recomputed_margin_that_fails_is_hidden_too(monkeypatch: pytest.MonkeyPatch) -> None:
    # exact margins of released cells pass whenever the cells pass (a union is no more dominated
    # than its parts); the safety net matters for approximate margin facts (units spanning
    # cells). Simulate a check that rejects the recomputed grand total.
    import safeaccess.rules.mitigation as mitigation
    from safeaccess.rules.checks.cells import Located
    from safeaccess.rules.checks.tables import table_findings
    from safeaccess.rules.decision import Finding

    def strict(output: TableOutput, rs: object) -> list[Located]:
        found = table_findings(output, rs)  # type: ignore[arg-type]
        if output.suppressed is not None:  # after suppression: fail the grand total
            found.append(Located(3, 3, Finding(check="x", verdict="withhold", message="x")))
        return found

    monkeypatch.setattr(mitigation, "table_findings", strict)
    out = mitigate(_worked_example(), suppress=True)
    assert isinstance(out, TableOutput) and out.suppressed is not None
    assert out.suppressed[3][3] is True and out.values[3][3] is None
    assert out.values[3][0] == 50.0  # the other margins stay


@settings(max_examples=80, deadline=None)
@given(
    st.integers(1, 5).flatmap(
        lambda r: st.integers(1, 5).flatmap(
            lambda c: st.lists(
                st.lists(st.integers(0, 40), min_size=c, max_size=c), min_size=r, max_size=r
            )
        )
    )
)
def test_suppression_properties(counts: list[list[int]]) -> None:
    rows = [f"r{i}" for i in range(len(counts))]
    cols = [f"c{j}" for j in range(len(counts[0]))]
    table = count_table(counts, rows, cols, margins=True)
    out = mitigate(table, suppress=True)
    assert isinstance(out, TableOutput)
    body = np.array(counts)
    sup = np.array(out.suppressed if out.suppressed is not None else [[False]])[:-1, :-1]
    # no line of two or more cells leaves a single hidden cell to recover by subtraction
    if body.shape[1] > 1:
        assert 1 not in sup.sum(axis=1)
    if body.shape[0] > 1:
        assert 1 not in sup.sum(axis=0)
    # released margins are the sums of the released cells
    shown = np.where(sup, 0, body)
    for i in range(body.shape[0]):
        if out.values[i][-1] is not None:
            assert out.values[i][-1] == shown[i].sum()
    if out.values[-1][-1] is not None:
        assert out.values[-1][-1] == shown.sum()
    # what is left is safe
    assert check(out).verdict == "release"
