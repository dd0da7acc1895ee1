"""Grouping by the year, month or day of a date column, through the real server and client.

A date column with declared date_bounds groups tables, summaries, histograms and DP answers by
`year(admitted)`, `month(admitted)` or `day(admitted)`; the released numbers are pandas' on the
same records (`dt.year`, `dt.month`, `groupby`). The same plan runs on a storage "duckdb"
dataset (registered from a Parquet file holding real dates), where DuckDB computes the tables
in SQL and the summary reads the columns it needs: the same numbers. The query-set auditor sees
the year cells (a probe differencing one of them is refused), the rehearsal's mock groups alike,
and a part used where it cannot be is refused at plan time and at the centre in one line."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from e2e_helpers import Centre

from safeaccess.client.analyses import FrequencyTable, Summary
from safeaccess.client.metadata import Column, DatasetMetadata
from safeaccess.client.plan import Plan
from safeaccess.client.session import connect
from safeaccess.client.validation import AnalysisInvalid
from safeaccess.server.admin.cli import main as server_cli
from safeaccess.server.config import DataDir, QssSettings
from safeaccess.server.datasets import register_dataset
from safeaccess.server.demo.data import census_metadata
from safeaccess.server.http.embedded import EmbeddedServer
from safeaccess.server.service import Service
from safeaccess.server.store import Store

SPAN = ("2019-01-01", "2020-12-31")
ROWS = 1500


def _admissions(census: pd.DataFrame) -> pd.DataFrame:
    """The census' first records with a day of admission in SPAN (some missing)."""
    rng = np.random.default_rng(44)
    days = pd.Timestamp(SPAN[0]) + pd.to_timedelta(rng.integers(0, 731, ROWS), unit="D")
    frame = census.head(ROWS).reset_index(drop=True).assign(admitted=days)
    frame.loc[rng.random(ROWS) < 0.03, "admitted"] = pd.NaT
    return frame


def _metadata(name: str, storage: str = "memory") -> DatasetMetadata:
    base = census_metadata(name)
    admitted = Column(name="admitted", type="date", date_bounds=SPAN)  # type: ignore[arg-type]
    return base.model_copy(update={"columns": [*base.columns, admitted], "storage": storage})


@pytest.fixture(scope="module")
def admissions(centre: Centre, tmp_path_factory: pytest.TempPathFactory) -> pd.DataFrame:
    """`admissions` in memory (registered from a frame, dates as text as a CSV holds them) and
    `admissions_db` with storage "duckdb" (from a Parquet file of real dates)."""
    frame = _admissions(centre.census)
    data = DataDir(centre.root)
    store = Store(data.database_url(data.load_config()))
    parquet = tmp_path_factory.mktemp("duck") / "admissions.parquet"
    as_dates = frame.assign(admitted=frame["admitted"].dt.date)
    pq.write_table(pa.Table.from_pandas(as_dates, preserve_index=False), parquet)
    try:
        as_text = frame.assign(admitted=frame["admitted"].dt.strftime("%Y-%m-%d"))
        register_dataset(
            data,
            store,
            name="admissions",
            frame=as_text,
            metadata=_metadata("admissions"),
            project="p1",
            qss=QssSettings(scope="researcher"),  # bob's probe is audited apart from ada's
        )
        register_dataset(
            data,
            store,
            name="admissions_db",
            source=parquet,
            metadata=_metadata("admissions_db", "duckdb"),
            project="p1",
        )
    finally:
        store.close()
    return frame


def _plan(plan: Plan) -> Plan:
    return (
        plan.frequency_table("year(admitted)", "month(admitted)")
        .frequency_table("sex", "year(admitted)", where="admitted >= '2019-07-01'")
        .histogram("age", edges=[16, 40, 65, 95], by=["year(admitted)"])
        .summary(["income"], statistics=["count", "mean"], by=["year(admitted)", "sex"])
        .frequency_table("region", where="year(admitted) == 2020 and month(admitted) <= 6")
    )


