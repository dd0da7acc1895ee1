"""Scope state files written as deltas of the file they were admitted from (qss/gate.StateFiles)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

from safeaccess.rules.qss import AuditPolicy, admit
from safeaccess.server.config import scope_folder
from safeaccess.server.outcome import QssPointer
from safeaccess.server.qss.gate import FULL_EVERY, AuditUnavailable, StateFiles
from safeaccess.server.qss.universe import EMPTY, Population, admit_populations, parent_of

POLICY = AuditPolicy(k=5)
SCOPE = "d/project/p"


def _admit_chain(files: StateFiles, n: int, steps: int, seed: int = 0) -> list[str]:
    """`steps` admissions of tables on two random columns (int8 cells), each loaded from the
    pointer the last one wrote, as the server does; the digests written."""
    rng = np.random.default_rng(seed)
    region, sex = rng.integers(0, 10, n), rng.integers(0, 2, n)
    tables = [region, sex, region * 2 + sex]
    pointer: QssPointer | None = None
    digests = []
    for step in range(steps):
        loaded = files.load(SCOPE, pointer, n)
        prepared, _ = admit_populations(loaded, [Population.of(1, np.arange(n))], POLICY)
        cells = tables[step % 3].astype(np.int8)
        admission = admit(prepared.state, [cells], POLICY)
        assert admission.admitted and admission.state is not None
        digest = files.save(SCOPE, prepared.refined(admission.state, [cells]))
        pointer = QssPointer(digest, n, 1)
        digests.append(digest)
    return digests


def test_a_scope_writes_deltas_between_full_states_and_reads_them_back_cold(
    tmp_path: Path,
) -> None:
    n = 20_000
    files = StateFiles(tmp_path)
    digests = _admit_chain(files, n, FULL_EVERY + 3)
    folder = tmp_path / "qss" / scope_folder(SCOPE)
    raws = [(folder / f"{d}.state").read_bytes() for d in digests]
    assert all(hashlib.sha256(raw).hexdigest() == d for raw, d in zip(raws, digests, strict=True))
    parents = [parent_of(raw) for raw in raws]
    # the first file is a delta of the empty state; with no full file written in the background
    # (nothing calls `compact` here), the file FULL_EVERY - 1 deltas on is written full
    full = FULL_EVERY - 1
    assert parents[0] == EMPTY and parents[full] is None
    for i in [*range(1, full), full + 1, full + 2, full + 3]:
        assert parents[i] == digests[i - 1]
    # a delta holds one byte per record (the int8 table), not the 4-byte atom ids
    assert all(len(raws[i]) < 2 * n for i in (1, 2, full + 1))
    assert len(raws[0]) < 3 * n  # the first holds the population's array and the table's
    assert len(raws[full]) > n  # with the atom ids (int8 for these few atoms)
    last = files.load(SCOPE, QssPointer(digests[-1], n, 1), n)
    for at in (0, full - 1, len(digests) - 1):
        cold = StateFiles(tmp_path).load(SCOPE, QssPointer(digests[at], n, 1), n)
        warm = files.load(SCOPE, QssPointer(digests[at], n, 1), n)
        assert cold.state.to_bytes() == warm.state.to_bytes()
        assert cold.populations == warm.populations == {1: "admitted"}
    assert last.state.n_query_sets > FULL_EVERY


def test_pruning_keeps_every_file_the_current_state_needs(tmp_path: Path) -> None:
    n = 2_000
    files = StateFiles(tmp_path)
    digests = _admit_chain(files, n, FULL_EVERY - 2)
    current = digests[-1]
    files.prune(SCOPE, current, digests[-2])
    folder = tmp_path / "qss" / scope_folder(SCOPE)
    assert {p.stem for p in folder.glob("*.state")} == set(digests)  # one chain: all needed
    cold = StateFiles(tmp_path).load(SCOPE, QssPointer(current, n, 1), n)
    assert cold.state.to_bytes() == files.load(SCOPE, QssPointer(current, n, 1), n).state.to_bytes()
    # after the next full state, the old chain is no longer needed and goes (the newest stay)
    more = _admit_chain(StateFiles(tmp_path), n, 1, seed=5)
    files.prune(SCOPE, more[-1])
    left = {p.stem for p in folder.glob("*.state")}
    assert more[-1] in left and len(left) <= 3


def test_a_delta_whose_parent_is_gone_is_unavailable_not_wrong(tmp_path: Path) -> None:
    n = 2_000
    files = StateFiles(tmp_path)
    digests = _admit_chain(files, n, 3)
    folder = tmp_path / "qss" / scope_folder(SCOPE)
    (folder / f"{digests[0]}.state").unlink()
    # the step is answered "audit unavailable" (retried later), nothing is released
    with pytest.raises(AuditUnavailable, match="missing"):
        StateFiles(tmp_path).load(SCOPE, QssPointer(digests[-1], n, 1), n)
