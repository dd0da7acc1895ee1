"""Notebook display through the real server and client: HTML cards of a plan, a sealed sequence,
each step and the results list (verdict badges, frames, escaped values), `frame()` for tests and
scripts and regressions that keep their fit, progress lines and the `on_step` callback."""

from __future__ import annotations

import pytest
from e2e_helpers import Centre, HtmlCards

from safeaccess.client.results import StepResult
from safeaccess.client.session import connect
from safeaccess.server.http.embedded import EmbeddedServer
from safeaccess.server.service import Service


def test_cards_frames_progress_and_on_step(
    centre: Centre, server: tuple[Service, EmbeddedServer]
) -> None:
    _, srv = server
    census = centre.census
    lines: list[str] = []
    seen: list[StepResult] = []
    with connect(srv.url, centre.keys["ada"], "ada") as session:
        plan = (
            session.plan("census")
            # the women of each region, a column of the standard region x sex table: the
            # women aged 18 and over were asked before the standard tables were reserved by
            # default, and that table is the reserved one less each region's few girls of 16
            # and 17, a genuine differencing conflict, so it is refused whoever asks
            .frequency_table("region", where="sex == 'F'")
            .t_test("income", "sex")
            .ols("income ~ age")
            .frequency_table("ethnicity", "region")  # withheld: small cells
        )
        shown = HtmlCards(plan._repr_html_())
        assert shown.cards == ["plan"] and "Plan on census@1: 4 analyses" in shown.words
        assert "sex == &#x27;F&#x27;" in plan._repr_html_()  # values are escaped
        sealed = session.seal(plan)
        sealed_card = HtmlCards(sealed._repr_html_())
        assert sealed_card.cards == ["sealed"] and "researcher ada" in sealed_card.words
        results = session.run(sealed, on_step=seen.append, progress=lines.append)

    assert [r.status for r in results] == ["released"] * 3 + ["withheld"]
    assert seen == list(results)  # on_step got every step, in order
    assert lines == [
        "step 1 of 4 (frequency_table): opening the sequence, running…",
        "step 1 of 4 (frequency_table): RELEASED",
        "step 2 of 4 (test): revealed, running…",
        "step 2 of 4 (test): RELEASED",
        "step 3 of 4 (regression): revealed, running…",
        "step 3 of 4 (regression): RELEASED",
        "step 4 of 4 (frequency_table): revealed, running…",
        "step 4 of 4 (frequency_table): WITHHELD",
    ]

    page = HtmlCards(results._repr_html_())
    assert page.cards == ["results", "step", "step", "step", "step"]
    assert page.badges == ["released"] * 3 + ["withheld"] + ["released"] * 3 + ["withheld"]
    women = census[census.sex == "F"]
    north = str(int((women.region == "North").sum()))
    assert f"North {north}" in page.words  # the released table, as a frame
    assert "disclosure_control" in page.words  # the withhold's reason

    test = results[1].frame()
    assert list(test.columns[:5]) == ["test", "statistic", "df", "p_value", "n"]
    assert test.loc[0, "n"] == census.income.notna().sum()
    ols = results[2].frame()
    assert ols.attrs["n"] == census[["income", "age"]].dropna().shape[0]
    assert ols.attrs["df_resid"] == ols.attrs["n"] - 2
    assert 0 <= ols.attrs["adj_r2"] <= ols.attrs["r2"] <= 1
    step = HtmlCards(results[2]._repr_html_())
    assert "r2" in step.words.split() and "df_resid" in step.words


def test_script_frames_and_cards() -> None:
    pd = pytest.importorskip("pandas")
    base = {
        "sequence_id": "s",
        "index": 1,
        "state": "released",
        "last": True,
        "kind": "script",
        "analysis": {},
    }
    table = StepResult.from_json(
        {**base, "output": {"type": "script", "stdout": "", "result": [{"a": 1}, {"a": 2}]}}
    )
    assert table.frame().equals(pd.DataFrame({"a": [1, 2]}))
    printed = StepResult.from_json(
        {**base, "output": {"type": "script", "stdout": "<b>hi</b>", "result": None}}
    )
    assert printed.frame().loc[0, "stdout"] == "<b>hi</b>"
    assert "&lt;b&gt;hi&lt;/b&gt;" in printed._repr_html_()


def test_progress_says_when_it_waits_for_an_output_checker(
    centre: Centre, server: tuple[Service, EmbeddedServer]
) -> None:
    _, srv = server
    lines: list[str] = []
    with connect(srv.url, centre.keys["bob"], "bob") as session:
        plan = session.plan("census").script("result = 1")
        results = session.run(
            session.seal(plan), review_timeout=0.3, poll_interval=0.1, progress=lines.append
        )
    assert [r.status for r in results] == ["review"]
    assert lines == [
        "step 1 of 1 (script): opening the sequence, running…",
        "step 1 of 1: in review, waiting for an output checker… (up to 0.3 s)",
        "step 1 of 1 (script): REVIEW",
    ]
