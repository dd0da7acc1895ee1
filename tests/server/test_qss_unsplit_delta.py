"""An admission whose arrays split no atom (a repeated table, or one coarser than what was
released) writes a delta without its arrays (`ScopeState.refined`): the atoms are unchanged,
so there is nothing to replay, and the state file is a small fraction of one that carries an
array; a cold load of the chain gives the state the admissions gave."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from safeaccess.rules.qss import AuditPolicy, admit
from safeaccess.server.outcome import QssPointer
from safeaccess.server.qss.compaction import Compactor
from safeaccess.server.qss.gate import StateFiles
from safeaccess.server.qss.universe import Population, admit_populations

POLICY = AuditPolicy(k=5)
SCOPE = "d/project/unsplit"
N = 20_000


def test_an_array_that_splits_nothing_is_not_written_and_the_state_reloads(
    tmp_path: Path,
) -> None:
    rng = np.random.default_rng(3)
    region, sex = rng.integers(0, 10, N), rng.integers(0, 2, N)
    table = (region * 2 + sex).astype(np.int8)
    arrays = [
        table,  # splits the population
        table,  # the same table again: splits nothing
        region.astype(np.int8),  # its margin: coarser, splits nothing
        sex.astype(np.int8),  # the other margin
    ]
    # nothing compacts (`compact` is never called): a load replays the chain of deltas
    files = StateFiles(tmp_path, compactor=Compactor())
    pointer: QssPointer | None = None
    sizes, states = [], []
    for cells in arrays:
        loaded = files.load(SCOPE, pointer, N)
        prepared, _ = admit_populations(loaded, [Population.of(1, np.arange(N))], POLICY)
        admission = admit(prepared.state, [cells], POLICY)
        assert admission.admitted and admission.state is not None
        after = prepared.refined(admission.state, [cells])
        split = admission.state.n_atoms != prepared.state.n_atoms
        assert (len(after.steps) > len(prepared.steps)) == split
        digest = files.save(SCOPE, after)
        sizes.append(next((tmp_path / "qss").rglob(f"{digest}.state")).stat().st_size)
        states.append(admission.state.to_bytes())
        pointer = QssPointer(digest, N, len(states))
    # the first carries its array (and the population's), the others none
    assert sizes[0] > 2 * N and all(size < N // 2 for size in sizes[1:]), sizes
    # a new process replays the chain from the empty state and gets the same state
    cold = StateFiles(tmp_path, compactor=Compactor())
    assert cold.load(SCOPE, pointer, N).state.to_bytes() == states[-1]
    assert admit(cold.load(SCOPE, pointer, N).state, [table], POLICY).admitted
