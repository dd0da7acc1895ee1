"""The data-revealed zero rule (`server/qss/grid.py`) on real admissions, without the HTTP layer.

A new query set the records make a combination of released ones is released when the outputs'
definitions imply it (repeats, margins, a histogram bin asked again as a filter) and refused when
only the records do (the refusal-oracle probe's "no" branch); the dependencies themselves come
from the auditor's exact algebra, the grid from the metadata.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from safeaccess.client.analyses import Analysis, FrequencyTable, Histogram, Summary
from safeaccess.client.metadata import Column, DatasetMetadata
from safeaccess.rules.decision import Decision
from safeaccess.rules.qss import AuditMode, AuditPolicy, AuditState
from safeaccess.sandbox.runner import execute
from safeaccess.server.qss import grid
from safeaccess.server.qss.gate import Gate, gate
from safeaccess.server.qss.universe import Population, ScopeState, admit_populations, decode, encode

N = 600
METADATA = DatasetMetadata(
    name="grid",
    columns=[
        Column(name="sex", type="categorical", levels=["F", "M"]),
        Column(name="region", type="categorical", levels=["N", "S", "E"]),
        Column(name="age", type="integer", bounds=(18, 100)),
        Column(name="income", type="continuous", bounds=(0, 100_000)),
    ],
)
POLICY = AuditPolicy(mode=AuditMode.SPAN, k=10)
RELEASE = Decision(verdict="release", findings=[], ruleset="test", ruleset_hash="0" * 64)


@pytest.fixture(scope="module")
def frame() -> pd.DataFrame:
    rng = np.random.default_rng(7)
    frame = pd.DataFrame(
        {
            "sex": rng.choice(["F", "M"], N),
            "region": rng.choice(["N", "S", "E"], N),
            "age": rng.integers(18, 90, N),
            "income": np.round(rng.uniform(1_000, 60_000, N), 2),
        }
    )
    frame.loc[0, ["age", "income"]] = [97, 70_000.0]  # the only person over 95
    frame.loc[1:20, ["age", "region"]] = [93, "N"]  # forty people aged 90-95, half North
    frame.loc[21:40, ["age", "region"]] = [92, "S"]
    return frame


class Scope:
    """One scope's state, fed step by step as the server does (populations first)."""

    def __init__(self, frame: pd.DataFrame):
        self.frame = frame
        start = ScopeState(AuditState.empty(len(frame)))
        self.state, _ = admit_populations(start, [Population.of(1, np.arange(len(frame)))], POLICY)

    def ask(self, analysis: Analysis) -> Gate:
        output = execute(analysis, self.frame, METADATA)
        result = gate(
            output,
            RELEASE,
            ids=np.arange(len(self.frame)),
            state=self.state.state,
            policy=POLICY,
            scope="s",
            analysis=analysis.model_dump(mode="json"),
            metadata=METADATA,
            origins=self.state.origins,
        )
        if result.state is not None:
            assert result.origin is not None
            origins = {**self.state.origins, result.origin[0]: result.origin[1]}
            # through the state file's envelope, as the server keeps it
            kept = ScopeState(result.state, self.state.populations, origins)
            self.state = decode(encode(kept))
        return result


def test_repeats_margins_and_bins_are_structural(frame: pd.DataFrame) -> None:
    scope = Scope(frame)
    asks: list[Analysis] = [
        FrequencyTable(rows=["region"], cols=["sex"]),
        FrequencyTable(rows=["region"], cols=["sex"]),
        FrequencyTable(rows=["sex"]),
        Histogram(variable="income", edges=[0.0, 30_000.0, 45_000.0, 100_000.0]),
        Summary(variables=["income"], where="income >= 30000 and income < 45000"),
    ]
    results = [scope.ask(a) for a in asks]
    assert [r.decision.verdict for r in results] == ["release"] * len(asks)
    # the check really ran: the repeat and the margin were dependent on earlier rows
    assert results[1].facts["dependencies"] > 0 and results[2].facts["dependencies"] > 0