def _check_against_pandas(results: list, frame: pd.DataFrame) -> None:  # type: ignore[type-arg]
    assert [r.status for r in results] == ["released"] * 5, [r.reasons for r in results]
    year, month = frame["admitted"].dt.year, frame["admitted"].dt.month

    by_month = results[0].frame()
    expected = pd.crosstab(year, month)  # pandas drops the records with no date, as we do
    assert by_month.index.names == ["year(admitted)"]
    assert list(by_month.index) == [2019, 2020] and list(by_month.columns) == list(range(1, 13))
    assert by_month.to_numpy().tolist() == expected.to_numpy().tolist()

    later = frame[frame["admitted"] >= "2019-07-01"]
    by_sex = results[1].frame()
    expected = pd.crosstab(later["sex"], later["admitted"].dt.year)
    assert by_sex.to_numpy().tolist() == expected.to_numpy().tolist()

    hist = results[2].frame()
    for y in (2019, 2020):
        counts, _ = np.histogram(frame.loc[year == y, "age"], bins=[16, 40, 65, 95])
        assert hist.loc[y].tolist() == counts.tolist()

    summary = results[3].frame()
    reference = (
        frame.dropna(subset=["admitted"]).assign(y=year).groupby(["y", "sex"], observed=True)
    )
    for _, row in summary.iterrows():
        group = reference.get_group((row["year(admitted)"], row["sex"]))["income"]
        assert row["count"] == group.count()
        assert row["mean"] == pytest.approx(group.mean(), rel=1e-9)

    first_half = frame[(year == 2020) & (month <= 6)]
    by_region = results[4].frame()["count"]
    assert by_region.to_dict() == first_half["region"].value_counts().to_dict()


def test_tables_summaries_and_histograms_group_by_year_and_month_as_pandas_does(
    centre: Centre, server: tuple[Service, EmbeddedServer], admissions: pd.DataFrame
) -> None:
    _, srv = server
    with connect(srv.url, centre.keys["ada"], "ada") as session:
        plan = _plan(session.plan("admissions"))
        rehearsed = plan.rehearse(show=False)  # the mock groups its days alike
        assert [s.mock_verdict for s in rehearsed.steps] == ["release"] * 5, rehearsed.steps
        results = session.run(session.seal(plan))
    offline = plan.rehearse(show=False)  # the session is closed: the cached mock, offline
    assert offline.offline and offline.steps == rehearsed.steps
    _check_against_pandas(results, admissions)


def test_a_duckdb_dataset_stores_real_dates_filters_and_groups_them_alike(
    centre: Centre, server: tuple[Service, EmbeddedServer], admissions: pd.DataFrame
) -> None:
    _, srv = server
    with connect(srv.url, centre.keys["ada"], "ada") as session:
        assert session.catalogue_entry("admissions_db")["storage"] == "duckdb"
        plan = _plan(session.plan("admissions_db"))
        results = session.run(session.seal(plan))
    _check_against_pandas(results, admissions)
    stored = pq.read_schema(Path(centre.root) / "datasets" / "admissions_db" / "v1.parquet")
    assert pa.types.is_timestamp(stored.field("admitted").type)  # text or date32: stored as dates


def test_date_parts_are_refused_in_one_line_where_they_cannot_be(
    centre: Centre, server: tuple[Service, EmbeddedServer], admissions: pd.DataFrame
) -> None:
    _, srv = server
    with connect(srv.url, centre.keys["ada"], "ada") as session:
        plan = session.plan("admissions")
        for add, message in (
            (lambda: plan.summary(["year(admitted)"]), "year(admitted) groups records: use it"),
            (lambda: plan.frequency_table("week(admitted)"), "there is no week()"),
            (lambda: plan.frequency_table("year(age)"), "year() takes a date column, but 'age'"),
            (lambda: plan.frequency_table("year( admitted)"), "written without spaces"),
            (lambda: plan.frequency_table("month(admited)"), "did you mean 'admitted'"),
        ):
            with pytest.raises(AnalysisInvalid, match=re.escape(message)) as err:
                add()
            assert str(err.value).count("\n") == 1  # the heading and one problem
        # Sealed without the metadata check, the centre refuses it alike and changes nothing.
        unchecked = Plan("admissions@1").add(
            Summary(variables=["year(admitted)"], statistics=["mean"])
        )
        sealed = unchecked.seal(
            centre.keys["ada"], researcher="ada", project="p1", server=centre.server_id
        )
        refused = session.run(sealed)[0]
    assert refused.status == "failed" and refused.error_code == "invalid_analysis"
    assert "year(admitted) groups records" in (refused.error_message or "")


