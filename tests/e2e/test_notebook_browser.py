"""The notebook cards rendered by a real browser (Playwright + Chromium): a released table shows
as a table, verdict badges are coloured by verdict, and an output's markup is shown as text, never
interpreted. Skips without Playwright or Chromium unless SAFEACCESS_REQUIRE_BROWSER=1 (CI)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e_helpers import Centre, add_dataset, serving, set_dp

from safeaccess.client.session import connect
from safeaccess.server.demo.applicants import applicants_metadata, generate_applicants
from safeaccess.server.demo.data import census_metadata
from safeaccess.server.http.embedded import EmbeddedServer
from safeaccess.server.service import Service

REQUIRE_BROWSER = os.environ.get("SAFEACCESS_REQUIRE_BROWSER") == "1"
if REQUIRE_BROWSER:
    import playwright.sync_api as playwright_sync
else:
    playwright_sync = pytest.importorskip("playwright.sync_api")

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"]


@pytest.fixture(scope="module")
def page() -> Iterator[Any]:
    if not Path(CHROMIUM).exists():
        message = f"{CHROMIUM} is missing (apt-get install chromium)"
        if REQUIRE_BROWSER:
            pytest.fail(message)
        pytest.skip(message)
    with playwright_sync.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(viewport={"width": 1200, "height": 900})
            context.set_default_timeout(10_000)
            yield context.new_page()
        finally:
            browser.close()


def test_results_card_renders_tables_and_coloured_badges(
    centre: Centre, server: tuple[Service, EmbeddedServer], page: Any
) -> None:
    _, srv = server
    with connect(srv.url, centre.keys["ada"], "ada") as session:
        plan = session.plan("census").frequency_table("sex").frequency_table("ethnicity", "region")
        results = session.run(session.seal(plan))
    assert [r.status for r in results] == ["released", "withheld"]
    page.set_content(f"<html><body>{results._repr_html_()}</body></html>")

    steps = page.locator('[data-safeaccess="step"]')
    assert steps.count() == 2
    table = steps.nth(0).locator("table.dataframe")
    assert table.count() == 1
    females = int((centre.census.sex == "F").sum())
    assert str(females) in table.inner_text()
    released = steps.nth(0).locator('[data-status="released"]')
    withheld = steps.nth(1).locator('[data-status="withheld"]')
    assert released.inner_text() == "RELEASED" and withheld.inner_text() == "WITHHELD"
    colour = "(el) => getComputedStyle(el).backgroundColor"
    assert released.evaluate(colour) == "rgb(27, 127, 59)"
    assert withheld.evaluate(colour) == "rgb(179, 38, 30)"
    assert "disclosure_control" in steps.nth(1).inner_text()

    # Markup in an output is shown as text in the card: no element is created from it.
    from safeaccess.client.results import StepResult

    hostile = StepResult.from_json(
        {
            "sequence_id": "s",
            "index": 1,
            "state": "released",
            "last": True,
            "kind": "script",
            "analysis": {},
            "output": {"type": "script", "stdout": "<b id='x'>bold</b>", "result": None},
        }
    )
    page.set_content(f"<html><body>{hostile._repr_html_()}</body></html>")
    assert page.locator("#x").count() == 0
    assert "<b id='x'>bold</b>" in page.locator('[data-safeaccess="step"]').inner_text()


@pytest.fixture(scope="module")
def cards_server(centre: Centre) -> Iterator[EmbeddedServer]:
    """The module's centre plus a DP-enabled census and the applicants (for a model)."""
    add_dataset(
        centre.root,
        name="dpcensus",
        frame=centre.census,
        metadata=census_metadata("dpcensus"),
        project="p1",
    )
    add_dataset(
        centre.root,
        name="applicants",
        frame=generate_applicants(),
        metadata=applicants_metadata("applicants"),
        project="p1",
    )
    set_dp(centre.root, "dpcensus", "1", "1e-5")
    with serving(centre.root) as (_, srv):
        yield srv


def test_plan_sealed_model_and_dp_cards_render(
    centre: Centre, cards_server: EmbeddedServer, page: Any
) -> None:
    census = centre.census
    with connect(cards_server.url, centre.keys["ada"], "ada") as session:
        plan = session.plan("census").frequency_table("region", where="sex == 'F'")
        page.set_content(f"<html><body>{plan._repr_html_()}</body></html>")
        card = page.locator('[data-safeaccess="plan"]')
        assert "Plan on census" in card.inner_text() and "1 analyses" in card.inner_text()
        assert "sex == 'F'" in card.locator("li").inner_text()  # escaped, shown as text
        sealed = session.seal(plan)
        page.set_content(f"<html><body>{sealed._repr_html_()}</body></html>")
        text = page.locator('[data-safeaccess="sealed"]').inner_text()
        assert "ada" in text and "p1" in text and "census" in text

        model_plan = session.plan("applicants").train_model(
            "logistic_regression", "approved", ["age", "income", "region"], roc=True
        )
        (trained,) = session.run(session.seal(model_plan))
        dp_plan = session.plan("dpcensus").dp_count(by="sex", sigma=50.0)
        (noisy,) = session.run(session.seal(dp_plan))
    assert trained.released and noisy.released, (trained.describe(), noisy.describe())

    page.set_content(f"<html><body>{trained.model()._repr_html_()}</body></html>")
    text = page.locator('[data-safeaccess="model"]').inner_text()
    assert "logistic_regression" in text and f"tested on {trained.output['n_test']}" in text  # type: ignore[index]
    assert f"{len(trained.output['roc'])} points" in text  # type: ignore[index]

    dp = noisy.dp
    assert dp is not None
    page.set_content(f"<html><body>{dp._repr_html_()}</body></html>")
    text = page.locator('[data-safeaccess="dp"]').inner_text()
    assert "dp_count" in text
    table = page.locator('[data-safeaccess="dp"] table.dp tr')
    assert table.count() == 1 + len(dp.groups)  # a header and one row per group
    for row, group, est, se in zip(
        range(1, table.count()), dp.groups, dp.estimates(), dp.standard_errors(), strict=True
    ):
        cells = table.nth(row).inner_text()
        assert str(group[0]) in cells and f"{est[0]:.4g} ± {se[0]:.3g}" in cells
    # the step card of the DP answer shows its frame as a real table
    page.set_content(f"<html><body>{noisy._repr_html_()}</body></html>")
    rows = page.locator('[data-safeaccess="step"] table.dataframe tbody tr')
    assert rows.count() == len(census.sex.cat.categories)
