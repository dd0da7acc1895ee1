"""Histograms: per-bin threshold, interior empty bins, bin edges that reveal extremes."""

from __future__ import annotations

import itertools

from safeaccess.rules.engine import check
from safeaccess.rules.outputs import CellFacts, TableFacts, TableOutput


def _hist(counts: list[int], edges: list[float], from_data: bool | None) -> TableOutput:
    # the runner's layout: one row (no `by`), one column per bin
    labels = [[f"[{a:g}, {b:g})"] for a, b in itertools.pairwise(edges)]
    return TableOutput(
        source="histogram",
        statistic="count",
        value="age",
        row_vars=[],
        col_vars=["age"],
        row_labels=[[]],
        col_labels=labels,
        values=[[float(c) for c in counts]],
        bin_edges=edges,
        facts=TableFacts(
            cells=CellFacts(counts=[counts]), n_total=sum(counts), bin_edges_from_data=from_data
        ),
    )


EDGES = [0.0, 20.0, 40.0, 60.0, 80.0, 100.0, 120.0]


def test_declared_edges_with_empty_tails_and_full_bins_release() -> None:
    # tails [0,20) and [100,120) are empty: not disclosive (ACRO #308); every other bin >= 10
    d = check(_hist([0, 12, 30, 25, 11, 0], EDGES, from_data=False))
    assert d.verdict == "release", d.findings


def test_small_extreme_bin_and_interior_gap_are_withheld() -> None:
    # [20,40) has 4 records (threshold); [60,80) is empty between non-empty bins (zeros)
    d = check(_hist([0, 4, 30, 0, 11, 0], EDGES, from_data=False))
    assert {(f.check, f.item) for f in d.findings} == {
        ("threshold", "age=[20, 40)"),
        ("zeros", "age=[60, 80)"),
    }


def test_edges_from_data_reveal_min_and_max() -> None:
    d = check(_hist([12, 30, 25, 11], [17.0, 40.0, 63.0, 86.0, 109.0], from_data=True))
    assert d.verdict == "withhold"
    (f,) = d.findings
    assert f.check == "bin_edges" and "17" in f.message and "109" in f.message


def test_unknown_edge_provenance_goes_to_review() -> None:
    d = check(_hist([12, 30, 25, 11], [0.0, 25.0, 50.0, 75.0, 100.0], from_data=None))
    assert d.verdict == "review" and d.findings[0].check == "bin_edges"
