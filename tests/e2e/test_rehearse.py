"""`plan.rehearse()` through the real server and client: a dry run on a mock built from the
metadata with the same compute code and output rules, reporting per step what the analysis alone
dooms and what the rules said on the mock, and touching nothing at the centre."""

from __future__ import annotations

import pytest
from e2e_helpers import Centre, HtmlCards

from safeaccess.client.session import connect
from safeaccess.server.http.embedded import EmbeddedServer
from safeaccess.server.service import Service


def test_rehearse_reports_mock_verdicts_and_refusals_and_changes_nothing(
    centre: Centre, server: tuple[Service, EmbeddedServer], capsys: pytest.CaptureFixture[str]
) -> None:
    service, srv = server
    sequences = len(service.store.list_sequences("ada"))
    with connect(srv.url, centre.keys["ada"], "ada") as session:
        plan = (
            session.plan("census")
            .frequency_table("region", "sex")
            .frequency_table("region", "sex", where="age >= 93")  # few mock rows per cell
            .dp_count(epsilon=1.0, delta=1e-5)  # census answers no DP kinds
            .script("result = df.shape[0]")
            .ols("income ~ age + C(sex)")
        )
        report = plan.rehearse()
        printed = capsys.readouterr().out
        assert report == session.rehearse(plan)  # the mock is fixed by the metadata
    assert service.store.list_sequences("ada").__len__() == sequences

    assert report.dataset == "census@1" and report.rows == report.mock_rows == len(centre.census)
    assert "predicts nothing about the real verdicts" in report.disclaimer
    one, few, dp, script, ols = report.steps
    assert one.mock_verdict == "release" and not one.checks and not one.doomed
    assert few.mock_verdict == "withhold"
    assert {c.check for c in few.checks} >= {"threshold"}
    assert dp.doomed and "does not answer differentially private kinds" in dp.refused[0]
    assert report.doomed == (dp,)
    assert script.mock_verdict == "not_rehearsed" and "output checker" in (script.note or "")
    assert ols.mock_verdict in ("release", "withhold", "review")

    assert printed.startswith("rehearsal of 5 analyses on a mock of census@1")
    assert "NOTE: A rehearsal on a mock predicts nothing" in printed
    assert "step 2 (frequency_table): on the mock: WITHHOLD" in printed
    assert "likely withhold: threshold" in printed
    assert "step 3 (dp_count): REFUSED by the analysis alone" in printed

    card = HtmlCards(report._repr_html_())
    assert card.cards == ["rehearsal"]
    assert card.badges == ["release", "withhold", "refused", "not rehearsed", ols.mock_verdict]
    assert "predicts nothing about the real verdicts" in card.words
