"""A state written as the steps from its parent (rules/qss/delta.py) reads back as the state."""

from __future__ import annotations

import numpy as np
import pytest

from safeaccess.rules.outputs import cell_dtype
from safeaccess.rules.qss import AuditMode, AuditPolicy, AuditState, StateFormatError, admit
from safeaccess.rules.qss.delta import Grow, Refine, Step, apply_delta, encode_delta
from safeaccess.rules.qss.encoding import atom_type


def _cells(rng: np.random.Generator, n: int, n_cells: int, inside: float) -> np.ndarray:
    array = rng.integers(0, n_cells, n)
    array[rng.random(n) > inside] = -1
    return array.astype(cell_dtype(n_cells))


def _run(seed: int, mode: AuditMode) -> list[tuple[AuditState, AuditState, list[Step]]]:
    """Admissions of random arrays (some growing the state first): (parent, child, steps)."""
    rng = np.random.default_rng(seed)
    policy = AuditPolicy(mode=mode, k=3)
    n = int(rng.integers(40, 200))
    state = admit(AuditState.empty(n), [np.zeros(n, dtype=np.int8)], policy).state
    assert state is not None
    out = []
    for _ in range(12):
        parent, steps = state, []
        current, n = state, state.n_records
        if rng.random() < 0.25:
            n += int(rng.integers(1, 20))
            current = current.grow(n)
            steps.append(Grow(n))
        arrays = [
            _cells(rng, n, int(rng.choice([2, 5, 200, 40_000])), float(rng.random()))
            for _ in range(int(rng.integers(1, 3)))
        ]
        admission = admit(current, arrays, policy)
        if admission.state is None:
            continue
        steps += [Refine(a) for a in arrays]
        out.append((parent, admission.state, steps))
        state = admission.state
    return out


@pytest.mark.parametrize("mode", [AuditMode.SPAN, AuditMode.ATOMS])
@pytest.mark.parametrize("seed", range(12))
def test_a_delta_replayed_on_its_parent_is_the_admitted_state(seed: int, mode: AuditMode) -> None:
    runs = _run(seed, mode)
    assert runs, "every admission was refused: the test would check nothing"
    for parent, child, steps in runs:
        raw = b"".join(encode_delta(child, steps))
        back = apply_delta(parent, raw)
        assert back.to_bytes() == child.to_bytes()
        # the delta is its 12-byte head, its steps (10-byte heads, the arrays), the sizes' digest and
        # the state without its per-record atoms (stored in `atom_type(n_atoms)`)
        arrays = sum(10 + (s.cells.nbytes if isinstance(s, Refine) else 0) for s in steps)
        atoms = child.n_records * atom_type(child.sizes.shape[0]).itemsize
        assert len(raw) == 12 + arrays + 32 + len(child.to_bytes()) - atoms


def test_a_delta_on_the_wrong_parent_or_altered_is_refused() -> None:
    policy = AuditPolicy(k=3)
    parent = admit(AuditState.empty(10), [np.zeros(10, dtype=np.int8)], policy).state
    assert parent is not None
    halves = np.array([0] * 5 + [1] * 5, dtype=np.int8)
    child = admit(parent, [halves], policy).state
    assert child is not None
    raw = b"".join(encode_delta(child, [Refine(halves)]))
    assert apply_delta(parent, raw).to_bytes() == child.to_bytes()
    # the same delta on another parent (every record in its own cell of 2) does not replay
    other = admit(parent, [np.arange(10, dtype=np.int8) % 2], policy).state
    assert other is not None
    with pytest.raises(StateFormatError):
        apply_delta(other, raw)
    # one record moved to the other half: 4 and 6 records, not the 5 and 5 described
    moved = raw.replace(halves.tobytes(), np.array([0] * 4 + [1] * 6, np.int8).tobytes())
    assert moved != raw
    with pytest.raises(StateFormatError, match="does not give"):
        apply_delta(parent, moved)
    with pytest.raises(StateFormatError, match="magic"):
        apply_delta(parent, b"SAQSS\0" + raw[6:])
    with pytest.raises(StateFormatError, match="truncated"):
        apply_delta(parent, raw[:25])


def test_a_delta_needs_int8_int16_or_int32_arrays() -> None:
    state = AuditState.empty(4)
    with pytest.raises(ValueError, match="int8, int16 or int32"):
        encode_delta(state, [Refine(np.zeros(4, dtype=np.int64))])
