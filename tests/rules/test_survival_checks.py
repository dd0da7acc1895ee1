"""Kaplan-Meier survival curves: the runner's estimate against statsmodels' `SurvfuncRight` and
hand counts, the rule check on every step's at-risk, event and censored counts, and the query
set the auditor receives (one cell per step's events and per step's censored records)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import statsmodels.api as sm

from safeaccess.client.analyses import Survival
from safeaccess.client.metadata import DatasetMetadata
from safeaccess.rules.engine import DEFAULT_RULESET, check
from safeaccess.rules.outputs import SurvivalOutput
from safeaccess.sandbox.runner import execute

META = DatasetMetadata.model_validate(
    {
        "name": "cohort",
        "columns": [
            {"name": "days", "type": "continuous"},
            {"name": "died", "type": "integer", "bounds": [0, 1]},
            {"name": "arm", "type": "categorical", "levels": ["a", "b"]},
        ],
    }
)


def _cohort(n: int = 900, seed: int = 3) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame(
        {
            "days": np.round(rng.exponential(300.0, n), 1),
            "died": rng.integers(0, 2, n),
            "arm": rng.choice(["a", "b"], n),
        }
    )


def _run(frame: pd.DataFrame, **fields: object) -> SurvivalOutput:
    out = execute(Survival(time="days", event="died", **fields), frame, META)  # type: ignore[arg-type]
    assert isinstance(out, SurvivalOutput)
    return out


def test_curve_matches_statsmodels_and_hand_counts() -> None:
    df = _cohort()
    out = _run(df, by=["arm"], interval=90.0, max_time=720.0)
    for curve in out.curves:
        sub = df[df.arm == curve.labels[0]]
        late = sub.days > 720.0
        t = np.ceil(np.where(late, 720.0, sub.days) / 90.0) * 90.0
        e = np.where(late, 0, sub.died)
        ref = sm.SurvfuncRight(t, e)
        steps = curve.steps
        assert [s.time for s in steps] == list(ref.surv_times)
        assert [s.at_risk for s in steps] == [int(x) for x in ref.n_risk]
        assert [s.events for s in steps] == [int(x) for x in ref.n_events]
        assert np.allclose([s.survival for s in steps], ref.surv_prob)
        assert np.allclose([s.std_error for s in steps], ref.surv_prob_se)
        for i, s in enumerate(steps):
            # censored until the next step: the drop in the number at risk not due to events
            nxt = ((t >= steps[i + 1].time).sum()) if i + 1 < len(steps) else 0
            assert s.censored == s.at_risk - s.events - nxt
            # pointwise log(-log) interval from statsmodels' standard error
            half = 1.959963984540054 * s.std_error / (s.survival * abs(math.log(s.survival)))  # type: ignore[operator]
            assert s.ci_low == pytest.approx(
                math.exp(-math.exp(math.log(-math.log(s.survival)) + half))
            )
            assert s.ci_high == pytest.approx(
                math.exp(-math.exp(math.log(-math.log(s.survival)) - half))
            )
        assert steps[-1].time == 720.0


def test_query_set_cells_are_the_released_counts() -> None:
    df = _cohort()
    out = _run(df, by=["arm"], interval=90.0, max_time=720.0)
    qs = out.facts.query_set
    assert qs is not None
    cells = qs.to_array()
    counts = np.bincount(cells[cells >= 0], minlength=len(qs.labels))
    expected = [n for curve in out.curves for s in curve.steps for n in (s.events, s.censored)]
    assert counts.tolist() == expected
    # every record behind a curve is in a cell (no records before the first event time here)
    assert (cells >= 0).sum() == len(df)
    # at risk at a step = the cells from that step on, within its curve
    first = out.curves[0].steps
    assert first[1].at_risk == sum(s.events + s.censored for s in first[1:])


def test_safe_curve_is_released_and_thin_steps_are_withheld() -> None:
    df = _cohort()
    safe = _run(df, interval=90.0, max_time=720.0)
    assert check(safe).verdict == "release", check(safe).findings
    # un-pooled times: steps of one or two events each
    raw = _run(df)
    decision = check(raw)
    assert decision.verdict == "withhold"
    threshold = DEFAULT_RULESET.survival_threshold
    flagged = {(f.check, f.item) for f in decision.findings}
    for s in raw.curves[0].steps:
        item = f"time {s.time:g}"
        assert (("survival_events", item) in flagged) == (s.events < threshold)
        assert (("survival_at_risk", item) in flagged) == (s.at_risk < threshold)
        assert (("survival_censored", item) in flagged) == (0 < s.censored < threshold)


def test_one_thin_event_step_withholds_the_curve() -> None:
    # 200 records: 30 events at day 10, 3 at day 20 (below 10), the rest censored at day 30
    days = [10.0] * 30 + [20.0] * 3 + [30.0] * 167
    died = [1] * 33 + [0] * 167
    df = pd.DataFrame({"days": days, "died": died, "arm": ["a"] * 200})
    out = _run(df)
    decision = check(out)
    assert decision.verdict == "withhold"
    assert [(f.check, f.item) for f in decision.findings] == [("survival_events", "time 20")]
    assert "3 events" in decision.findings[0].message


def test_a_group_without_events_is_withheld_as_a_zero() -> None:
    df = _cohort()
    df.loc[df.arm == "b", "died"] = 0
    out = _run(df, by=["arm"], interval=180.0, max_time=540.0)
    assert [len(c.steps) > 0 for c in out.curves] == [True, False]
    decision = check(out)
    assert decision.verdict == "withhold"
    assert [(f.check, f.item) for f in decision.findings] == [("survival_no_events", "arm=b")]
    off = DEFAULT_RULESET.with_overrides({"zeros_disclosive": False})
    assert check(out, off).verdict == "release"
