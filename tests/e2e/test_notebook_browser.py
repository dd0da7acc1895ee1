"""The notebook cards rendered by a real browser (Playwright + Chromium): a released table shows
as a table, verdict badges are coloured by verdict, and an output's markup is shown as text, never
interpreted. Skips without Playwright or Chromium unless SAFEACCESS_REQUIRE_BROWSER=1 (CI)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e_helpers import Centre

from safeaccess.client.session import connect
from safeaccess.server.embedded import EmbeddedServer
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
