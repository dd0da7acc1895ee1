"""The populations of a dataset's versions, admitted before any output (qss_universe)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

from safeaccess.rules.qss import AuditPolicy, AuditState, StateFormatError, admit
from safeaccess.server.config import scope_folder
from safeaccess.server.outcome import QssPointer
from safeaccess.server.qss.gate import StateFiles
from safeaccess.server.qss.universe import (
    MAGIC,
    Population,
    ScopeState,
    admit_populations,
    decode,
    encode,
    population_set,
)

POLICY = AuditPolicy(k=10)
N = 100


def everyone_but(n_records: int, left_out: list[int]) -> np.ndarray:
    array = np.zeros(n_records, dtype=np.int32)
    array[left_out] = -1
    return array


def fresh(n_records: int = N) -> ScopeState:
    return ScopeState(AuditState.empty(n_records), {})


def test_the_population_is_admitted_first_so_everyone_but_one_is_refused() -> None:
    plain = fresh().state
    # Without the population, "everyone but one" is an ordinary large set.
    assert admit(plain, [everyone_but(N, [7])], POLICY).admitted
    prepared, facts = admit_populations(fresh(), [Population.of(1, np.arange(N))], POLICY)
    assert prepared.populations == {1: "admitted"}
    assert facts == {"versions_admitted": [1]}
    assert prepared.state.n_query_sets == 1
    refused = admit(prepared.state, [everyone_but(N, [7])], POLICY)
    assert not refused.admitted and refused.smallest_isolated == 1
    # and the whole population again (a colleague's table) is released
    assert admit(prepared.state, [np.zeros(N, dtype=np.int32)], POLICY).admitted


def test_a_decided_population_is_not_admitted_again() -> None:
    first, _ = admit_populations(fresh(), [Population.of(1, np.arange(N))], POLICY)
    again, facts = admit_populations(first, [Population.of(1, np.arange(N))], POLICY)
    assert facts == {}
    assert again.state is first.state


def test_a_version_differing_by_one_record_is_refused_and_recorded() -> None:
    versions = [Population.of(2, np.arange(N - 1)), Population.of(1, np.arange(N))]
    prepared, facts = admit_populations(fresh(), versions, POLICY)
    # version order, whatever the list's order: v1 is admitted, v2 would isolate record N-1
    assert prepared.populations == {1: "admitted", 2: "refused"}
    assert facts["versions_admitted"] == [1] and facts["versions_refused"] == [2]
    assert isinstance(facts["refusals"]["2"], str) and facts["refusals"]["2"]
    assert prepared.state.n_query_sets == 1


def test_a_later_version_with_new_records_grows_the_state_and_is_admitted() -> None:
    first, _ = admit_populations(fresh(), [Population.of(1, np.arange(N))], POLICY)
    later = [Population.of(1, np.arange(N)), Population.of(2, np.arange(N + 50))]
    prepared, facts = admit_populations(first, later, POLICY)
    assert prepared.populations == {1: "admitted", 2: "admitted"}
    assert facts == {"versions_admitted": [2]}
    assert prepared.state.n_records == N + 50
    # the 50 new records: determined by the two published counts, and 50 >= k
    assert admit(prepared.state, [everyone_but(N + 50, list(range(N, N + 50)))], POLICY).admitted


def test_population_set_marks_the_versions_records() -> None:
    array = population_set(np.array([1, 3]), 5)
    assert array.tolist() == [-1, 0, -1, 0, -1]


def test_the_envelope_round_trips_and_a_bare_state_has_no_population() -> None:
    prepared, _ = admit_populations(fresh(), [Population.of(1, np.arange(N))], POLICY)
    raw = encode(prepared)
    assert raw.startswith(MAGIC)
    back = decode(raw)
    assert back.populations == {1: "admitted"}
    assert back.state.to_bytes() == prepared.state.to_bytes()
    bare = decode(prepared.state.to_bytes())
    assert bare.populations == {}
    assert bare.state.to_bytes() == prepared.state.to_bytes()


@pytest.mark.parametrize(
    "raw",
    [
        MAGIC + b"\x00\x00",
        MAGIC + b"\x00\x00\x00\x40{}",
        MAGIC + b"\x00\x00\x00\x02{}",
        MAGIC + b"\x00\x00\x00\x1d" + b'{"format":2,"populations":{}}',
    ],
)
def test_a_damaged_envelope_is_a_format_error(raw: bytes) -> None:
    with pytest.raises(StateFormatError):
        decode(raw)


def test_state_files_keep_the_population_decisions(tmp_path: Path) -> None:
    files = StateFiles(tmp_path)
    prepared, _ = admit_populations(fresh(), [Population.of(1, np.arange(N))], POLICY)
    digest = files.save("d/project/p", prepared)
    loaded = StateFiles(tmp_path).load("d/project/p", QssPointer(digest, N, 1), N)
    assert loaded.populations == {1: "admitted"}
    assert loaded.state.n_query_sets == 1


def test_a_state_from_before_populations_admits_them_on_next_load(tmp_path: Path) -> None:
    # A scope written before this change: a bare AuditState. Its first load admits the
    # population, unless an earlier release conflicts with it ("everyone but one" was released
    # under the old rules): then the population is refused and the scope keeps the old guard.
    scope = "d/project/p"
    folder = tmp_path / "qss" / scope_folder(scope)
    folder.mkdir(parents=True)
    pointers = {}
    for label, released in (("clean", np.arange(N) % 2), ("but_one", everyone_but(N, [7]))):
        admission = admit(AuditState.empty(N), [released.astype(np.int32)], POLICY)
        assert admission.admitted and admission.state is not None
        raw = admission.state.to_bytes()
        digest = hashlib.sha256(raw).hexdigest()
        (folder / f"{digest}.state").write_bytes(raw)
        pointers[label] = QssPointer(digest, N, 1)
    files = StateFiles(tmp_path)
    population = [Population.of(1, np.arange(N))]
    clean, _ = admit_populations(files.load(scope, pointers["clean"], N), population, POLICY)
    assert clean.populations == {1: "admitted"}
    but_one, facts = admit_populations(
        files.load(scope, pointers["but_one"], N), population, POLICY
    )
    assert but_one.populations == {1: "refused"}
    assert facts["versions_refused"] == [1]
