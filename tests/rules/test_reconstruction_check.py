"""The reconstruction output check on summary outputs, with brute-force ground truth."""

from __future__ import annotations

from collections import Counter, defaultdict
from types import SimpleNamespace

import numpy as np
import pytest
from test_reconstruction_oracle import (
    frequency_bounds,
    mean_of,
    round_dec,
    round_sd,
    samples,
    variance_of,
)

from safeaccess.rules.decision import Finding
from safeaccess.rules.outputs import (
    Label,
    QuerySet,
    SummaryFacts,
    SummaryGroup,
    SummaryGroupFacts,
    SummaryOutput,
    SummaryVariableFacts,
    VariableSummary,
)
from safeaccess.rules.reconstruction import reconstruction_findings

K, N = 5, 10  # a 5-point scale and groups of 10: small enough to enumerate every sample
RULES = SimpleNamespace(threshold=10)
Sample = tuple[int, ...]


def _mean_sd(x: Sample) -> tuple[float, float]:
    return float(round_dec(mean_of(x), 2)), float(round_sd(variance_of(x), 2))


def _summary(
    x: Sample,
    stats: dict[str, float],
    *,
    labels: list[Label] | None = None,
    by: list[str] | None = None,
    value_counts: bool = True,
    query_set: QuerySet | None = None,
    scale: tuple[int, int] | None = (1, K),
) -> SummaryOutput:
    labels = labels if labels is not None else ["A"]
    by = by if by is not None else ["site"]
    counts = Counter(x)
    return SummaryOutput(
        by=by,
        statistics=[s for s in stats if s in ("mean", "sd", "median", "min", "max")],
        round=2,
        groups=[
            SummaryGroup(
                labels=labels,
                variables=[VariableSummary(variable="score", n=len(x), stats=dict(stats))],
            )
        ],
        facts=SummaryFacts(
            groups=[
                SummaryGroupFacts(
                    labels=labels,
                    n=len(x),
                    variables={
                        "score": SummaryVariableFacts(
                            n=len(x),
                            n_distinct=len(counts),
                            scale=scale,
                            value_counts=(
                                {str(v): counts.get(v, 0) for v in range(1, K + 1)}
                                if value_counts
                                else None
                            ),
                        )
                    },
                )
            ],
            query_set=query_set,
            n_total=len(x),
        ),
    )


def _groups_by(key: object) -> dict[object, list[Sample]]:
    out: dict[object, list[Sample]] = defaultdict(list)
    for x in samples(1, K, N):
        out[key(x)].append(x)  # type: ignore[operator]
    return out


BY_MEAN_SD = _groups_by(_mean_sd)
BY_MIN = _groups_by(lambda x: float(min(x)))


def _small_pinned(found: list[Sample], threshold: int = 10) -> dict[int, int]:
    return {
        v: lo
        for v, (lo, hi) in frequency_bounds(found, 1, K).items()
        if lo == hi and 0 < lo < threshold
    }


def _first(pred: object) -> Sample:
    for group in BY_MEAN_SD.values():
        for x in group:
            if pred(x, group):  # type: ignore[operator]
                return x
    raise AssertionError("no such sample on this scale")


UNIQUE = _first(lambda x, g: len(g) == 1 and len(set(x)) > 1)
PINNED = _first(lambda x, g: len(g) > 1 and _small_pinned(g))
SAFE = _first(lambda x, g: len(g) > 1 and not _small_pinned(g))


def _reco(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f.check == "reconstruction"]


def test_unique_mean_and_sd_withhold() -> None:
    mean, sd = _mean_sd(UNIQUE)
    findings = reconstruction_findings(_summary(UNIQUE, {"mean": mean, "sd": sd}), RULES)
    assert [f.verdict for f in findings] == ["withhold"]
    assert "only one possible set of values" in findings[0].message
    assert findings[0].item == "group site=A, score"


def test_sd_zero_reveals_every_value() -> None:
    x = (3,) * 12
    findings = reconstruction_findings(_summary(x, {"mean": 3.0, "sd": 0.0}), RULES)
    assert [f.verdict for f in findings] == ["withhold"]


