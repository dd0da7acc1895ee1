"""Standard deviations and modes per table cell (`magnitude_table(agg="std"|"mode")`) through
the real server and client: released values are pandas' per-cell std and mode of the same
records; thin or revealing cells are withheld by the rule that says why (to checkers only)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from e2e_helpers import Centre

from safeaccess.client.results import StepResult
from safeaccess.client.session import connect
from safeaccess.client.validation import AnalysisInvalid
from safeaccess.server.http.embedded import EmbeddedServer
from safeaccess.server.service import Service


def _withheld_by(service: Service, result: StepResult) -> set[str]:
    step = service.store.get_step(result.sequence_id, result.index)
    assert step is not None and step.decision is not None
    return {str(f["check"]) for f in step.decision["findings"] if f["verdict"] == "withhold"}


def _smallest_mode(values: pd.Series) -> float:
    counts = values.value_counts()
    return float(min(counts[counts == counts.max()].index))


def test_std_and_mode_tables_release_pandas_values(
    centre: Centre, server: tuple[Service, EmbeddedServer]
) -> None:
    _, srv = server
    census = centre.census
    with connect(srv.url, centre.keys["ada"], "ada") as session:
        plan = (
            session.plan("census")
            .magnitude_table("income", "region", agg="std")
            .magnitude_table("health", "region", "sex", agg="mode")
        )
        std, mode = session.run(session.seal(plan))
    assert std.status == "released", std.describe()
    assert mode.status == "released", mode.describe()
    expected_std = census.groupby("region", observed=False).income.std()
    got = std.frame()
    assert np.allclose(got["std"].to_numpy(), expected_std.to_numpy())
    expected_mode = (
        census.groupby(["region", "sex"], observed=False).health.agg(_smallest_mode).unstack()
    )
    assert mode.frame().to_numpy().tolist() == expected_mode.to_numpy().tolist()


def test_thin_std_and_sparse_mode_cells_are_withheld(
    centre: Centre, server: tuple[Service, EmbeddedServer]
) -> None:
    service, srv = server
    census = centre.census
    with connect(srv.url, centre.keys["bob"], "bob") as session:
        std_plan = session.plan("census").magnitude_table(
            "income", "region", "ethnicity", agg="std"
        )
        (std,) = session.run(session.seal(std_plan))
        mode_plan = session.plan("census").magnitude_table("income", "region", agg="mode")
        (mode,) = session.run(session.seal(mode_plan))
    assert std.status == "withheld" and std.output is None
    sizes = pd.crosstab(census.region, census.ethnicity).to_numpy()
    # independently: some cell has 1..10 records (dof < 10), some has none
    assert ((sizes > 0) & (sizes - 1 < 10)).any()
    assert {"dof", "threshold"} <= _withheld_by(service, std)
    assert mode.status == "withheld"
    top = census.groupby("region", observed=False).income.agg(lambda s: s.value_counts().max())
    assert (top < 10).any()  # some region's modal income is held by fewer than 10 people
    assert "mode_support" in _withheld_by(service, mode)
    assert [r.check for r in mode.reasons] == ["disclosure_control"]


def test_std_table_with_suppressed_margins_is_refused_in_the_plan(
    centre: Centre, server: tuple[Service, EmbeddedServer]
) -> None:
    _, srv = server
    with connect(srv.url, centre.keys["ada"], "ada") as session:
        plan = session.plan("census")
        with pytest.raises(AnalysisInvalid, match="margins cannot be recomputed"):
            plan.magnitude_table("income", "region", agg="std", margins=True, suppress=True)
        with pytest.raises(AnalysisInvalid, match="agg"):
            plan.magnitude_table("income", "region", agg="median")  # type: ignore[arg-type]
        assert len(plan) == 0
