"""The rehearsal tells the truth (issue 42): the three cases where it contradicted the real run,
replayed through the real server and client, rehearsed and then sealed and run.

(a) a survival curve whose 0/1 event column is declared categorical: released, and rehearsed as
    released (it was rehearsed as `not_numeric`);
(b) `ols("log(income) ~ ...")` on incomes with 12 exact zeros: withheld (the log fails on the
    records), and rehearsed as withheld because registration published that the column has
    zeros and the mock has them (it was rehearsed as released: the mock had none);
(c) a synthetic_data step: not rehearsed, said in plain words, no internal type name anywhere;
and a table with a small group (a region of 15 records): withheld, and rehearsed as withheld
because the mock draws the region's levels in their published coarse shares (uniform levels
gave every region a third of the rows and a predicted release).
The notebook card never puts a WITHHOLD badge beside "passed every check"; the offline
rehearsal gives the same steps as the centre's (one implementation, in the sandbox package).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import numpy as np
import pandas as pd
import pytest
from e2e_helpers import Centre, HtmlCards, add_dataset, serving

from safeaccess.client.metadata import DatasetMetadata
from safeaccess.client.rehearsal import Rehearsal
from safeaccess.client.session import connect
from safeaccess.sandbox.mock.offline import rehearse_offline
from safeaccess.server.admin.cli import main as admin
from safeaccess.server.http.embedded import EmbeddedServer

DATASET = "clinic"
ROWS = 1000
ZERO_INCOMES = 12
MISSING_INCOMES = 50  # 5 %: published as 5
ISLANDERS = 15  # 1.5 %: published as "some", under the threshold in each sex
LOG_OLS = "log(income) ~ age + C(sex)"
# An internal class name (SynthTablesOutput, RegressionOutput, ...) in a researcher's message.
TYPE_NAME = re.compile(r"\b[A-Z][a-z]+(?:[A-Z][a-z]+)*Output\b")


def _clinic() -> pd.DataFrame:
    rng = np.random.default_rng(42)
    income = np.clip(rng.lognormal(10.4, 0.5, ROWS), 1_000, 200_000)
    income[:ZERO_INCOMES] = 0.0
    income[ZERO_INCOMES : ZERO_INCOMES + MISSING_INCOMES] = np.nan
    return pd.DataFrame(
        {
            "id": np.arange(1, ROWS + 1, dtype=np.int64),
            "sex": rng.choice(["F", "M"], ROWS),
            "region": ["Islands"] * ISLANDERS
            + ["North", "South"] * ((ROWS - ISLANDERS) // 2)
            + ["North"] * ((ROWS - ISLANDERS) % 2),
            "age": rng.integers(18, 91, ROWS),
            "income": income,
            "days": rng.uniform(1, 2000, ROWS).round(1),
            "died": rng.integers(0, 2, ROWS),  # declared categorical with levels 0 and 1
        }
    )


METADATA = DatasetMetadata.model_validate(
    {
        "name": DATASET,
        "record_key": "id",
        "columns": [
            {"name": "id", "type": "identifier"},
            {"name": "sex", "type": "categorical", "levels": ["F", "M"]},
            {"name": "region", "type": "categorical", "levels": ["North", "South", "Islands"]},
            {"name": "age", "type": "integer", "bounds": [18, 90]},
            {"name": "income", "type": "continuous", "bounds": [0, 200_000]},
            {"name": "days", "type": "continuous", "bounds": [0, 2000], "unit": "days"},
            {"name": "died", "type": "categorical", "levels": [0, 1], "nullable": False},
        ],
    }
)


@pytest.fixture(scope="module")
def clinic(centre: Centre) -> Iterator[EmbeddedServer]:
    add_dataset(centre.root, name=DATASET, frame=_clinic(), metadata=METADATA, project="p1")
    d = ["--data-dir", str(centre.root)]
    assert admin(["dataset", "dp", DATASET, "--epsilon", "50", "--delta", "1e-5", *d]) == 0
    with serving(centre.root) as (_, srv):
        yield srv


def _messages(report: Rehearsal) -> list[str]:
    said = [report.disclaimer, *report.notes]
    for step in report.steps:
        said += [*step.refused, step.note or "", *(str(c) for c in step.checks)]
    return said


def _card_rows(report: Rehearsal) -> list[HtmlCards]:
    html = report._repr_html_()
    # Skip the card's header row; each step row on its own, its cells balanced.
    cells = [row.split("</tr>")[0] for row in html.split("<tr>")[2:]]
    return [HtmlCards(f"<table><tr>{row}</tr></table>") for row in cells]


def test_the_rehearsal_predicts_the_real_status_of_the_three_cases(
    centre: Centre, clinic: EmbeddedServer, capsys: pytest.CaptureFixture[str]
) -> None:
    with connect(clinic.url, centre.keys["ada"], "ada") as session:
        entry = session.catalogue_entry(DATASET)
        income = next(c for c in entry["columns"] if c["name"] == "income")
        # Published at registration, coarsened: 12 of 1000 zeros is "some", 50 missing is 5 %.
        assert income["profile"] == {"missing": 5, "zeros": "some", "levels": None}
        region = next(c for c in entry["columns"] if c["name"] == "region")
        # 493, 492 and 15 of 1000 records: 50 %, 50 % (rounded to 5 %) and under 5 %.
        assert region["profile"] == {"missing": "none", "zeros": None, "levels": [50, 50, "some"]}

        plan = (
            session.plan(DATASET)
            .survival("days", "died", interval=200, max_time=1800)
            .ols(LOG_OLS)
            .synthetic_data(["sex", "died"], epsilon=1.0, delta=1e-6)
            .frequency_table("region", "sex")
        )
        rehearsed = plan.rehearse()
        printed = capsys.readouterr().out
        offline = session.rehearse_offline(plan)
        assert offline.steps == rehearsed.steps  # the same step code on the same mock
        survival, ols, synth, table = rehearsed.steps

        real = session.run(
            session.seal(
                session.plan(DATASET)
                .survival("days", "died", interval=200, max_time=1800)
                .ols(LOG_OLS)
            )
        )
        # A sealed sequence ends at its first withhold: the table runs in one of its own.
        real += session.run(session.seal(session.plan(DATASET).frequency_table("region", "sex")))
    assert [r.status for r in real] == ["released", "withheld", "withheld"]
    # (a) and (b): the rehearsal's verdict is the real status.
    assert survival.mock_verdict == "release" and not survival.refused
    assert ols.mock_verdict == "withhold" and not ols.refused
    # (c): not rehearsed, in plain words.
    assert synth.mock_verdict == "not_rehearsed" and not synth.refused
    assert synth.note is not None and "disclosure check" in synth.note
    # The small group: withheld on the mock, for the threshold, as on the real records.
    assert table.mock_verdict == "withhold" and "threshold" in {c.check for c in table.checks}

    said = [*_messages(rehearsed), *_messages(offline), printed, rehearsed._repr_html_()]
    assert not [s for s in said if TYPE_NAME.search(s) or "SynthTablesOutput" in s]
    assert any(
        "income: the mock has the published 5 % missing values" in n for n in rehearsed.notes
    )

    # The card: one row per step, and never a withhold badge beside "passed every check".
    rows = _card_rows(rehearsed)
    assert [r.badges for r in rows] == [["release"], ["withhold"], ["not rehearsed"], ["withhold"]]
    for row in rows:
        assert not ("withhold" in row.badges and "passed every check" in row.words)
    assert "passed every check on the mock" in rows[0].words


def test_metadata_without_profiles_rehearses_as_before(
    centre: Centre, clinic: EmbeddedServer
) -> None:
    """A version registered before profiles (no `profile` field) still reads, and its mock has
    neither zeros nor missing values and uniform levels: the log model and the table with a
    small group then rehearse as released, the mismatches the published profile closes."""
    with connect(clinic.url, centre.keys["ada"], "ada") as session:
        entry: dict[str, Any] = dict(session.catalogue_entry(DATASET))
        plan = session.plan(DATASET).ols(LOG_OLS).frequency_table("region", "sex")
    entry["columns"] = [{k: v for k, v in c.items() if k != "profile"} for c in entry["columns"]]
    old = rehearse_offline(list(plan), entry)
    assert [s["mock_verdict"] for s in old["steps"]] == ["release", "release"]
    assert not any("published" in n for n in old["notes"])
