"""The output checkers' web workspace in a real browser (Playwright driving Debian's Chromium)
against a real server over HTTP with the process sandbox.

A researcher's magnitude table over a balance with a few negative contributions goes to review
(dominance is undefined there: the `negative_values: review` rule), and the dataset needs two
checkers. Checkers enrol with TOTP, log in, inspect the flagged cell, approve twice, reject with a
comment; the researcher's client sees the outcome. Security cases: own output, CSRF, idle
timeout, login rate limit, the separation of cookie sessions from signed requests.

Screenshots go to $SAFEACCESS_SCREENSHOTS (docs/img/review/ when the docs are refreshed).
"""

from __future__ import annotations

import getpass
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyotp
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from e2e_helpers import Centre, signed

from safeaccess.client.analyses import FrequencyTable, MagnitudeTable
from safeaccess.client.cli import main as client_main
from safeaccess.client.keys import fingerprint, public_key_text
from safeaccess.client.metadata import Column, DatasetMetadata
from safeaccess.client.session import connect
from safeaccess.server.admin.cli import main as server_cli
from safeaccess.server.config import DataDir
from safeaccess.server.datasets import register_dataset
from safeaccess.server.http.app import create_app
from safeaccess.server.http.embedded import EmbeddedServer
from safeaccess.server.review import rules as review_rules
from safeaccess.server.service import Service
from safeaccess.server.store import Store, catalogue
from safeaccess.server.web import accounts
from totp_codes import OneTimeCodes

# With SAFEACCESS_REQUIRE_BROWSER=1 (CI) a missing Playwright or Chromium fails, never skips.
REQUIRE_BROWSER = os.environ.get("SAFEACCESS_REQUIRE_BROWSER") == "1"
if REQUIRE_BROWSER:
    import playwright.sync_api as playwright_sync
else:
    playwright_sync = pytest.importorskip("playwright.sync_api")

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
PASSWORD = "correct horse battery staple"
LEDGER_ROWS = 400
REGIONS = ["North", "South", "East", "West"]


def _ledger() -> tuple[pd.DataFrame, DatasetMetadata]:
    """Balances: positive everywhere, with three negative ones in the West (so that cell goes to
    review, and only that cell)."""
    rng = np.random.default_rng(11)
    region = np.array([REGIONS[i % 4] for i in range(LEDGER_ROWS)])
    balance = np.exp(rng.normal(7.0, 0.4, LEDGER_ROWS)).round(0)
    west = np.flatnonzero(region == "West")[:3]
    balance[west] = -50.0
    frame = pd.DataFrame(
        {
            "account": np.arange(1, LEDGER_ROWS + 1, dtype=np.int64),
            "region": pd.Categorical(region, categories=REGIONS),
            "balance": balance,
        }
    )
    metadata = DatasetMetadata(
        name="ledger",
        description="Synthetic account balances",
        record_key="account",
        columns=[
            Column(name="account", type="identifier"),
            Column(name="region", type="categorical", levels=list(REGIONS)),
            Column(name="balance", type="continuous", bounds=(-100_000, 1_000_000), unit="EUR"),
        ],
    )
    return frame, metadata


@dataclass
class Web:
    service: Service
    url: str
    root: Path
    centre: Centre
    shots: Path
    app: Any
    codes: dict[str, OneTimeCodes] = field(default_factory=dict)

    def enrolled(self, name: str, secret: str) -> None:
        """Checker `name`'s TOTP secret, for her codes from now on."""
        self.codes[name] = OneTimeCodes(pyotp.TOTP(secret))

    def code(self, name: str) -> str:
        """A TOTP code the server has not seen yet for this checker (a code works once)."""
        return self.codes[name].code()


@pytest.fixture(scope="module")
def web(centre: Centre, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Web]:
    data = DataDir(centre.root)
    config = data.load_config()
    store = Store(data.database_url(config))
    try:
        if store.find_dataset("ledger") is None:
            frame, metadata = _ledger()
            register_dataset(
                data, store, name="ledger", frame=frame, metadata=metadata, project="p1"
            )
    finally:
        store.close()
    # The two-person rule through the admin CLI.
    assert server_cli(["dataset", "checkers", "ledger", "2", "--data-dir", str(centre.root)]) == 0
    shots = Path(os.environ.get("SAFEACCESS_SCREENSHOTS") or tmp_path_factory.mktemp("shots"))
    shots.mkdir(parents=True, exist_ok=True)
    service = Service(centre.root)
    app = create_app(service)
    with service, EmbeddedServer(app) as srv:
        yield Web(
            service=service, url=srv.url, root=centre.root, centre=centre, shots=shots, app=app
        )


