"""The engine calls `safeaccess.rules.reconstruction.reconstruction_findings` for summaries
(imported directly by `checks/summary.py`: one distribution, no optional hook)."""

from __future__ import annotations

import pytest

from safeaccess.rules.checks import summary
from safeaccess.rules.decision import Finding
from safeaccess.rules.engine import DEFAULT_RULESET, check
from safeaccess.rules.outputs import (
    SummaryFacts,
    SummaryGroup,
    SummaryGroupFacts,
    SummaryOutput,
    SummaryVariableFacts,
    VariableSummary,
)
from safeaccess.rules.ruleset import RuleSet


def _likert(n: int, mean: float, sd: float) -> SummaryOutput:
    return SummaryOutput(
        by=[],
        statistics=["mean", "sd"],
        round=None,
        groups=[
            SummaryGroup(
                labels=[],
                variables=[VariableSummary(variable="score", n=n, stats={"mean": mean, "sd": sd})],
            )
        ],
        facts=SummaryFacts(
            groups=[
                SummaryGroupFacts(
                    labels=[],
                    n=n,
                    variables={
                        "score": SummaryVariableFacts(
                            n=n,
                            n_distinct=2,
                            scale=(1, 5),
                            value_counts={"1": 0, "2": 0, "3": 0, "4": n - 1, "5": 1},
                            top=[5.0, 4.0, 4.0],
                            total=4.0 * (n - 1) + 5.0,
                            negative=False,
                        )
                    },
                )
            ],
            n_total=n,
        ),
    )


def test_hook_passes_output_and_ruleset(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[object, object]] = []

    def fake(output: SummaryOutput, ruleset: RuleSet) -> list[Finding]:
        seen.append((output, ruleset))
        return [Finding(check="reconstruction", verdict="withhold", message="pinned")]

    monkeypatch.setattr(summary, "reconstruction_findings", fake)
    out = _likert(20, 4.05, 0.2236)
    d = check(out)
    assert d.verdict == "withhold" and d.findings[-1].message == "pinned"
    assert seen == [(out, DEFAULT_RULESET)]
    # switched off in the rule set: not called
    check(out, DEFAULT_RULESET.with_overrides({"reconstruction": False}))
    assert len(seen) == 1


def test_real_module_flags_mean_and_sd_that_identify_every_value() -> None:
    # 19 fours and one five on a 1..5 scale: mean 4.05, sd sqrt(0.95/19) = 0.2236 exactly
    # determine the multiset uniquely (only one 5 among 20 values), so every value is known
    n = 20
    mean = (19 * 4 + 5) / n
    sd = (((19 * (4 - mean) ** 2) + (5 - mean) ** 2) / (n - 1)) ** 0.5
    d = check(_likert(n, mean, sd))
    assert any(f.check.startswith("reconstruction") and f.verdict == "withhold" for f in d.findings)