def test_a_repeat_is_structural_on_a_grid_over_the_cap(
    frame: pd.DataFrame, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A repeated table's cells are the earlier ones by definition, so the repeat is released
    even where no grid can be evaluated (every grid over the cap): the rows cancel before any
    grid is built. A different table on the same records still goes to the grid's fallback."""
    monkeypatch.setattr(grid, "GRID_CAP", 0)
    scope = Scope(frame)
    table = FrequencyTable(rows=["region"], cols=["sex"], where="income < 50000")
    first, again = scope.ask(table), scope.ask(table)
    assert [first.decision.verdict, again.decision.verdict] == ["release", "release"]
    assert again.facts["dependencies"] > 0
    coarser = scope.ask(FrequencyTable(rows=["sex"], where="income < 50000"))
    assert coarser.facts["dependencies"] > 0
    assert coarser.decision.verdict != "release"  # a margin needs the grid, and it is over the cap


@pytest.mark.parametrize("x", [80_000.0, 60_000.0])
def test_both_branches_of_a_probe_are_refused(frame: pd.DataFrame, x: float) -> None:
    # x = 80 000: nobody over 95 earns more: the probe's records are exactly `age < 90`'s (a
    # zero only the data reveal); x = 60 000: the probe holds one more person (too small).
    scope = Scope(frame)
    assert scope.ask(Summary(variables=["income"], where="age < 90")).decision.verdict == "release"
    probe = Summary(variables=["income"], where=f"age < 90 or (age >= 96 and income > {x})")
    result = scope.ask(probe)
    assert result.decision.verdict == "withhold"
    assert result.facts.get("data_revealed_zero", False) == (x == 80_000.0)


def test_a_padded_probe_is_refused_too(frame: pd.DataFrame) -> None:
    # the "no" branch equals the sum of two released sets, not any one of them
    scope = Scope(frame)
    pad = "region == 'N' and age >= 90 and age <= 95"
    for where in ("age < 90", pad):
        assert scope.ask(Summary(variables=["income"], where=where)).decision.verdict == "release"
    probe = Summary(
        variables=["income"], where=f"age < 90 or ({pad}) or (age >= 96 and income > 80000)"
    )
    result = scope.ask(probe)
    assert result.decision.verdict == "withhold" and result.facts["data_revealed_zero"]
    # for the controller: the two earlier summaries it combines (admissions after the population)
    assert len(result.facts["conflicts_with"]) == 2


def test_an_equal_filter_written_differently_is_structural(frame: pd.DataFrame) -> None:
    # `age >= 18` is everyone by the declared bounds: a zero the metadata implies
    scope = Scope(frame)
    result = scope.ask(Summary(variables=["income"], where="age >= 18"))
    assert result.decision.verdict == "release"
    assert result.facts["dependencies"] > 0


def test_an_ordinary_corpus_is_released_whole() -> None:
    # benchmarks/qss_grid_corpus.py: six researchers, 22 ordinary outputs, filters people write
    # (`age >= 18`, `income > 0`, `employment == 'employed'`), on 60 000 census rows
    import importlib.util
    from pathlib import Path

    from safeaccess.server.demo.data import census_metadata, generate_census

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "qss_grid_corpus.py"
    spec = importlib.util.spec_from_file_location("qss_grid_corpus", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    results = module.run_corpus(generate_census(60_000), census_metadata())
    withheld = [(who, a.kind) for who, a, r, _ in results if r.decision.verdict != "release"]
    assert withheld == []
    assert sum(r.facts.get("dependencies", 0) > 0 for _, _, r, _ in results) >= 10


def _counted(monkeypatch: pytest.MonkeyPatch, method: str) -> list[int]:
    """Count the calls of a `_GridEvaluator` method (in a one-item list)."""
    calls = [0]
    original = getattr(grid._GridEvaluator, method)

    def counted(self: grid._GridEvaluator, *args: object) -> object:
        calls[0] += 1
        return original(self, *args)

    monkeypatch.setattr(grid._GridEvaluator, method, counted)
    return calls


def test_rows_kept_across_steps_decide_as_a_fresh_evaluation(
    frame: pd.DataFrame, monkeypatch: pytest.MonkeyPatch
) -> None:
    # issue 25: an analysis's rows on a small grid are kept across steps (`_EvaluatedRows`),
    # and so are the verdicts on each combination (`_Verdicts`); the same asks must get the
    # same decisions and facts whether everything is evaluated afresh (nothing kept), first
    # kept, or read back, and reading back must skip the runs and the grid checks.
    from safeaccess.server.qss import grid

    asks: list[Analysis] = [
        FrequencyTable(rows=["region"], cols=["sex"]),
        FrequencyTable(rows=["region"], cols=["sex"]),
        FrequencyTable(rows=["sex"]),
        Summary(variables=["income"], where="age < 90"),
        Summary(variables=["income"], where="age < 90 or (age >= 96 and income > 80000)"),
    ]
    runs = _counted(monkeypatch, "_evaluate")  # analyses run on a grid frame
    checks = _counted(monkeypatch, "_on_grid")  # combinations checked on a grid

    def decide() -> list[tuple[str, dict[str, object]]]:
        scope = Scope(frame)
        out = []
        for ask in asks:
            result = scope.ask(ask)
            facts = {k: v for k, v in result.facts.items() if k != "grid_ms"}
            out.append((result.decision.verdict, facts))
        return out

    monkeypatch.setattr(grid, "_EVALUATED", grid._EvaluatedRows(max_points=0))
    monkeypatch.setattr(grid, "_VERDICTS", grid._Verdicts(max_entries=0))
    fresh, fresh_runs, fresh_checks = decide(), runs[0], checks[0]
    monkeypatch.setattr(grid, "_EVALUATED", grid._EvaluatedRows())
    monkeypatch.setattr(grid, "_VERDICTS", grid._Verdicts())
    runs[0] = checks[0] = 0
    first, first_runs, first_checks = decide(), runs[0], checks[0]
    runs[0] = checks[0] = 0
    again, again_runs, again_checks = decide(), runs[0], checks[0]
    assert fresh == first == again
    assert [v for v, _ in again][-1] == "withhold"  # the probe is still refused
    # kept rows serve the later steps of the first pass already, and all of the second
    assert 0 < first_runs < fresh_runs and again_runs < first_runs
    # a scope's later steps meet combinations its earlier steps checked (the repeated table):
    # their verdicts are read back (a verdict is kept by its lane's prime, so another scope's
    # combinations, under other primes, are checked again)
    assert 0 < first_checks < fresh_checks and 0 < again_checks < fresh_checks


def test_weights_summed_per_row_object_decide_as_the_row_by_row_sum(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`holds` adds the weights of one row object first (a repeated table's rows are one
    object); on random rows, some shared and some equal but distinct, it decides as
    new − Σ c·row computed row by row, mod p."""
    from safeaccess.server.qss import grid

    rng = np.random.default_rng(11)
    # Rows faked per draw: no verdict may be kept from one draw for the next.
    monkeypatch.setattr(grid, "_VERDICTS", grid._Verdicts(max_entries=0))
    evaluator = grid._GridEvaluator(METADATA, {})
    monkeypatch.setattr(evaluator, "_origin_names", lambda origin: {"sex"})
    monkeypatch.setattr(evaluator, "_grid", lambda names, analyses: True)
    evaluator.origins = {o: grid.Origin(analysis=None, rows=[]) for o in range(6)}
    decided = {True: 0, False: 0}
    for _ in range(400):
        p = int(rng.choice([2, 3, 7, 2_147_483_647]))
        pool = [rng.integers(0, 2, 8).astype(bool) for _ in range(3)]
        pool.append(pool[0].copy())  # equal to another, not the same object
        picks = [int(i) for i in rng.integers(0, len(pool), int(rng.integers(2, 6)))]
        coefficients = [int(c) for c in rng.integers(1, p, len(picks) - 1)]
        if rng.random() < 0.5:  # a repeat: the new row and one earlier row, weights cancelling
            picks, coefficients = [picks[0], picks[0]], [1]
        sources = [grid._Source(origin=i, array=0, label=str(i)) for i in range(len(picks))]
        rows = {src.origin: pool[pick] for src, pick in zip(sources, picks, strict=True)}
        monkeypatch.setattr(evaluator, "_row", lambda names, src, rows=rows: rows[src.origin])
        expected = np.asarray(pool[picks[0]], dtype=np.int64)
        for c, pick in zip(coefficients, picks[1:], strict=True):
            expected = (expected - c * np.asarray(pool[pick], dtype=np.int64)) % p
        verdict = evaluator.holds(sources, coefficients, p)
        assert verdict == (not expected.any())
        decided[verdict] += 1
    assert decided[True] > 50 and decided[False] > 50  # both answers were exercised


def test_each_dependency_is_judged_on_a_grid_cut_at_its_own_constants() -> None:
    """Two dependencies of one step over the same columns: the second is judged on points
    that separate its own rows (here `income < 45000` from `income < 40000`), not on the grid
    the first dependency needed, whichever comes first."""
    wheres = {1: "income < 40000", 2: "not income >= 40000", 3: "income < 45000"}
    origins = {
        o: grid.Origin(
            analysis=FrequencyTable(rows=["sex"], where=where).model_dump(mode="json"),
            rows=[(0, "F"), (0, "M")],
        )
        for o, where in wheres.items()
    }
    evaluator = grid._GridEvaluator(METADATA, origins)

    def holds(new: int, old: int) -> bool:
        rows = [grid._Source(new, 0, "F"), grid._Source(old, 0, "F")]
        return evaluator.holds(rows, [1], 2_147_483_647)

    assert holds(1, 2)  # one set of records written two ways: structural, on the grid
    assert not holds(1, 3)  # income in [40 000, 45 000) tells them apart
    assert holds(1, 2)
