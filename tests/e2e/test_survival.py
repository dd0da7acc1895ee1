"""Kaplan-Meier `survival` through the real server, sandbox and client: a pooled curve is
released with the estimate statsmodels computes from the same records, a curve with one thin
event step is withheld (the rule check names that step to output checkers only), a curve that
differs from a released one by one record is refused by the query-set auditor, and the released
curve plots as a step line of the released estimates."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pandas as pd
import pytest
import statsmodels.api as sm
from e2e_helpers import Centre, add_dataset, serving

from safeaccess.client.analyses import Survival
from safeaccess.client.metadata import DatasetMetadata
from safeaccess.client.results import StepResult
from safeaccess.client.session import connect
from safeaccess.client.validation import AnalysisInvalid
from safeaccess.server.http.embedded import EmbeddedServer
from safeaccess.server.service import Service

DATASET = "cohort"
# One record censored at a time no other record has: the target of the differencing attack.
LONE_DAY = 333.3


def _cohort() -> pd.DataFrame:
    """Per arm and quarter (90 days): 40 deaths and 20 censored; 60 followed past day 900.
    Arm a also has 4 deaths at day 1000 (one pooled step of 4 events) and 30 censored later."""
    days: list[float] = []
    died: list[int] = []
    arm: list[str] = []
    for a in ("a", "b"):
        for k in range(1, 9):
            censored = [90.0 * k - 10] * 20
            if a == "b" and k == 4:
                censored = [90.0 * k - 10] * 19 + [LONE_DAY]
            days += [90.0 * k - 45] * 40 + censored
            died += [1] * 40 + [0] * 20
            arm += [a] * 60
        days += [900.0] * 60
        died += [0] * 60
        arm += [a] * 60
    days += [1000.0] * 4 + [1100.0] * 30
    died += [1] * 4 + [0] * 30
    arm += ["a"] * 34
    n = len(days)
    return pd.DataFrame(
        {
            "patient": np.arange(1, n + 1, dtype=np.int64),
            "arm": pd.Categorical(arm, categories=["a", "b"]),
            "days": days,
            "died": died,
        }
    )


METADATA = DatasetMetadata.model_validate(
    {
        "name": DATASET,
        "record_key": "patient",
        "columns": [
            {"name": "patient", "type": "identifier"},
            {"name": "arm", "type": "categorical", "levels": ["a", "b"]},
            {"name": "days", "type": "continuous", "bounds": [0, 2000], "unit": "days"},
            {"name": "died", "type": "integer", "bounds": [0, 1]},
        ],
    }
)


@pytest.fixture(scope="module")
def cohort_server(centre: Centre) -> Iterator[tuple[Service, EmbeddedServer]]:
    add_dataset(centre.root, name=DATASET, frame=_cohort(), metadata=METADATA, project="p1")
    with serving(centre.root) as (service, srv):
        yield service, srv


def _run(centre: Centre, srv: EmbeddedServer, build: list[dict[str, object]]) -> list[StepResult]:
    with connect(srv.url, centre.keys["ada"], "ada") as session:
        plan = session.plan(DATASET)
        for fields in build:
            plan.survival("days", "died", **fields)  # type: ignore[arg-type]
        return session.run(session.seal(plan))


def _findings(service: Service, result: StepResult) -> list[dict[str, object]]:
    step = service.store.get_step(result.sequence_id, result.index)
    assert step is not None and step.decision is not None
    return list(step.decision["findings"])


def test_pooled_curve_is_released_as_statsmodels_computes_it(
    centre: Centre, cohort_server: tuple[Service, EmbeddedServer]
) -> None:
    (result,) = _run(centre, cohort_server[1], [{"by": "arm", "interval": 90, "max_time": 720}])
    assert result.status == "released", result.describe()
    frame = result.frame()
    df = _cohort()
    for level in ("a", "b"):
        sub = df[df.arm == level]
        late = sub.days > 720
        t = np.ceil(np.where(late, 720, sub.days) / 90) * 90
        ref = sm.SurvfuncRight(t, np.where(late, 0, sub.died))
        mine = frame[frame.arm == level]
        assert mine.time.tolist() == list(ref.surv_times)
        assert mine.at_risk.tolist() == [int(x) for x in ref.n_risk]
        assert mine.events.tolist() == [int(x) for x in ref.n_events]
        assert np.allclose(mine.survival, ref.surv_prob)
        assert np.allclose(mine.std_error, ref.surv_prob_se)
    # nothing the researcher sees is beyond the released steps: no facts, no query set
    assert "facts" not in (result.output or {})


def test_one_thin_event_step_withholds_the_curve(
    centre: Centre, cohort_server: tuple[Service, EmbeddedServer]
) -> None:
    service, srv = cohort_server
    (result,) = _run(centre, srv, [{"by": "arm", "interval": 90}])
    assert result.status == "withheld"
    assert result.output is None
    assert [r.check for r in result.reasons] == ["disclosure_control"]  # no count, no step
    # day 1000 pools to 1080 (ceil(1000 / 90) * 90): 4 events there, fewer than 10
    withheld = [(f["check"], f["item"]) for f in _findings(service, result)]
    assert withheld == [("survival_events", "arm=a, time 1080")]


def test_curve_one_record_apart_is_refused_by_the_auditor(
    centre: Centre, cohort_server: tuple[Service, EmbeddedServer]
) -> None:
    service, srv = cohort_server
    curve = {"interval": 90, "max_time": 720}
    full, minus_one = _run(centre, srv, [curve, {**curve, "where": f"days != {LONE_DAY}"}])
    assert full.status == "released", full.describe()
    # every step of the second passes the rule check on its own (19 censored, not 20) ...
    assert minus_one.status == "withheld"
    # ... but its censored cell differs from the released one by one record
    assert [f["check"] for f in _findings(service, minus_one)] == ["query_set"]


def test_released_curve_plots_its_released_estimates(
    centre: Centre, cohort_server: tuple[Service, EmbeddedServer]
) -> None:
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    (result,) = _run(centre, cohort_server[1], [{"by": "arm", "interval": 90, "max_time": 720}])
    assert result.status == "released", result.describe()
    ax = result.plot()
    curves = result.output["curves"]  # type: ignore[index]
    assert len(ax.lines) == len(curves) == 2
    for line, curve in zip(ax.lines, curves, strict=True):
        assert list(line.get_xdata()) == [0.0] + [s["time"] for s in curve["steps"]]
        assert list(line.get_ydata()) == [1.0] + [s["survival"] for s in curve["steps"]]
        assert line.get_label() == curve["labels"][0]
    assert line.get_drawstyle() == "steps-post"
    plt.close("all")


def test_bad_survival_requests_are_refused_in_the_plan(
    centre: Centre, cohort_server: tuple[Service, EmbeddedServer]
) -> None:
    with connect(cohort_server[1].url, centre.keys["ada"], "ada") as session:
        plan = session.plan(DATASET)
        with pytest.raises(AnalysisInvalid, match="numeric column, but 'arm' is categorical"):
            plan.survival("arm", "died")
        with pytest.raises(AnalysisInvalid, match="interval"):
            plan.survival("days", "died", interval=-1)
        with pytest.raises(AnalysisInvalid, match="identifier"):
            plan.survival("days", "died", by="patient")
        assert len(plan) == 0
        # a valid curve rehearses on the mock (computed there, so never refused by itself)
        plan.survival("days", "died", by="arm", interval=90, max_time=720)
        (rehearsed,) = plan.rehearse(show=False).steps
        assert rehearsed.kind == "survival" and not rehearsed.doomed
        assert rehearsed.mock_verdict in ("release", "withhold")
    # the schema alone: an event column and a time column must differ
    with pytest.raises(ValueError):
        Survival(time="days", event="died", interval=float("nan"))
