"""`result.plot()` through the real server and client: each released output drawn from its
released numbers (bar heights are the released counts, intervals the released standard errors)."""

from __future__ import annotations

from pathlib import Path

import pytest
from e2e_helpers import Centre

from safeaccess.client.session import connect
from safeaccess.server.http.embedded import EmbeddedServer
from safeaccess.server.service import Service

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")


def test_histograms_tables_and_regressions_plot_their_released_numbers(
    centre: Centre, server: tuple[Service, EmbeddedServer], tmp_path: Path
) -> None:
    import matplotlib.pyplot as plt

    _, srv = server
    with connect(srv.url, centre.keys["ada"], "ada") as session:
        plan = (
            session.plan("census")
            .histogram("age", edges=[16, 30, 45, 60, 75, 95])
            .frequency_table("region", "sex")
            .ols("income ~ age + C(sex)")
            .frequency_table("ethnicity", "region")  # withheld
        )
        hist, table, ols, withheld = session.run(session.seal(plan))
    assert [r.status for r in (hist, table, ols)] == ["released"] * 3, hist.describe()

    ax = hist.plot()
    heights = [p.get_height() for p in ax.patches]
    assert heights == [float(v) for v in hist.output["values"][0]]  # type: ignore[index]
    assert len(heights) == 5
    ax.figure.savefig(tmp_path / "hist.png")
    assert (tmp_path / "hist.png").stat().st_size > 1000

    ax = table.plot()
    frame = table.frame()
    assert sorted(p.get_height() for p in ax.patches) == sorted(
        float(v) for v in frame.to_numpy().ravel()
    )

    ax = ols.plot()
    coefficients = {c["term"]: c for c in ols.output["coefficients"]}  # type: ignore[index]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels == [t for t in coefficients if t != "Intercept"]
    points = ax.lines[0].get_xdata()
    assert list(points) == [coefficients[t]["estimate"] for t in labels]

    with pytest.raises(ValueError, match="nothing was released"):
        withheld.plot()
    plt.close("all")
