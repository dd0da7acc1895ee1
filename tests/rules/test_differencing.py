"""Pairwise differencing between a new output's query sets and earlier released ones."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np

from safeaccess.rules.differencing import differencing_findings
from safeaccess.rules.outputs import QuerySet

N = 100


def _out(labels: list[str], index: list[int] | np.ndarray) -> Any:
    qs = QuerySet.from_array(labels, np.asarray(index))
    return SimpleNamespace(facts=SimpleNamespace(query_set=qs))


def _one_cell(members: range | list[int]) -> Any:
    index = np.full(N, -1)
    index[list(members)] = 0
    return _out(["all"], index)


def test_everyone_and_everyone_but_a_few_are_flagged_both_ways() -> None:
    everyone = _one_cell(range(N))
    but_one = _one_cell(range(1, N))
    for new, old in ((but_one, everyone), (everyone, but_one)):
        found = differencing_findings(new, [old], threshold=10)
        assert [(f.check, f.verdict, f.item) for f in found] == [
            ("differencing", "withhold", "all")
        ]


def test_a_difference_of_exactly_the_threshold_is_allowed() -> None:
    base = _one_cell(range(N))
    assert differencing_findings(_one_cell(range(10, N)), [base], threshold=10) == []
    assert len(differencing_findings(_one_cell(range(9, N)), [base], threshold=10)) == 1


def test_identical_and_disjoint_query_sets_are_not_differencing() -> None:
    half = _one_cell(range(50))
    assert differencing_findings(_one_cell(range(50)), [half], threshold=10) == []
    assert differencing_findings(_one_cell(range(50, 53)), [half], threshold=10) == []


def test_cells_of_tables_are_compared_cell_by_cell() -> None:
    # Earlier: two cells of 50. New: the first cell without record 0, and the second unchanged.
    earlier = _out(["a", "b"], [0] * 50 + [1] * 50)
    new = _out(["a'", "b'"], [-1] + [0] * 49 + [1] * 50)
    found = differencing_findings(new, [earlier], threshold=10)
    assert [f.item for f in found] == ["a'"]


def test_outputs_without_query_sets_or_of_another_version_are_skipped() -> None:
    new = _one_cell(range(1, N))
    other_version = _out(["all"], [0] * (N + 5))
    no_facts: Any = SimpleNamespace(facts=SimpleNamespace(query_set=None))
    assert differencing_findings(new, [other_version, no_facts], threshold=10) == []
    assert differencing_findings(no_facts, [new], threshold=10) == []


def test_the_engine_applies_differencing_against_the_history() -> None:
    # Two regressions (each passes its own df check) on everyone and on everyone but three people.
    from safeaccess.rules.engine import check
    from safeaccess.rules.outputs import LeverageFacts, RegressionFacts, RegressionOutput

    def regression(members: range) -> RegressionOutput:
        index = np.full(N, -1)
        index[list(members)] = 0
        n = len(members)
        return RegressionOutput(
            family="ols",
            formula="y ~ x",
            n=n,
            df_resid=n - 2,
            df_model=1,
            coefficients=[],
            facts=RegressionFacts(
                n=n,
                df_resid=n - 2,
                df_model=1,
                categorical_only=False,
                saturated=False,
                regressors=[],
                query_set=QuerySet.from_array(["all"], index),
                leverage=LeverageFacts(n=n, max=2 / n, top=[2 / n]),
            ),
        )

    everyone, but_three = regression(range(N)), regression(range(3, N))
    assert check(everyone).verdict == "release"
    assert check(but_three).verdict == "release"
    decision = check(but_three, history=[everyone])
    assert decision.verdict == "withhold"
    assert [f.check for f in decision.findings] == ["differencing"]