def test_the_auditor_sees_the_year_cells_and_refuses_a_probe_that_differences_one(
    centre: Centre, server: tuple[Service, EmbeddedServer], admissions: pd.DataFrame, guard: str
) -> None:
    """Released: admissions by year. Probe: the records of 2019 plus one person, whose count
    minus the 2019 cell says whether she was admitted in 2020. Without the auditor it does;
    as deployed, the probe (a large set alone: bob, who released no year cells, gets it) is
    one record from the year cells, and is refused."""
    _, srv = server
    frame = admissions.dropna(subset=["admitted"])
    keys = ["region", "sex", "age", "ethnicity"]
    sizes = admissions.groupby(keys, observed=True).size()
    unique = sizes[sizes == 1].index
    indexed = frame.set_index(keys).sort_index()
    target = indexed.loc[[k for k in unique if k in indexed.index]]
    region, sex, age, ethnicity = target[target["admitted"] >= "2020-01-01"].index[0]
    person = f"region = '{region}' and sex = '{sex}' and age = {age} and ethnicity = '{ethnicity}'"
    probe = FrequencyTable(rows=["sex"], where=f"admitted < '2020-01-01' or ({person})")
    with connect(srv.url, centre.keys["ada"], "ada") as session:
        years = FrequencyTable(rows=["year(admitted)"])
        results = session.run(centre.seal([years, probe], dataset="admissions"))
    assert results[0].status == "released" and results[0].output is not None
    assert [lab for (lab,) in results[0].output["row_labels"]] == [2019, 2020]
    if guard == "unguarded":  # the attack works: one more than 2019's admissions
        assert results[1].status == "released" and results[1].output is not None
        probed = sum(v for (v,) in results[1].output["values"])
        assert probed - results[0].output["values"][0][0] == 1
        return
    assert results[1].status == "withheld", results[1].reasons
    # (the researcher is told the one answer of every cause, which is no oracle)
    assert [r.check for r in results[1].reasons] == ["disclosure_control"]
    with connect(srv.url, centre.keys["bob"], "bob") as session:
        alone = session.run(centre.seal([probe], researcher="bob", dataset="admissions"))
    assert alone[0].status == "released"  # the same probe, without the year cells


def test_dp_answers_group_by_the_declared_years_of_a_date(
    centre: Centre, server: tuple[Service, EmbeddedServer], admissions: pd.DataFrame
) -> None:
    """The groups of a DP count by `year(admitted)` are the years of the declared bounds,
    fixed before any record is read; each noisy count is near pandas' count of its year."""
    _, srv = server
    dp = ["dataset", "dp", "admissions_db", "--epsilon", "5", "--delta", "1e-5"]
    assert server_cli([*dp, "--data-dir", str(centre.root)]) == 0
    with connect(srv.url, centre.keys["ada"], "ada") as session:
        plan = session.plan("admissions_db").dp_count(
            by=["year(admitted)"], epsilon=1.0, delta=1e-5
        )
        answer = session.run(session.seal(plan))[0]
    assert answer.status == "released" and answer.dp is not None
    assert answer.dp.groups == [[2019], [2020]]
    truth = admissions["admitted"].dt.year.value_counts()
    for (year,), (value,) in zip(answer.dp.groups, answer.dp.values, strict=True):
        assert abs(value - truth[year]) < 6 * answer.dp.sigma
