"""A summary's `n` against a suppressed missing count (issue 41) through the real server and client.

A summary releases, per variable and group, `n`: the records whose value is present. The group's
size is released too (a frequency table, or the catalogue's row count for the whole population),
so size - n is the group's missing count, which the missing-count rule suppresses when it is
from 1 to threshold - 1. Here 3 people of the North have no income.

Each attack runs twice, like `test_qss_combination_attacks.py`: with the fix taken out and
admission replaced by "admit everything" (the attacker's subtraction must find the 3) and as
deployed (the summary is
released, its North `n` and count suppressed with the missing count they determine, so the
subtraction has nothing to work on); and a later output that gives the North's present records
exactly (a summary that leaves no missing value in the North) is refused.
"""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest
from e2e_helpers import Centre, add_people, unguard

from safeaccess.client.analyses import (
    Analysis,
    Correlation,
    FrequencyTable,
    MagnitudeTable,
    Regression,
    StatTest,
    Summary,
)
from safeaccess.client.metadata import Column
from safeaccess.client.results import StepResult
from safeaccess.client.session import connect
from safeaccess.server.config import QssSettings
from safeaccess.server.http.embedded import EmbeddedServer

N = 1200
MISSING_NORTH = 3


def population(seed: int = 43) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    region = np.where(np.arange(N) % 2 == 0, "North", "South")
    income = np.round(rng.uniform(20_000, 60_000, N), 2)
    income[[0, 2, 4]] = np.nan  # three people of the North (even rows) have no income
    return pd.DataFrame(
        {
            "person_id": np.arange(1, N + 1, dtype=np.int64),
            "region": region,
            "age": rng.integers(18, 90, N),
            "income": income,
        }
    )


DATA = population()
_names = itertools.count(1)


def register(centre: Centre) -> str:
    name = add_people(
        centre.root,
        f"missing{next(_names)}",
        DATA,
        [
            Column(name="person_id", type="identifier"),
            Column(name="region", type="categorical", levels=["North", "South"]),
            Column(name="age", type="integer", bounds=(18, 100)),
            Column(name="income", type="continuous", bounds=(0, 100_000)),
        ],
        QssSettings(scope="project"),
    )
    return name


def run(centre: Centre, url: str, name: str, analyses: list[Analysis]) -> list[StepResult]:
    with connect(url, centre.keys["ada"], "ada") as session:
        return list(session.run(centre.seal(analyses, dataset=name)))


def present_n(step: StepResult, region: str | None) -> int | None:
    """The released `n` of income in the group (None: not released)."""
    if not step.released:
        return None
    frame = step.frame()
    rows = frame if region is None else frame[frame["region"] == region]
    value = rows["n"].iloc[0]
    return None if pd.isna(value) else int(value)


