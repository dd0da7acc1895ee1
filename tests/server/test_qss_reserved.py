"""The standard tables a scope reserves after a version's population (`server/qss/reserved.py`),
without the HTTP layer: which tables, their suppression, their record in the state file, and
that a later repeat of one is structural while a release that conflicts with one is refused."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from safeaccess.client.analyses import FrequencyTable, Mitigations, Summary
from safeaccess.client.metadata import Column, DatasetMetadata
from safeaccess.rules.decision import Decision
from safeaccess.rules.outputs import TableOutput
from safeaccess.rules.qss import AuditPolicy, AuditState
from safeaccess.rules.ruleset import DEFAULT_RULESET
from safeaccess.sandbox.release import mitigate_output
from safeaccess.sandbox.runner import execute
from safeaccess.server.qss.gate import gate
from safeaccess.server.qss.reserved import reserved_columns, reserved_tables
from safeaccess.server.qss.universe import Population, ScopeState, admit_populations, decode, encode

N = 400
METADATA = DatasetMetadata(
    name="reserved",
    columns=[
        Column(name="region", type="categorical", levels=["N", "S"]),
        Column(name="sex", type="categorical", levels=["F", "M"]),
        Column(name="employer", type="categorical", levels=["a", "b"], contributor=True),
        Column(name="income", type="continuous", bounds=(0, 100_000)),
    ],
)
POLICY = AuditPolicy(k=10)
RELEASE = Decision(verdict="release", findings=[], ruleset="test", ruleset_hash="0" * 64)


def frame() -> pd.DataFrame:
    rng = np.random.default_rng(5)
    out = pd.DataFrame(
        {
            "region": rng.choice(["N", "S"], N),
            "sex": rng.choice(["F", "M"], N),
            "employer": rng.choice(["a", "b"], N),
            "income": rng.uniform(1_000, 50_000, N),
        }
    )
    out.loc[:17, ["region", "sex"]] = ["N", "F"]  # N x F holds these 18 only ...
    out.loc[18:, "region"] = np.where(out.loc[18:, "sex"] == "F", "S", out.loc[18:, "region"])
    out.loc[:9, "income"] = 99_000.0  # ... and 10 of them earn 99 000
    return out


def test_one_and_two_way_tables_of_the_declared_categoricals() -> None:
    assert reserved_columns(METADATA) == ["region", "sex"]  # not the contributor column
    tables = reserved_tables(frame(), METADATA)
    assert [t.name for t in tables] == ["region", "sex", "region*sex"]
    assert tables[2].analysis == FrequencyTable(rows=["region"], cols=["sex"]).model_dump(
        mode="json"
    )
    # the cell of each record, as the runner labels it (pandas' own crosstab as the reference)
    labels = tables[2].labels[0]
    data = frame()
    assert [labels[c] for c in tables[2].cells[:3]] == [
        f"{r} | {s}" for r, s in zip(data["region"][:3], data["sex"][:3], strict=True)
    ]


def admitted_scope(data: pd.DataFrame) -> ScopeState:
    population = Population.of(1, np.arange(N), reserved_tables(data, METADATA))
    scope, facts = admit_populations(ScopeState(AuditState.empty(N)), [population], POLICY)
    assert facts["tables_reserved"] == ["1:region", "1:sex", "1:region*sex"]
    return scope


def test_reserved_decisions_are_kept_in_the_state_file() -> None:
    scope = decode(encode(admitted_scope(frame())))
    assert scope.reserved == {
        "1:region": "admitted",
        "1:sex": "admitted",
        "1:region*sex": "admitted",
    }
    # decided once: the next step reserves nothing again
    again, facts = admit_populations(scope, [Population.of(1, np.arange(N))], POLICY)
    assert facts == {} and again.state.n_query_sets == scope.state.n_query_sets


def verdict(
    scope: ScopeState,
    output: Any,
    analysis: FrequencyTable | Summary,
    metadata: DatasetMetadata = METADATA,
) -> str:
    """The auditor's verdict on `output` (of `analysis`) in `scope`."""
    return gate(
        output,
        RELEASE,
        ids=np.arange(N),
        state=scope.state,
        policy=POLICY,
        scope="s",
        analysis=analysis.model_dump(mode="json"),
        metadata=metadata,
        origins=scope.origins,
    ).decision.verdict


