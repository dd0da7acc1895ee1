"""Plan: fluent building, canonical bodies, validation with positions, sealing end to end."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from safeaccess.client.analyses import (
    Correlation,
    FrequencyTable,
    Histogram,
    MagnitudeTable,
    Regression,
    Script,
    StatTest,
    Summary,
    parse_analysis,
)
from safeaccess.client.metadata import Column, DatasetMetadata
from safeaccess.client.plan import Plan
from safeaccess.client.protocol import verify_whole
from safeaccess.client.validation import AnalysisInvalid, validate

META = DatasetMetadata(
    name="census",
    columns=[
        Column(name="person_id", type="identifier"),
        Column(name="age", type="integer", bounds=(0, 110)),
        Column(name="income", type="continuous", bounds=(0, 1e7)),
        Column(name="sex", type="categorical", levels=["F", "M"]),
        Column(name="region", type="categorical", levels=["north", "south"]),
        Column(name="employed", type="categorical", levels=[0, 1]),
    ],
)


def _full_plan(metadata: DatasetMetadata | None = None) -> Plan:
    return (
        Plan("census", metadata)
        .frequency_table(rows="region", cols=["sex"], where="age >= 18", round_to=5)
        .magnitude_table("income", rows=["region"], agg="mean", suppress=True)
        .summary(["income", "age"], ["count", "median", "quantiles"], quantiles=[0.25, 0.75])
        .ols("log(income) ~ age + C(sex)", where="age >= 18")
        .logit("employed ~ age + sex")
        .probit("employed ~ age")
        .poisson("age ~ sex")
        .correlation(["income", "age"], "spearman")
        .histogram("income", edges=[0, 1e4, 1e5], by="sex")
        .chi2("sex", "region")
        .t_test("income", "sex", equal_var=True)
        .script("print('hello')")
    )


def test_builds_every_kind_in_order() -> None:
    plan = _full_plan()
    kinds = [type(a) for a in plan.analyses]
    assert kinds == [
        FrequencyTable,
        MagnitudeTable,
        Summary,
        Regression,
        Regression,
        Regression,
        Regression,
        Correlation,
        Histogram,
        StatTest,
        StatTest,
        Script,
    ]
    assert len(plan) == 12
    ft = plan.analyses[0]
    assert isinstance(ft, FrequencyTable)
    assert ft.rows == ["region"] and ft.cols == ["sex"] and ft.where == "age >= 18"
    assert ft.mitigations.round_to == 5
    families = [a.family for a in plan.analyses if isinstance(a, Regression)]
    assert families == ["ols", "logit", "probit", "poisson"]
    tests = [a.test for a in plan.analyses if isinstance(a, StatTest)]
    assert tests == ["chi2_independence", "t_two_sample"]


def test_bodies_are_canonical_json_of_the_analyses() -> None:
    plan = _full_plan()
    bodies = plan.bodies()
    assert len(bodies) == len(plan)
    for body, analysis in zip(bodies, plan.analyses, strict=True):
        assert parse_analysis(body) == analysis
        # canonical: sorted keys, no whitespace (independent re-serialisation)
        decoded = json.loads(body)
        assert body == json.dumps(decoded, sort_keys=True, separators=(",", ":")).encode()


def test_fluent_methods_return_the_same_plan() -> None:
    plan = Plan("census")
    assert plan.ols("income ~ age") is plan
    assert plan.add(Summary(variables=["age"])) is plan


def test_bad_input_changes_nothing() -> None:
    plan = Plan("census", META).frequency_table("sex")
    before = plan.bodies()
    with pytest.raises(AnalysisInvalid) as info:
        plan.summary([])  # schema: at least one variable
    assert info.value.problems[0].field.startswith("variables")
    with pytest.raises(AnalysisInvalid, match="did you mean 'income'"):
        plan.ols("incme ~ age")
    with pytest.raises(AnalysisInvalid, match="expected a column"):
        plan.ols("income ~ age +")
    with pytest.raises(AnalysisInvalid, match="identifier"):
        plan.frequency_table("person_id")
    with pytest.raises(AnalysisInvalid):
        plan.histogram("income")  # neither bins nor edges
    assert plan.bodies() == before


def test_histogram_bins_without_declared_bounds_are_refused_by_name() -> None:
    bounded = Plan("census", META).histogram("age", bins=4)
    assert bounded.analyses[0].model_dump()["edges"] == [0, 27.5, 55, 82.5, 110]
    for plan in (Plan("census"), Plan("census", META)):
        with pytest.raises(AnalysisInvalid, match="minimum and maximum") as info:
            plan.add(Histogram(variable="age", bins=4))
        assert info.value.problems[0].field == "bins" and len(plan) == 0
    with pytest.raises(AnalysisInvalid, match="bins"):
        Plan("census").histogram("age", bins=4)  # no metadata: the bounds are unknown
    with pytest.raises(AnalysisInvalid, match="whole number"):
        Plan("census", META).histogram("age", bins=0)


def test_grammar_is_checked_without_metadata() -> None:
    plan = Plan("census")
    with pytest.raises(AnalysisInvalid) as info:
        plan.ols("income ~ foo(age)", where="age >>= 3")
    assert [p.field for p in info.value.problems] == ["where", "formula"]
    assert "unknown function 'foo'" in info.value.problems[1].message
    assert len(plan) == 0
    plan.frequency_table("nonexistent_column")  # columns need the metadata
    assert len(plan) == 1


def test_validate_reports_positions() -> None:
    plan = Plan("census").frequency_table("sex").ols("income ~ agee")
    plan.histogram("sex", edges=[0, 1, 2])
    with pytest.raises(AnalysisInvalid) as info:
        plan.validate(META)
    fields = [p.field for p in info.value.problems]
    assert fields == ["analyses[1].formula", "analyses[2].variable"]
    _full_plan().validate(META)


def test_metadata_must_describe_the_plan_dataset() -> None:
    other = META.model_copy(update={"name": "other"})
    with pytest.raises(ValueError, match="'other'"):
        Plan("census", other)
    with pytest.raises(ValueError, match="'other'"):
        Plan("census").validate(other)
    with pytest.raises(ValueError, match="metadata"):
        Plan("census").validate()


def test_seal_binds_the_bodies_and_verifies() -> None:
    key = Ed25519PrivateKey.generate()
    plan = _full_plan(META)
    sealed = plan.seal(
        key, researcher="alice", project="p1", server="tre-1", expires=timedelta(days=2)
    )
    header = sealed.header_fields
    assert header.dataset == "census" and header.researcher == "alice"
    assert header.project == "p1" and header.server == "tre-1"
    assert header.expires - header.created == timedelta(days=2)
    revealed = verify_whole(sealed, key.public_key())
    assert [r.body for r in revealed] == plan.bodies()
    assert revealed[-1].last


def test_seal_refuses_an_invalid_plan_when_metadata_is_known() -> None:
    plan = Plan("census", META)
    plan.add(Regression(formula="income ~ age"))
    plan._analyses.append(Regression(formula="income ~ nope"))  # bypassing add()
    with pytest.raises(AnalysisInvalid, match="analyses\\[1\\]"):
        plan.seal(Ed25519PrivateKey.generate(), researcher="a", project="p", server="s")


def test_a_pinned_version_validates_with_the_metadata_of_its_dataset() -> None:
    # metadata named `census` (no version, or version 2) describes `census@2`
    plan = Plan("census@2", META)
    assert (plan.name, plan.version, plan.dataset) == ("census", 2, "census@2")
    plan.ols("income ~ age")
    plan.validate()
    Plan("census@2", META.model_copy(update={"version": 2})).validate()
    with pytest.raises(AnalysisInvalid):
        Plan("census@2", META).ols("income ~ nope")
    sealed = plan.seal(Ed25519PrivateKey.generate(), researcher="a", project="p", server="s")
    assert sealed.header_fields.dataset == "census@2"


def test_metadata_of_another_version_does_not_describe_a_pinned_plan() -> None:
    v1 = META.model_copy(update={"version": 1})
    with pytest.raises(ValueError, match=r"census@1.*census@2"):
        Plan("census@2", v1)
    with pytest.raises(ValueError, match="census@1"):
        Plan("census@2").validate(v1)
    # a bare name follows the newest version: metadata of any version describes it
    Plan("census", v1).validate()
    assert v1.label == "census@1" and META.label == "census"


@pytest.mark.parametrize("bad", ["census@", "census@x", "census@0", "@2"])
def test_a_malformed_version_is_refused(bad: str) -> None:
    with pytest.raises(ValueError, match=r"version|name"):
        Plan(bad)


def test_train_model_and_every_schema_error_is_an_analysis_invalid_saying_what_to_fix() -> None:
    from safeaccess.client.analyses import Fairness, ModelParams, ModelTraining

    plan = Plan("census", META).train_model(
        "decision_tree",
        "employed",
        ["age", "income"],
        params={"max_depth": 3},
        protected="sex",
        treatment="reweighing",
    )
    assert plan.analyses[0] == ModelTraining(
        family="decision_tree",
        target="employed",
        features=["age", "income"],
        params=ModelParams(max_depth=3),
        fairness=Fairness(protected="sex", treatment="reweighing"),
    )
    with pytest.raises(AnalysisInvalid) as info:
        Plan("census", META).train_model(
            "decision_tree", "employed", ["age"], params={"max_depht": 3, "max_depth": 99}
        )
    text = str(info.value)
    assert "params.max_depht: unknown field; the fields are C, learning_rate, max_depth" in text
    assert "params.max_depth: " in text and "30" in text
    assert "pydantic" not in text and "http" not in text and "extra_forbidden" not in text
    with pytest.raises(AnalysisInvalid, match="protected=COLUMN"):
        Plan("census", META).train_model(
            "decision_tree", "employed", ["age"], treatment="reweighing"
        )

    # The plan's methods and the validation of bodies say the same, never pydantic's listing.
    with pytest.raises(AnalysisInvalid) as info:
        validate({"kind": "frequency_table", "rows": ["sex"], "colums": ["region"]}, META)
    assert [p.field for p in info.value.problems] == ["frequency_table.colums"]
    assert "unknown field" in str(info.value) and "http" not in str(info.value)
    with pytest.raises(AnalysisInvalid, match="family: must be 'decision_tree'"):
        Plan("census", META).train_model("svm", "employed", ["age"])  # type: ignore[arg-type]
    with pytest.raises(AnalysisInvalid, match="exactly one of 'bins'"):
        Plan("census", META).histogram("age")
    with pytest.raises(AnalysisInvalid) as info:
        Plan("census", META).frequency_table(3)  # type: ignore[arg-type]
    assert info.value.problems[0].field == "rows[0]" and "http" not in str(info.value)


def test_survival_and_table_statistics_build_and_validate() -> None:
    meta = META.model_copy(
        update={
            "columns": [
                *META.columns,
                Column(name="days", type="continuous", bounds=(0, 5000)),
                Column(name="died", type="integer", bounds=(0, 1)),
            ]
        }
    )
    plan = (
        Plan("census", meta)
        .survival("days", "died", by="sex", interval=30, max_time=720, where="age >= 18")
        .magnitude_table("income", "region", agg="std")
        .magnitude_table("age", "region", "sex", agg="mode", margins=True)
    )
    km = plan.analyses[0]
    assert km == parse_analysis(plan.bodies()[0])
    assert km.model_dump() == {
        "kind": "survival",
        "time": "days",
        "event": "died",
        "by": ["sex"],
        "interval": 30.0,
        "max_time": 720.0,
        "where": "age >= 18",
    }
    assert [a.agg for a in plan.analyses[1:]] == ["std", "mode"]  # type: ignore[union-attr]
    for bad, field in (
        (lambda p: p.survival("days", "age"), "event"),  # bounds 0..110: not 0/1
        (lambda p: p.survival("sex", "died"), "time"),
        (lambda p: p.survival("days", "died", by="income"), "by[0]"),
        (lambda p: p.survival("days", "days"), "event"),
        (lambda p: p.survival("days", "died", interval=0), "interval"),
        (
            lambda p: p.magnitude_table(
                "income", "region", agg="mode", margins=True, suppress=True
            ),
            "mitigations.suppress",
        ),
    ):
        with pytest.raises(AnalysisInvalid) as info:
            bad(plan)
        assert field in [p.field for p in info.value.problems], info.value
        assert "http" not in str(info.value)
    assert len(plan) == 3


def test_the_metadata_from_the_catalogue_keeps_its_storage_and_neighbouring_relation() -> None:
    from safeaccess.client.metadata import NeighbouringRelation
    from safeaccess.client.session import _metadata_of

    published = DatasetMetadata(
        name="firms",
        version=3,
        columns=[
            Column(name="firm", type="categorical", levels=[1, 2], contributor=True),
            Column(name="turnover", type="continuous", bounds=(0, 10)),
        ],
        neighbours=NeighbouringRelation(unit="contributor", max_records_per_unit=5),
        storage="duckdb",
    )
    # a catalogue entry as the server lists it (`DatasetView`: the metadata's own fields)
    entry = {
        **published.model_dump(mode="json", include={"name", "version", "description"}),
        "columns": [c.model_dump(mode="json") for c in published.columns],
        "neighbours": published.neighbours.model_dump(mode="json"),
        "storage": published.storage,
        "rows": 40,
    }
    assert _metadata_of(entry) == published