@pytest.fixture(scope="module")
def browser(web: Web) -> Iterator[Any]:
    if not Path(CHROMIUM).exists():
        message = f"{CHROMIUM} is missing (apt-get install chromium)"
        if REQUIRE_BROWSER:
            pytest.fail(message)
        pytest.skip(message)
    with playwright_sync.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = _context(browser)
    try:
        yield context.new_page()
    finally:
        context.close()


def _context(browser: Any) -> Any:
    context = browser.new_context(viewport={"width": 1366, "height": 900})
    context.set_default_timeout(10_000)
    return context


def _shot(web: Web, page: Any, name: str) -> None:
    page.screenshot(path=str(web.shots / f"{name}.png"), full_page=True)


def _enrol(
    web: Web,
    page: Any,
    name: str,
    capsys: pytest.CaptureFixture[str],
    researcher: str | None = None,
    shot: str | None = None,
) -> None:
    capsys.readouterr()
    args = ["checker", "add", name, "--data-dir", str(web.root), "--base-url", web.url]
    assert server_cli([*args, *(["--researcher", researcher] if researcher else [])]) == 0
    link = re.search(r"(http://\S+/review/enrol\?token=\S+)", capsys.readouterr().out)
    assert link is not None
    page.goto(link.group(1))
    secret = page.locator("code.secret").inner_text().strip()
    uri = page.locator("code.uri").inner_text()
    assert uri.startswith("otpauth://totp/") and f"secret={secret}" in uri
    assert page.locator(".qr svg").count() == 1
    web.enrolled(name, secret)
    if shot:
        _shot(web, page, shot)
    page.fill("#password", PASSWORD)
    page.fill("#confirm", PASSWORD)
    page.fill("#code", "000000" if pyotp.TOTP(secret).now() != "000000" else "111111")
    page.click("button[type=submit]")
    assert "not right" in page.locator(".error").inner_text()  # a wrong code: still pending
    page.fill("#password", PASSWORD)
    page.fill("#confirm", PASSWORD)
    page.fill("#code", web.code(name))
    page.click("button[type=submit]")
    assert page.url.endswith("/review/login")
    assert f"Account {name} is active" in page.locator(".flash").inner_text()
    # The link is single-use.
    page.goto(link.group(1))
    assert "not valid" in page.locator(".error").inner_text()


def _new_checker(web: Web, name: str) -> str:
    """A checker enrolled without the browser (the browser enrolment has its own test); each
    test logs in its own checker, so no test waits for a fresh TOTP code."""
    store = web.service.store
    enrolment = accounts.add_checker(store, name)
    found = accounts.enrolment_for(store, enrolment.token)
    assert found is not None
    web.enrolled(name, found[1])
    accounts.enrol(store, enrolment.token, PASSWORD, PASSWORD, web.code(name))
    return name


def _login(web: Web, page: Any, name: str, shot: str | None = None) -> None:
    page.goto(f"{web.url}/review/login")
    page.fill("#name", name)
    page.fill("#password", PASSWORD)
    page.fill("#code", web.code(name))
    if shot:
        _shot(web, page, shot)
    page.click("button[type=submit]")
    assert page.url.endswith("/review/"), page.url
    assert name in page.locator(".who").inner_text()


def _open_review_step(web: Web, researcher: str = "ada") -> str:
    sealed = web.centre.seal(
        [
            MagnitudeTable(value="balance", rows=["region"]),
            FrequencyTable(rows=["region"]),
        ],
        researcher=researcher,
        dataset="ledger",
    )
    with connect(web.url, web.centre.keys[researcher], researcher) as session:
        first = session.open(sealed)
    assert first.status == "review", first
    return first.sequence_id


def _step_link(page: Any, seq_id: str) -> Any:
    return page.locator(f"a[href$='/review/steps/{seq_id}/1']")


