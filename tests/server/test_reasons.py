"""What a researcher is told about a withhold: one reason for every cause that depends on data."""

from __future__ import annotations

from safeaccess.rules.decision import Decision, Finding
from safeaccess.rules.ruleset import DEFAULT_RULESET
from safeaccess.server.steps.failures import (
    DECIDABLE_RUNNER_CODES,
    failure_decision,
    is_data_dependent,
)
from safeaccess.server.steps.reasons import REVIEWED, WITHHELD, researcher_reasons


def _decision(*findings: tuple[str, str, str | None]) -> Decision:
    made = [
        Finding(check=c, verdict=v, item=i, message=f"{c} on {i}: 3 records")
        for c, v, i in findings
    ]
    verdicts = {f.verdict for f in made}
    verdict = (
        "withhold" if "withhold" in verdicts else "review" if "review" in verdicts else "release"
    )
    return Decision(
        verdict=verdict,
        findings=made,
        ruleset=DEFAULT_RULESET.label,
        ruleset_hash=DEFAULT_RULESET.content_hash(),
    )


def test_a_zero_cell_and_a_one_record_cell_read_the_same() -> None:
    zero = researcher_reasons(_decision(("zeros", "withhold", "region=North")))
    one = researcher_reasons(_decision(("threshold", "withhold", "region=North")))
    many = researcher_reasons(
        _decision(
            ("threshold", "withhold", "a"),
            ("threshold", "withhold", "b"),
            ("dof", "withhold", None),
        )
    )
    assert zero == one == many == [WITHHELD]
    assert "3" not in WITHHELD.message and WITHHELD.item is None


def test_a_check_added_later_gets_the_uniform_reason() -> None:
    for check in ("query_set", "leverage", "dp_budget", "something_new"):
        assert researcher_reasons(_decision((check, "withhold", None))) == [WITHHELD]
        assert researcher_reasons(_decision((check, "review", None))) == [REVIEWED]


def test_a_failure_that_depends_on_data_is_a_withhold_with_the_same_reason() -> None:
    for code in ("no_rows", "too_few_rows", "singular", "bad_group", "limit_exceeded", "new_code"):
        assert is_data_dependent(code)
        decision = failure_decision(code, "a message", DEFAULT_RULESET)
        assert decision.verdict == "withhold" and code in decision.findings[0].message
        assert researcher_reasons(decision) == [WITHHELD]
    assert not any(is_data_dependent(code) for code in DECIDABLE_RUNNER_CODES)


def test_only_analysis_decided_causes_are_named() -> None:
    script = researcher_reasons(_decision(("script", "review", None)))
    assert [r.check for r in script] == ["script"]
    # A script finding beside a data-dependent one: the data-dependent one decides what is shown.
    mixed = researcher_reasons(
        _decision(("script", "review", None), ("missing_values", "review", "x"))
    )
    assert mixed == [REVIEWED]
    assert researcher_reasons(_decision(("threshold", "release", None))) == []