def ask(scope: ScopeState, data: pd.DataFrame, analysis: FrequencyTable | Summary) -> str:
    return verdict(scope, execute(analysis, data, METADATA), analysis)


def test_a_repeat_is_released_and_a_conflicting_release_refused() -> None:
    data = frame()
    scope = admitted_scope(data)
    assert ask(scope, data, FrequencyTable(rows=["region"], cols=["sex"])) == "release"
    # everyone but the 10 N x F people earning 99 000: leaves the other 8 of that cell
    everyone_but = Summary(variables=["income"], where="not (region == 'N' and income > 98000)")
    assert ask(scope, data, everyone_but) == "withhold"
    # without the reserved tables the same release went through
    bare, _ = admit_populations(
        ScopeState(AuditState.empty(N)), [Population.of(1, np.arange(N))], POLICY
    )
    assert ask(bare, data, everyone_but) == "release"


def test_a_state_without_constraints_records_its_population_refused() -> None:
    # A scope state from atoms mode before it kept constraints cannot admit a set of whole
    # atoms (it could be a zero only the records reveal): the population is recorded as
    # refused, not retried at every step as an unavailable audit.
    legacy = AuditState(np.zeros(N, dtype=np.int32), np.array([N]), 0, 0, None)
    scope, facts = admit_populations(ScopeState(legacy), [Population.of(1, np.arange(N))], POLICY)
    assert scope.populations == {1: "refused"} and facts["versions_refused"] == [1]


GROUPS = DatasetMetadata(
    name="groups",
    columns=[
        Column(name="group", type="categorical", levels=["a", "b", "c"]),
        Column(name="sex", type="categorical", levels=["F", "M"]),
        Column(name="income", type="continuous", bounds=(0, 100_000)),
    ],
)


def groups() -> pd.DataFrame:
    """400 people: group a holds 5 (below k), b 50, c the other 345."""
    rng = np.random.default_rng(7)
    group = np.array(["a"] * 5 + ["b"] * 50 + ["c"] * (N - 55))
    return pd.DataFrame(
        {"group": group, "sex": rng.choice(["F", "M"], N), "income": rng.uniform(0, 9e4, N)}
    )


def test_tables_with_small_cells_are_reserved_as_suppression_releases_them() -> None:
    data = groups()
    counts = data["group"].value_counts()
    assert counts["a"] < POLICY.k <= counts["b"] < counts["c"]  # the planted small cell
    population = Population.of(1, np.arange(N), reserved_tables(data, GROUPS))
    scope, facts = admit_populations(ScopeState(AuditState.empty(N)), [population], POLICY)
    # the one-way table is reserved with a (primary) and b (the smallest other cell, secondary)
    # left out: primary suppression alone left a as the row count less b and c, and the
    # reservation was refused. The two-way table has cells below k: not reserved.
    assert facts["tables_reserved"] == ["1:group", "1:sex"]
    assert facts["tables_skipped"] == ["1:group*sex"]
    assert scope.reserved == {"1:group": "admitted", "1:sex": "admitted", "1:group*sex": "skipped"}
    assert decode(encode(scope)).reserved == scope.reserved

    def ask(analysis: FrequencyTable | Summary) -> str:
        output = mitigate_output(execute(analysis, data, GROUPS), analysis, DEFAULT_RULESET)
        return verdict(scope, output, analysis, GROUPS)

    # a colleague's suppressed group table is the reserved one (a and b shown empty) ...
    suppressed = FrequencyTable(rows=["group"], mitigations=Mitigations(suppress=True))
    shown = mitigate_output(execute(suppressed, data, GROUPS), suppressed, DEFAULT_RULESET)
    assert isinstance(shown, TableOutput) and shown.values == [[None], [None], [counts["c"]]]
    assert ask(suppressed) == "release"
    # ... and a count of b, which with the reserved table gives a's 5 people, is refused
    assert ask(Summary(variables=["income"], statistics=["count"], where="group == 'b'")) == (
        "withhold"
    )