@pytest.fixture(params=["unguarded", "guarded"])
def guard(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each attack twice: unguarded, the centre before issue 41's fix (n shown beside its
    suppressed missing count, the summary's query set the whole group) and with admission
    disabled; guarded, as deployed."""
    if request.param == "unguarded":
        from safeaccess.rules import missing

        unguard(monkeypatch)
        monkeypatch.setattr(missing, "_hide_present_counts", lambda output, hidden: output)
    return str(request.param)


@pytest.fixture(scope="module")
def dataset(centre_server: tuple[Centre, EmbeddedServer]) -> str:
    return register(centre_server[0])


def test_group_size_minus_n_gives_the_suppressed_missing_count(
    centre_server: tuple[Centre, EmbeddedServer], dataset: str, guard: str
) -> None:
    centre, srv = centre_server
    assert int(DATA.loc[DATA.region == "North", "income"].isna().sum()) == MISSING_NORTH
    table, summary = run(
        centre,
        srv.url,
        dataset,
        [
            FrequencyTable(rows=["region"]),
            Summary(variables=["income"], by=["region"], statistics=["count", "mean"]),
        ],
    )
    assert table.released and summary.released
    sizes = {
        str(lab[0]): int(v[0])
        for lab, v in zip(table.output["row_labels"], table.output["values"], strict=True)
    }
    # the missing count itself is suppressed, in `missing()` and in the frame
    shown = summary.missing()
    north = shown[shown["group"].map(lambda g: list(g) == ["North"])]
    assert bool(north["suppressed"].iloc[0]) and pd.isna(north["count"].iloc[0])
    assert pd.isna(summary.frame().set_index("region").loc["North", "missing"])
    n = present_n(summary, "North")
    found = None if n is None else sizes["North"] - n
    if guard == "unguarded":
        assert found == MISSING_NORTH
    else:
        assert found is None
        frame = summary.frame().set_index("region")
        assert pd.isna(frame.loc["North", "count"]) and bool(frame.loc["North", "n_suppressed"])
        assert frame.loc["North", "mean"] == pytest.approx(
            DATA.loc[DATA.region == "North", "income"].mean()
        )
        # the South has no missing income: its n is released and is its size
        assert int(frame.loc["South", "n"]) == sizes["South"]


def test_the_catalogue_row_count_minus_n(
    centre_server: tuple[Centre, EmbeddedServer], dataset: str, guard: str
) -> None:
    centre, srv = centre_server
    (summary,) = run(centre, srv.url, dataset, [Summary(variables=["income"])])
    assert summary.released
    n = present_n(summary, None)
    found = None if n is None else N - n  # N: the catalogue's published row count
    assert found == (MISSING_NORTH if guard == "unguarded" else None)


def test_the_present_records_asked_exactly_are_refused(
    centre_server: tuple[Centre, EmbeddedServer], dataset: str
) -> None:
    # `income > -1` leaves out the missing incomes (three-valued logic): the North's present
    # records, whose count is the North's size minus the suppressed 3
    centre, srv = centre_server
    table, summary = run(
        centre,
        srv.url,
        dataset,
        [
            FrequencyTable(rows=["region"]),
            Summary(variables=["income"], by=["region"], where="income > -1"),
        ],
    )
    assert table.released and not summary.released


def test_a_sum_beside_the_mean_gives_n(
    centre_server: tuple[Centre, EmbeddedServer], dataset: str, guard: str
) -> None:
    # with n suppressed, the North's mean income and its total (a magnitude table) give
    # n = total / mean: the auditor sees the total over the present records and the mean over
    # the whole North, and refuses the total
    centre, srv = centre_server
    table, summary, total = run(
        centre,
        srv.url,
        dataset,
        [
            FrequencyTable(rows=["region"]),
            Summary(variables=["income"], by=["region"], statistics=["mean"]),
            MagnitudeTable(value="income", agg="sum", rows=["region"]),
        ],
    )
    assert table.released and summary.released
    size = int(table.output["values"][0][0])
    found = None
    if total.released:
        mean = float(summary.frame().set_index("region").loc["North", "mean"])
        found = size - round(float(total.output["values"][0][0]) / mean)
    assert found == (MISSING_NORTH if guard == "unguarded" else None)


@pytest.mark.parametrize("kind", ["regression", "correlation", "t_test"])
def test_other_kinds_count_their_present_records(
    centre_server: tuple[Centre, EmbeddedServer], dataset: str, guard: str, kind: str
) -> None:
    # a fit's nobs, a correlation's n and a t test's group counts are over the records with
    # every value present: their query set, so against the catalogue's row count (the admitted
    # population) or the North's size they are refused, not released with the 3 in them
    centre, srv = centre_server
    analysis: Analysis = {
        "regression": Regression(formula="income ~ age"),
        "correlation": Correlation(variables=["income", "age"]),
        "t_test": StatTest(test="t_two_sample", variable="income", group="region"),
    }[kind]
    (step,) = run(centre, srv.url, dataset, [analysis])
    found = N - int(step.output["n"]) if step.released else None
    assert found == (MISSING_NORTH if guard == "unguarded" else None)


def test_a_table_of_means_stays_released_and_a_sum_beside_it_is_refused(
    centre_server: tuple[Centre, EmbeddedServer], dataset: str
) -> None:
    # a magnitude table of means releases no count: the North's cell, whose missing count is
    # suppressed, is admitted over the whole North (before: over its present records, which
    # the region table's North less 3 refused); the totals would give n = total / mean
    centre, srv = centre_server
    table, means, totals = run(
        centre,
        srv.url,
        dataset,
        [
            FrequencyTable(rows=["region"]),
            MagnitudeTable(value="income", agg="mean", rows=["region"]),
            MagnitudeTable(value="income", agg="sum", rows=["region"]),
        ],
    )
    assert table.released and means.released and not totals.released
    north = DATA.loc[DATA.region == "North", "income"]
    assert means.output["values"][0][0] == pytest.approx(north.mean())
