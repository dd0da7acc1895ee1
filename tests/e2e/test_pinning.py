"""Dataset versions from the researcher's side: pinned plans, the catalogue's metadata, sealing
with what the session knows, and results that say which version ran."""

from __future__ import annotations

import pytest
from e2e_helpers import Centre

from safeaccess.client.plan import Plan
from safeaccess.client.session import UnknownDataset, connect
from safeaccess.server.config import DataDir
from safeaccess.server.datasets import register_dataset
from safeaccess.server.demo.data import census_metadata
from safeaccess.server.http.embedded import EmbeddedServer
from safeaccess.server.service import Service

V2_ROWS = 2000


@pytest.fixture(scope="module")
def two_versions(centre: Centre, server: tuple[Service, EmbeddedServer]) -> None:
    """census@2: the first 2000 records of census@1 (the fixture's version)."""
    service, _ = server
    register_dataset(
        DataDir(centre.root),
        service.store,
        name="census",
        frame=centre.census.head(V2_ROWS),
        metadata=census_metadata("census"),
        project="p1",
    )


def _total(result_output: dict[str, object] | None) -> float:
    assert result_output is not None
    values = result_output["values"]
    assert isinstance(values, list)
    return float(sum(sum(v for v in row if v is not None) for row in values))


def test_a_pinned_plan_runs_on_its_version_and_says_so(
    centre: Centre, server: tuple[Service, EmbeddedServer], two_versions: None
) -> None:
    _, srv = server
    with connect(srv.url, centre.keys["ada"], "ada") as session:
        plan = session.plan("census@1")
        assert plan.dataset == "census@1"
        assert plan.metadata is not None and plan.metadata.version == 1
        plan.frequency_table(rows="sex")
        sealed = session.seal(plan)
        fields = sealed.header_fields
        assert (fields.researcher, fields.project, fields.server) == ("ada", "p1", "test-centre")
        assert fields.dataset == "census@1"
        (result,) = session.run(sealed)
    assert result.released, result.describe()
    assert (result.dataset, result.dataset_version) == ("census", 1)
    assert result.dataset_label == "census@1"
    assert "census@1" in result.describe()
    assert _total(result.output) == len(centre.census)


def test_a_bare_name_is_pinned_to_the_newest_version_the_catalogue_lists(
    centre: Centre, server: tuple[Service, EmbeddedServer], two_versions: None
) -> None:
    _, srv = server
    with connect(srv.url, centre.keys["ada"], "ada") as session:
        plan = session.plan("census")
        assert plan.dataset == "census@2"
        plan.frequency_table(rows="sex")
        (result,) = session.run(session.seal(plan, centre.keys["ada"]))
    assert result.dataset_version == 2
    assert _total(result.output) == V2_ROWS


def test_a_plan_built_offline_with_catalogue_metadata_validates_its_pinned_version(
    centre: Centre, server: tuple[Service, EmbeddedServer], two_versions: None
) -> None:
    _, srv = server
    with connect(srv.url, centre.keys["ada"], "ada") as session:
        v1 = session.metadata("census@1")
        assert v1.name == "census" and v1.version == 1
        Plan("census@1", v1).ols("income ~ age").validate()
        with pytest.raises(ValueError, match="census@2"):
            Plan("census@1", session.metadata("census@2"))
        with pytest.raises(UnknownDataset, match="census@1, census@2"):
            session.plan("census@3")
        # carol's project has census2 only: the catalogue does not offer her census
    with connect(srv.url, centre.keys["carol"], "carol") as session, pytest.raises(UnknownDataset):
        session.plan("census@1")
