"""Issue 41, section 2, availability: one researcher's release must not withhold a colleague's
ordinary table, through the real server and client.

In a project scope, ada releases a count of "everyone but the 10 women of an 18-person cell"
(region West x ethnicity E5): with the population admitted, that determines the 10 women, which
is allowed. Before the fix, bob's ordinary region x ethnicity table was then the refused release
(its West x E5 cell minus the 10 women leaves the 8 men), withheld on his own withhold budget.
The scope now reserves the standard one- and two-way tables of the declared categorical columns
before any output, so the refusal lands on ada's release, which creates the conflict, and bob's
tables stay released.
"""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest
from e2e_helpers import Centre, add_dataset

from safeaccess.client.analyses import Analysis, FrequencyTable, Summary
from safeaccess.client.metadata import Column, DatasetMetadata
from safeaccess.client.session import connect
from safeaccess.server.config import DataDir, QssSettings
from safeaccess.server.http.embedded import EmbeddedServer
from safeaccess.server.steps import flow

N = 2000
REGIONS = ["North", "South", "East", "West"]
ETHNICITIES = ["E1", "E2", "E3", "E4", "E5"]
CELL = "region == 'West' and ethnicity == 'E5'"


def test_the_centre_reserves_by_default(centre: Centre) -> None:
    # The module's centre is the e2e centre as `make_centre` initialises it, no option set:
    # every test below runs on the default configuration.
    assert DataDir(centre.root).load_config().reserve_standard_tables is True


def people() -> pd.DataFrame:
    """N people; the West x E5 cell holds exactly 18 of them, 10 women and 8 men."""
    rng = np.random.default_rng(41)
    region = rng.choice(REGIONS, N)
    ethnicity = rng.choice(ETHNICITIES[:4], N)  # nobody is E5 but the planted cell
    sex = rng.choice(["F", "M"], N)
    region[:18], ethnicity[:18] = "West", "E5"
    sex[:10], sex[10:18] = "F", "M"
    ethnicity[18:60] = "E5"  # E5 elsewhere: 42 more people, none in the West
    region[18:60] = rng.choice(REGIONS[:3], 42)
    return pd.DataFrame(
        {
            "person_id": np.arange(1, N + 1, dtype=np.int64),
            "region": region,
            "ethnicity": ethnicity,
            "sex": sex,
            "age": rng.integers(18, 90, N),
            "income": np.round(rng.uniform(20_000, 60_000, N), 2),
        }
    )


def metadata(name: str) -> DatasetMetadata:
    return DatasetMetadata(
        name=name,
        record_key="person_id",
        columns=[
            Column(name="person_id", type="identifier"),
            Column(name="region", type="categorical", levels=REGIONS),
            Column(name="ethnicity", type="categorical", levels=ETHNICITIES),
            Column(name="sex", type="categorical", levels=["F", "M"]),
            Column(name="age", type="integer", bounds=(18, 100)),
            Column(name="income", type="continuous", bounds=(0, 100_000)),
        ],
    )


_names = itertools.count(1)


def _register(centre: Centre, scope: str) -> str:
    name = f"reserved{next(_names)}"
    add_dataset(
        centre.root,
        name=name,
        frame=people(),
        metadata=metadata(name),
        project="p1",
        qss=QssSettings(scope=scope),  # type: ignore[arg-type]
    )
    return name


@pytest.fixture
def dataset(centre_server: tuple[Centre, EmbeddedServer]) -> str:
    return _register(centre_server[0], "project")


def released(
    centre: Centre, url: str, name: str, analyses: list[Analysis], researcher: str
) -> list[bool]:
    with connect(url, centre.keys[researcher], researcher) as session:
        steps = session.run(centre.seal(analyses, researcher=researcher, dataset=name))
    return [s.released for s in steps] + [False] * (len(analyses) - len(steps))


@pytest.mark.parametrize("reserve", [False, True], ids=["unreserved", "reserved"])
def test_the_refusal_lands_on_the_release_that_creates_the_conflict(
    centre_server: tuple[Centre, EmbeddedServer],
    dataset: str,
    reserve: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # `unreserved`: the centre before the fix (no table reserved): the harm is real
    if not reserve:
        monkeypatch.setattr(flow, "read_reserved", lambda parquet, metadata: [])
    centre, srv = centre_server
    everyone_but = Summary(
        variables=["income"], statistics=["count"], where=f"not ({CELL} and sex == 'F')"
    )
    assert released(centre, srv.url, dataset, [everyone_but], "ada") == [not reserve]
    ordinary: list[Analysis] = [
        FrequencyTable(rows=["region"], cols=["ethnicity"]),
        FrequencyTable(rows=["region"]),
        FrequencyTable(rows=["sex"], cols=["ethnicity"]),
        Summary(variables=["income"], by=["region"]),
    ]
    outcome = released(centre, srv.url, dataset, ordinary, "bob")
    if reserve:
        assert outcome == [True] * len(ordinary)
    else:
        assert outcome[0] is False  # bob's region x ethnicity table, on his own budget


@pytest.mark.parametrize("scope", ["project", "researcher"])
def test_a_researchers_own_scope_reserves_nothing(
    centre_server: tuple[Centre, EmbeddedServer], scope: str
) -> None:
    # Women of 19 and over by region: the reserved region x sex table less it leaves each
    # region's few 18-year-old women (fewer than k). In a shared scope the reservation refuses
    # it, the price of protecting colleagues' standard tables; in a researcher's own scope no
    # colleague's release can refuse her tables, so nothing is reserved and it is released.
    centre, srv = centre_server
    data = people()
    adult_women = (data.sex == "F") & (data.age >= 19)
    eighteen = data[(data.sex == "F") & (data.age == 18)].groupby("region").size()
    assert 0 < eighteen.max() < 10  # the planted difference: each region's 18-year-old women
    name = _register(centre, scope)
    table = FrequencyTable(rows=["region"], where="sex == 'F' and age >= 19")
    with connect(srv.url, centre.keys["ada"], "ada") as session:
        # the catalogue says which standard tables count as released (from the metadata alone)
        listed = session.catalogue_entry(name)["reserved_tables"]
        (step,) = session.run(centre.seal([table], researcher="ada", dataset=name))
    standard = ["region", "ethnicity", "sex", "region*ethnicity", "region*sex", "ethnicity*sex"]
    assert listed == (standard if scope == "project" else [])
    assert step.released == (scope == "researcher")
    if step.released:
        assert step.output is not None
        counts = data[adult_women].groupby("region").size().reindex(REGIONS).tolist()
        assert step.output["values"] == [[c] for c in counts]
