"""A delta's header lists the origins of its own admissions only (`universe._header`): its size
no longer grows with the scope's history, and a load of the chain (warm or cold, through a
full file or not) still has every admission's origin."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np

from safeaccess.rules.qss import AuditPolicy, admit
from safeaccess.server.outcome import QssPointer
from safeaccess.server.qss.compaction import Compactor
from safeaccess.server.qss.gate import StateFiles
from safeaccess.server.qss.grid import Origin
from safeaccess.server.qss.universe import Population, _read_header, admit_populations

POLICY = AuditPolicy(k=5)
SCOPE = "d/project/origins"
N = 4_000


def test_each_delta_lists_its_own_origins_and_a_load_has_them_all(tmp_path: Path) -> None:
    rng = np.random.default_rng(9)
    region, sex, age = rng.integers(0, 8, N), rng.integers(0, 2, N), rng.integers(0, 5, N)
    arrays = [region, sex, region * 2 + sex, age, sex, region]
    files = StateFiles(tmp_path, compactor=Compactor())
    pointer: QssPointer | None = None
    listed: list[set[int]] = []
    for i, values in enumerate(arrays):
        cells = values.astype(np.int8)
        loaded = files.load(SCOPE, pointer, N)
        before = set(loaded.origins)
        prepared, _ = admit_populations(loaded, [Population.of(1, np.arange(N))], POLICY)
        admission = admit(prepared.state, [cells], POLICY)
        assert admission.admitted and admission.state is not None
        number = int(admission.facts["origin"])
        origin = Origin(analysis={"kind": "frequency_table", "rows": [f"t{i}"]}, rows=[(0, "0")])
        after = replace(
            prepared.refined(admission.state, [cells]),
            origins={**prepared.origins, number: origin},
        )
        digest = files.save(SCOPE, after)
        raw = next((tmp_path / "qss").rglob(f"{digest}.state")).read_bytes()
        header, _ = _read_header(raw)
        assert header.parent is not None  # every file here is a delta
        listed.append(set(header.origins))
        # only what this step added: its own origin (and, first, the population's)
        assert set(header.origins) == set(after.origins) - before
        pointer = QssPointer(digest, N, i + 1)
        # a new process replays the chain from the empty state: every origin is there
        cold = StateFiles(tmp_path, compactor=Compactor()).load(SCOPE, pointer, N)
        assert cold.origins == after.origins
    assert all(len(keys) == 1 for keys in listed[1:]), listed
    # and through a full file written for the last state (the background compaction's)
    files.write_full(SCOPE, pointer.digest, files.load(SCOPE, pointer, N))
    fresh = StateFiles(tmp_path, compactor=Compactor()).load(SCOPE, pointer, N)
    assert fresh.origins == after.origins and len(fresh.origins) == len(arrays) + 1