def test_pinned_small_cell_is_withheld() -> None:
    mean, sd = _mean_sd(PINNED)
    expected = _small_pinned(BY_MEAN_SD[(mean, sd)])
    findings = reconstruction_findings(_summary(PINNED, {"mean": mean, "sd": sd}), RULES)
    assert {f.item for f in findings} == {f"group site=A, score={v}" for v in expected}
    assert all(f.verdict == "withhold" for f in findings)
    v, c = next(iter(expected.items()))
    message = next(f.message for f in findings if f.item and f.item.endswith(f"={v}"))
    assert f"exactly {c} record" in message and f"score = {v}" in message


def test_threshold_setting_is_respected() -> None:
    mean, sd = _mean_sd(PINNED)
    pinned = _small_pinned(BY_MEAN_SD[(mean, sd)])
    low = SimpleNamespace(threshold=min(pinned.values()))  # cells of that size are allowed
    findings = reconstruction_findings(_summary(PINNED, {"mean": mean, "sd": sd}), low)
    assert len(findings) == sum(1 for c in pinned.values() if c < low.threshold)


def test_safe_statistics_pass() -> None:
    mean, sd = _mean_sd(SAFE)
    assert reconstruction_findings(_summary(SAFE, {"mean": mean, "sd": sd}), RULES) == []


def test_variables_without_a_scale_are_not_checked() -> None:
    mean, sd = _mean_sd(UNIQUE)
    out = _summary(UNIQUE, {"mean": mean, "sd": sd}, scale=None)
    assert reconstruction_findings(out, RULES) == []


def test_switched_off_by_the_rule_set() -> None:
    mean, sd = _mean_sd(UNIQUE)
    off = SimpleNamespace(threshold=10, reconstruction=False)
    assert reconstruction_findings(_summary(UNIQUE, {"mean": mean, "sd": sd}), off) == []


def _joint_case() -> Sample:
    """A sample whose mean+SD alone and minimum alone are safe but together unique."""
    for x in samples(1, K, N):
        by_ms = BY_MEAN_SD[_mean_sd(x)]
        by_med = BY_MIN[float(min(x))]
        both = [y for y in by_ms if min(y) == min(x)]
        if (
            len(by_ms) > 1
            and len(by_med) > 1
            and not _small_pinned(by_ms)
            and not _small_pinned(by_med)
            and len(both) == 1
        ):
            return x
    raise AssertionError("no joint case on this scale")


JOINT = _joint_case()


def test_statistics_of_one_output_are_combined() -> None:
    # mean+SD alone and the minimum alone leave several samples; the three together pin one
    mean, sd = _mean_sd(JOINT)
    low = float(min(JOINT))
    assert reconstruction_findings(_summary(JOINT, {"mean": mean, "sd": sd}), RULES) == []
    assert reconstruction_findings(_summary(JOINT, {"min": low}), RULES) == []
    findings = reconstruction_findings(_summary(JOINT, {"mean": mean, "sd": sd, "min": low}), RULES)
    assert [f.verdict for f in findings] == ["withhold"]


def test_search_path_agrees_with_the_exact_path() -> None:
    mean, sd = _mean_sd(PINNED)
    out = _summary(PINNED, {"mean": mean, "sd": sd})
    exact = reconstruction_findings(out, RULES)
    tight = SimpleNamespace(threshold=10, reconstruction_max_steps=0)
    assert reconstruction_findings(out, tight) == exact
    umean, usd = _mean_sd(UNIQUE)
    unique_out = _summary(UNIQUE, {"mean": umean, "sd": usd})
    assert reconstruction_findings(unique_out, tight) == reconstruction_findings(unique_out, RULES)


def test_budget_exhausted_without_counts_goes_to_review() -> None:
    mean, sd = _mean_sd(PINNED)
    out = _summary(PINNED, {"mean": mean, "sd": sd}, value_counts=False)
    tight = SimpleNamespace(threshold=10, reconstruction_max_steps=0)
    findings = reconstruction_findings(out, tight)
    assert [f.verdict for f in findings] == ["review"]
    assert "output checker" in findings[0].message


