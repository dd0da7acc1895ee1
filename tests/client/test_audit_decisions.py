"""Re-deriving decisions from logged facts (pure Python, no rules library)."""

from __future__ import annotations

from safeaccess.client.audit.decisions import combine, fact_problems, feature_withholds

RULES = {"threshold": 10, "dof": 10, "nk_n": 2, "nk_k": 0.9, "p_ratio": 0.1}


def test_threshold_on_released_cells_only() -> None:
    facts = {"output": "table", "statistic": "count", "counts": [[12, 9], [0, 40]]}
    assert fact_problems(facts, RULES) == ["cell (0, 1) rests on 9 units, below the threshold 10"]
    suppressed = dict(facts, suppressed=[[False, True], [False, False]])
    assert fact_problems(suppressed, RULES) == []
    assert fact_problems(facts, dict(RULES, threshold=5)) == []


def test_magnitude_tables_use_contributors_and_dominance() -> None:
    facts = {
        "output": "table",
        "statistic": "sum",
        "counts": [[30, 30]],
        "contributors": [[30, 4]],
        "dominance_shares": [[[0.5, 0.95, 0.97], [0.2, 0.3, 0.4]]],
        "p_ratio": [[0.05, 3.0]],
    }
    problems = fact_problems(facts, RULES)
    assert any("cell (0, 1) rests on 4 units" in p for p in problems)
    assert any("cell (0, 0): the 2 largest contributors hold 95.0%" in p for p in problems)
    assert any("cell (0, 0): p-ratio 0.050" in p for p in problems)
    assert len(problems) == 3


def test_models_need_residual_degrees_of_freedom() -> None:
    assert fact_problems({"output": "regression", "df_resid": 4.0}, RULES)
    assert not fact_problems({"output": "regression", "df_resid": 10.0}, RULES)


def test_verdicts_combine_and_features_can_withhold() -> None:
    assert combine([]) == "release"
    assert combine(["release", "review"]) == "review"
    assert combine(["review", "withhold", "release"]) == "withhold"
    assert feature_withholds({"qss": {"admitted": False}, "dp": {"verdict": "release"}}) == [
        "qss decided withhold"
    ]