def test_enrol_login_inspect_and_release_with_two_checkers(
    web: Web, browser: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    seq_id = _open_review_step(web)
    first, second = _context(browser), _context(browser)
    try:
        olivia, peter = first.new_page(), second.new_page()
        _enrol(web, olivia, "olivia", capsys, shot="01-enrol")
        _enrol(web, peter, "peter", capsys)
        _login(web, olivia, "olivia", shot="02-login")
        # Session cookie: Secure, HttpOnly, SameSite=Strict, scoped to /review.
        cookie = next(c for c in first.cookies() if c["name"] == "safeaccess_review")
        assert cookie["secure"] and cookie["httpOnly"] and cookie["sameSite"] == "Strict"
        assert cookie["path"] == "/review"

        # The queue: the step, its dataset, the two-checker badge; the filters work.
        assert _step_link(olivia, seq_id).count() == 1
        row = olivia.locator("tr", has=_step_link(olivia, seq_id))
        assert "ledger" in row.inner_text() and "two checkers needed" in row.inner_text()
        _shot(web, olivia, "03-queue")
        olivia.select_option("#f-kind", "magnitude_table")
        olivia.select_option("#f-researcher", "ada")
        olivia.click("form.filters button[type=submit]")
        assert "kind=magnitude_table" in olivia.url
        assert _step_link(olivia, seq_id).count() == 1
        olivia.goto(f"{web.url}/review/?dataset=census")
        assert _step_link(olivia, seq_id).count() == 0
        olivia.goto(f"{web.url}/review/?older_than_hours=1")
        assert _step_link(olivia, seq_id).count() == 0
        olivia.goto(f"{web.url}/review/")

        # The step: the analysis as text, the flagged cell naming its check, the cell facts.
        response = None
        with olivia.expect_navigation() as nav:
            _step_link(olivia, seq_id).click()
        response = nav.value
        assert response is not None
        headers = response.headers
        assert "frame-ancestors 'none'" in headers["content-security-policy"]
        assert "script-src" not in headers["content-security-policy"]  # none at all
        assert headers["x-frame-options"] == "DENY" and headers["cache-control"] == "no-store"
        flagged = olivia.locator("table.output td.flagged")
        assert flagged.count() == 1
        assert "negative_values" in flagged.inner_text()
        assert "region=West" in (flagged.get_attribute("title") or "")
        assert olivia.locator("table.output td:not(.flagged)").count() == 3
        facts = olivia.locator("table.facts tr.flagged")
        assert "region=West" in facts.inner_text() and "True" in facts.inner_text()
        assert "negative_values" in olivia.locator("table.findings").inner_text()
        assert "balance" in olivia.locator("dl.analysis").inner_text()
        assert "default" in olivia.locator("dl.meta").inner_text()  # the rule set
        _shot(web, olivia, "04-step-flagged-cell")

        # First approval: the step stays in review, badge "waiting for a second checker".
        olivia.click("form.stack:not(.reject) button[type=submit]")
        assert "waits for a second checker" in olivia.locator(".flash").inner_text()
        row = olivia.locator("tr", has=_step_link(olivia, seq_id))
        assert "waiting for a second checker" in row.inner_text()
        assert "approved by olivia" in row.inner_text()
        _shot(web, olivia, "05-queue-second-checker")
        with connect(web.url, web.centre.keys["ada"], "ada") as session:
            assert session.step(seq_id, 1).status == "review"
        # The same checker cannot give the second approval.
        _step_link(olivia, seq_id).click()
        assert "You approved this step" in olivia.locator(".notice").inner_text()

        # A different checker releases it; the researcher's client receives the output.
        _login(web, peter, "peter")
        _step_link(peter, seq_id).click()
        assert "approved so far by olivia" in peter.locator("dl.meta").inner_text()
        peter.click("form.stack:not(.reject) button[type=submit]")
        assert "released" in peter.locator(".flash").inner_text()
        assert _step_link(peter, seq_id).count() == 0
    finally:
        first.close()
        second.close()
    with connect(web.url, web.centre.keys["ada"], "ada") as session:
        result = session.step(seq_id, 1)
        assert result.status == "released" and result.output is not None
        west = result.output["row_labels"].index(["West"])
        frame, _ = _ledger()
        expected = frame.groupby("region", observed=False)["balance"].sum()["West"]
        assert result.output["values"][west][0] == pytest.approx(expected)
        assert "facts" not in result.output

    # The audit record: the views and both approvals, with the checkers' identities.
    events = [(e.kind, e.actor) for e in web.service.store.events(seq_id)]
    assert ("review_viewed", "olivia") in events and ("review_viewed", "peter") in events
    assert ("review_first_approval", "olivia") in events
    assert ("review_approved", "peter") in events


def test_reject_with_a_comment_reaches_the_researcher(
    web: Web, page: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    seq_id = _open_review_step(web, researcher="bob")
    _login(web, page, _new_checker(web, "rhea"))
    _step_link(page, seq_id).click()
    comment = "The West total rests on negative balances; please drop that region."
    page.fill("#reject-comment", comment)
    _shot(web, page, "06-reject-form")
    page.click("form.reject button[type=submit]")
    assert "withheld with your comment" in page.locator(".flash").inner_text()
    with connect(web.url, web.centre.keys["bob"], "bob") as session:
        result = session.step(seq_id, 1)
    # One rejection ends it, even on a two-checker dataset; she gets the comment and the one
    # uniform reason (nothing about which check fired).
    assert result.status == "withheld" and result.review_note == comment
    assert [r.check for r in result.reasons] == ["output_review"]
    assert result.output is None


def test_a_reject_without_comment_or_a_forged_form_changes_nothing(
    web: Web, page: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    seq_id = _open_review_step(web)
    _login(web, page, _new_checker(web, "cyrus"))
    _step_link(page, seq_id).click()
    token = page.locator("form.reject input[name=csrf_token]").get_attribute("value")
    url = f"{web.url}/review/steps/{seq_id}/1/decision"
    # A POST without a token, with a wrong one, and a reject without comment: all refused.
    for form, status in (
        ({"action": "reject", "comment": "forged"}, 403),
        ({"action": "reject", "comment": "forged", "csrf_token": "x" * 43}, 403),
        ({"action": "approve", "csrf_token": token + "x"}, 403),
        ({"action": "reject", "comment": "  ", "csrf_token": token}, 400),
    ):
        answer = page.request.post(url, form=form, max_redirects=0)
        assert answer.status == status, (form, answer.status)
    assert web.service.store.get_step(seq_id, 1).state == "review"  # type: ignore[union-attr]
    assert not any(
        e.kind.startswith("review_") and e.kind != "review_viewed"
        for e in web.service.store.events(seq_id)
    )
    page.goto(url.removesuffix("/decision"))
    assert page.locator("form.reject").count() == 1
    # With the right token the form works: a first approval with rounding to 100.
    page.fill("#round_to", "100")
    page.click("form.stack:not(.reject) button[type=submit]")
    assert "waits for a second checker" in page.locator(".flash").inner_text()
    [approval] = review_rules.first_approvals(web.service.store, seq_id, 1)
    assert approval.checker == "cyrus"
    assert approval.mitigation == {"suppress": False, "round_to": 100}


def test_a_checker_never_reviews_her_own_output(
    web: Web, page: Any, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    seq_id = _open_review_step(web, researcher="ada")
    _enrol(web, page, "ada-checks", capsys, researcher="ada")
    _login(web, page, "ada-checks")
    response = page.goto(f"{web.url}/review/steps/{seq_id}/1")
    assert response is not None and response.status == 403
    assert "nobody reviews her own output" in page.locator(".error").inner_text()
    _shot(web, page, "07-own-output-refused")
    # The CLI refuses the same by her checker name (she signs in: password and a fresh code),
    # and her researcher name is no checker at all.
    args = ["--data-dir", str(web.root), "--note", "ok"]
    monkeypatch.setattr(
        getpass,
        "getpass",
        lambda prompt="": (
            PASSWORD
            if prompt.startswith("password")
            else web.code(prompt.removeprefix("current code from ").split("'s")[0])
            if prompt.removeprefix("current code from ").split("'s")[0] in web.codes
            else "000000"
        ),
    )
    capsys.readouterr()
    for reviewer, refusal in (
        ("ada-checks", "her own output"),
        ("ada", "not an enrolled, active checker"),
    ):
        assert server_cli(["review", "approve", seq_id, "1", "--reviewer", reviewer, *args]) == 2
        assert refusal in capsys.readouterr().err
    assert web.service.store.get_step(seq_id, 1).state == "review"  # type: ignore[union-attr]
    # Through the CLI, two different enrolled checkers release it (the two-person rule).
    _new_checker(web, "carla")
    _new_checker(web, "dan")
    capsys.readouterr()
    assert server_cli(["review", "approve", seq_id, "1", "--reviewer", "carla", *args]) == 0
    assert "second, different checker" in capsys.readouterr().out
    assert server_cli(["review", "approve", seq_id, "1", "--reviewer", "carla", *args]) == 2
    assert server_cli(["review", "approve", seq_id, "1", "--reviewer", "dan", *args]) == 0
    assert web.service.store.get_step(seq_id, 1).state == "released"  # type: ignore[union-attr]


def test_an_idle_session_ends(web: Web, page: Any) -> None:
    _login(web, page, _new_checker(web, "ivy"))
    store = _sessions(web)
    idle = store.idle_seconds
    store.idle_seconds = 1.5
    try:
        time.sleep(2.5)
        page.goto(f"{web.url}/review/")
        assert "/review/login?expired=1" in page.url
        assert "session ended" in page.locator(".notice").inner_text()
    finally:
        store.idle_seconds = idle


def test_login_is_rate_limited(web: Web, page: Any) -> None:
    target = _new_checker(web, "pat")
    page.goto(f"{web.url}/review/login")
    limit = web.service.config.review_web.login_failures_per_account
    for _ in range(limit):
        page.fill("#name", target)
        page.fill("#password", "wrong password!")
        page.fill("#code", "123456")
        page.click("button[type=submit]")
        assert "not right" in page.locator(".error").inner_text()
    # Now even the right password and a fresh code are refused, with the time to wait.
    page.fill("#name", target)
    page.fill("#password", PASSWORD)
    page.fill("#code", web.code(target))
    with page.expect_navigation() as nav:
        page.click("button[type=submit]")
    assert nav.value is not None and nav.value.status == 429
    assert re.search(r"Try again in \d+ s", page.locator(".error").inner_text())
    # The limiter is per account: another checker still logs in from the same address.
    _login(web, page, _new_checker(web, "lena"))


def test_sessions_and_signatures_do_not_cross(web: Web, page: Any) -> None:
    # A researcher's signed request is not a checker session: it gets the login page.
    answer = signed(web.url, web.centre.keys["ada"], "ada", "GET", "/review/")
    assert answer.status_code == 303 and answer.headers["location"].endswith("/review/login")
    # A checker's session is worth nothing on the researcher and auditor API.
    _login(web, page, _new_checker(web, "sam"))
    for path in ("/v1/sequences", "/v1/datasets", "/v1/audit/checkpoint"):
        assert page.request.get(web.url + path).status == 401, path
    page.goto(f"{web.url}/review/openings")
    assert page.locator("h1").inner_text() == "Sequences past a withhold budget"
    # No key material on the pages.
    page.goto(f"{web.url}/review/")
    html = page.content()
    assert "PRIVATE KEY" not in html and "PUBLIC KEY" not in html


def test_the_audit_log_with_checker_records_verifies(
    web: Web, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    auditor = Ed25519PrivateKey.generate()
    if catalogue.get_auditor(web.service.store, "rita") is None:
        web.service.store.add_auditor(
            "rita", public_key_text(auditor.public_key()), fingerprint(auditor.public_key())
        )
    key = tmp_path / "rita.key"
    key.write_bytes(
        auditor.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    key.chmod(0o600)
    pub = tmp_path / "server.pub"
    pub.write_text(public_key_text(web.service.signing_key.public_key()))
    kinds = {e.kind for e in web.service.store.events()}
    assert {"review_viewed", "review_first_approval", "review_settings", "checker_added"} <= kinds
    capsys.readouterr()
    code = client_main(
        [
            "audit",
            "verify",
            "--server",
            web.url,
            "--key",
            str(key),
            "--auditor",
            "rita",
            "--server-key",
            str(pub),
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert "OK: the log verifies" in out


def _sessions(web: Web) -> Any:
    return web.app.state.review_web.sessions


def test_withheld_steps_are_listed_and_a_large_table_fits_the_screen(web: Web, page: Any) -> None:
    # A 2-way table with many small cells (80 ages by sex): the rules withhold it.
    sealed = web.centre.seal([FrequencyTable(rows=["age"], cols=["sex"])])
    with connect(web.url, web.centre.keys["ada"], "ada") as session:
        first = session.open(sealed)
    assert first.status == "withheld"
    _login(web, page, _new_checker(web, "wren"))
    page.locator("p.counts a[href$='/review/withheld']").click()
    assert page.url.endswith("/review/withheld")
    assert "withheld step(s)" in page.locator("p.counts").inner_text()
    page.locator(f"a[href$='/review/steps/{first.sequence_id}/1']").click()
    assert page.locator("h1").inner_text() == "Step 1: frequency_table"
    _shot(web, page, "09-withheld-large-table")
    viewport = page.viewport_size
    width = page.evaluate("document.documentElement.scrollWidth")
    height = page.evaluate("document.documentElement.scrollHeight")
    assert width <= viewport["width"], width
    assert height <= 4 * viewport["height"], height
    # The output table scrolls inside its frame, every cell still there.
    output = page.locator("div.frame[aria-label='The output']")
    assert output.evaluate("e => e.scrollHeight > e.clientHeight")
    assert output.locator("tbody tr").count() >= 80  # a row per age at least