def test_large_group_is_decided_quickly() -> None:
    rng = np.random.default_rng(7)
    x = tuple(sorted(int(v) for v in rng.integers(1, 11, size=1000)))
    mean = float(round_dec(mean_of(x), 2))
    sd = float(round_sd(variance_of(x), 2))
    counts = Counter(x)
    out = _summary(x, {"mean": mean, "sd": sd}, scale=(1, 10))
    out.facts.groups[0].variables["score"].value_counts = {
        str(v): counts.get(v, 0) for v in range(1, 11)
    }
    fast = SimpleNamespace(threshold=10, reconstruction_time_budget=1.0)
    assert reconstruction_findings(out, fast) == []


def test_inconsistent_release_goes_to_review() -> None:
    out = _summary(SAFE, {"mean": 9.5, "sd": 0.5})
    findings = reconstruction_findings(out, RULES)
    assert [f.verdict for f in findings] == ["review"]


def test_engine_runs_the_check() -> None:
    from safeaccess.rules.engine import check

    mean, sd = _mean_sd(UNIQUE)
    decision = check(_summary(UNIQUE, {"mean": mean, "sd": sd}))
    assert decision.verdict == "withhold"
    assert _reco(decision.findings)


@pytest.mark.parametrize("stat", ["median", "min", "max"])
def test_order_statistics_alone(stat: str) -> None:
    # everything at the bottom: min=1 leaves many samples; max=1 only one, and so does the
    # median, which at n = 10 is the mean of the 10-record window, i.e. of the whole group
    x = (1,) * N
    value = {"median": 1.0, "min": 1.0, "max": 1.0}[stat]
    findings = reconstruction_findings(_summary(x, {stat: value}), RULES)
    if stat in ("max", "median"):
        assert [f.verdict for f in findings] == ["withhold"]
    else:
        assert findings == []


def test_kernel_moves_keep_count_sum_and_sum_of_squares() -> None:
    from safeaccess.rules.reconstruction.search import _KERNEL_PATTERNS

    for pattern in _KERNEL_PATTERNS:
        for start in range(1, 6):
            values = range(start, start + len(pattern))
            assert sum(pattern) == 0
            assert sum(d * v for d, v in zip(pattern, values, strict=True)) == 0
            assert sum(d * v * v for d, v in zip(pattern, values, strict=True)) == 0


def test_local_alternatives_are_consistent_and_different() -> None:
    from safeaccess.rules.reconstruction import Admissible, SampleConstraints
    from safeaccess.rules.reconstruction.search import local_alternatives

    mean, sd = _mean_sd(SAFE)
    cons = SampleConstraints(
        1, K, N, (Admissible.released(mean, 2),), (Admissible.released(sd, 2),)
    )
    truth = [Counter(SAFE).get(v, 0) for v in range(1, K + 1)]
    brute = {tuple(Counter(y).get(v, 0) for v in range(1, K + 1)) for y in BY_MEAN_SD[(mean, sd)]}
    found = [tuple(a) for a in local_alternatives(cons, truth)]
    assert found and len(set(found)) == len(found)
    assert set(found) <= brute - {tuple(truth)}


def test_unusable_facts_do_not_crash_the_engine() -> None:
    mean, sd = _mean_sd(SAFE)
    empty = _summary(SAFE, {"mean": mean, "sd": sd})
    empty.facts.groups[0].variables["score"].n = 0
    assert reconstruction_findings(empty, RULES) == []
    odd = _summary(SAFE, {"q0.25": 1.0, "qx": 2.0, "q1.5": 3.0})  # bad keys are ignored
    plain = _summary(SAFE, {"q0.25": 1.0})
    assert reconstruction_findings(odd, RULES) == reconstruction_findings(plain, RULES)
    weird = _summary(SAFE, {"median": float("inf")})
    findings = reconstruction_findings(weird, RULES)
    assert [f.verdict for f in findings] == ["review"]
