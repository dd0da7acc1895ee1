"""`dcr`'s exact cell search (`safeaccess.rules.synthetic.cells`) against brute force and the
k-d tree it stands in for: ties to the lowest index, duplicates, one-hot categorical columns,
exact copies, dimension 1 to 10."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from safeaccess.rules.synthetic import cells as cells_mod
from safeaccess.rules.synthetic import dcr, dcr_loo, dcr_report, distance_features
from safeaccess.rules.synthetic import distance as distance_mod
from safeaccess.rules.synthetic.cells import nearest_by_cells


def brute_nearest(syn: np.ndarray, real: np.ndarray) -> tuple[np.ndarray, list[int]]:
    """Every pair's distance; the nearest real row, the lowest index among rows within a
    relative 1e-12 of the smallest distance (dcr's documented tie rule)."""
    dists, index = [], []
    for start in range(0, syn.shape[0], 256):
        block = np.sqrt(((syn[start : start + 256, None, :] - real[None]) ** 2).sum(axis=2))
        low = block.min(axis=1)
        dists.extend(low)
        index.extend(
            int(np.flatnonzero(row <= m * (1 + 1e-12)).min())
            for row, m in zip(block, low, strict=True)
        )
    return np.array(dists), index


def records(seed: int, n: int, spec: list[tuple[float, float] | int], lattice: bool) -> np.ndarray:
    """Raw records for `distance_features(·, spec)`: numeric columns on a coarse lattice
    (exact ties everywhere) or continuous, categorical codes in range."""
    rng = np.random.default_rng(seed)
    cols = []
    for col in spec:
        if isinstance(col, tuple):
            lo, hi = col
            if lattice:
                cols.append(lo + (hi - lo) * rng.integers(0, 3, n) / 2.0)
            else:
                cols.append(lo + (hi - lo) * rng.random(n))
        else:
            cols.append(rng.integers(0, col, n).astype(float))
    return np.stack(cols, axis=1) if cols else np.zeros((n, 0))


def cell_search_answers(monkeypatch) -> list[bool]:
    """Watch `dcr`'s calls of the cell search: one entry per call, True when it answered
    (False when it declined and the k-d tree did)."""
    calls: list[bool] = []
    real_cells = distance_mod.nearest_by_cells

    def spy(*args, **kwargs):
        out = real_cells(*args, **kwargs)
        calls.append(out is not None)
        return out

    monkeypatch.setattr(distance_mod, "nearest_by_cells", spy)
    return calls


@st.composite
def dcr_cases(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray]:
    """Feature matrices of dimension 1 to 10: numeric and one-hot categorical columns, lattice
    or continuous values, duplicated real rows and synthetic copies of real rows."""
    dim = draw(st.integers(1, 10))
    spec: list[tuple[float, float] | int] = []
    width = 0
    while width < dim:
        if draw(st.booleans()) and dim - width >= 2:
            levels = draw(st.integers(2, min(4, dim - width)))
            spec.append(levels)
            width += levels
        else:
            spec.append((0.0, draw(st.sampled_from([1.0, 3.0, 10.0]))))
            width += 1
    lattice = draw(st.booleans())
    n_real, n_syn = draw(st.integers(1, 80)), draw(st.integers(1, 60))
    seed = draw(st.integers(0, 2**32 - 1))
    real_raw = records(seed, n_real, spec, lattice)
    syn_raw = records(seed + 1, n_syn, spec, lattice)
    rng = np.random.default_rng(seed + 2)
    for _ in range(draw(st.integers(0, 5))):  # duplicated real rows
        real_raw[rng.integers(n_real)] = real_raw[rng.integers(n_real)]
    for _ in range(draw(st.integers(0, 5))):  # synthetic copies of real rows
        syn_raw[rng.integers(n_syn)] = real_raw[rng.integers(n_real)]
    return distance_features(syn_raw, spec), distance_features(real_raw, spec)


@settings(max_examples=300, deadline=None)
@given(
    dcr_cases(),
    st.sampled_from([1, 2]),
    st.sampled_from([1.0, 3.7, 1e-30, 1e30]),
    st.sampled_from([0.0, -5.0, 1e6]),
)
def test_cell_search_equals_brute_force_and_the_kd_tree(case, workers, scale, offset):
    # any magnitude (the float32 products work on rescaled coordinates) and offset
    syn, real = (x * scale + offset * scale for x in case)
    prep = distance_mod._real_tree(real)
    got = nearest_by_cells(syn, prep.uniq, prep.first, prep.tree, workers, math.inf)
    assert got is not None
    want_dist, want_index = brute_nearest(syn, real)
    assert got.tolist() == want_index
    assert got.tolist() == distance_mod._nearest_kdtree(syn, real).tolist()
    dist = np.sqrt(((syn - real[got]) ** 2).sum(axis=1))
    assert dist == pytest.approx(want_dist, rel=1e-12, abs=1e-15)


def test_cell_search_declines_when_it_would_measure_too_many_rows():
    rng = np.random.default_rng(3)
    real, syn = rng.random((500, 8)), rng.random((100, 8))
    prep = distance_mod._real_tree(real)
    assert nearest_by_cells(syn, prep.uniq, prep.first, prep.tree, 1, 0.01) is None
    assert nearest_by_cells(syn[:0], prep.uniq, prep.first, prep.tree, 1).shape == (0,)


@pytest.mark.parametrize("threads", ["1", None])
@pytest.mark.parametrize("dim", [8, 10])
def test_dcr_takes_the_cell_search_at_scale_and_matches_brute_force(dim, threads, monkeypatch):
    # 10 000 x 12 000 records pass dcr's size threshold: continuous points, a lattice (exact
    # ties), duplicated real rows (the lower index wins) and synthetic copies of real rows; at
    # this size the cells measure some 10 % of the rows (4 % at 100 000), so the share above
    # which they defer to the k-d tree is raised
    monkeypatch.setattr(cells_mod, "MAX_SHARE", 1.0)
    if threads is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", threads)
    rng = np.random.default_rng(50 + dim)
    real = np.r_[rng.random((9000, dim)), rng.integers(0, 3, size=(3000, dim)) / 2.0]
    real[11_000:11_100] = real[100:200]
    syn = np.r_[rng.random((8000, dim)), rng.integers(0, 3, size=(1900, dim)) / 2.0]
    syn = np.r_[syn, real[11_000:11_100]]
    calls = cell_search_answers(monkeypatch)
    dist, idx = dcr(syn, real)
    assert calls == [True]  # the cell search answered
    want_dist, want_index = brute_nearest(syn, real)
    assert idx.tolist() == want_index
    assert dist == pytest.approx(want_dist, rel=1e-12, abs=1e-15)
    assert idx[-100:].tolist() == list(range(100, 200))
    assert np.array_equal(idx, distance_mod._nearest_kdtree(syn, real))


def test_dcr_falls_back_to_the_kd_tree_on_data_of_few_latent_dimensions(monkeypatch):
    # rows on a 2-dimensional plane in 8 features crowd into a few cells: the cell search
    # declines and the k-d tree answers, with the same result
    rng = np.random.default_rng(8)
    mix = rng.random((2, 8))
    real, syn = rng.random((12_000, 2)) @ mix, rng.random((9000, 2)) @ mix
    calls = cell_search_answers(monkeypatch)
    _, idx = dcr(syn, real)
    assert calls == [False]
    assert idx.tolist() == brute_nearest(syn, real)[1]
    # the leave-one-out search declines before building anything, on the cells' counts alone
    assert cells_mod.crowded(real) and not cells_mod.crowded(rng.random((12_000, 8)))
    assert distance_mod._loo_by_cells(real) is None


def test_cell_search_far_from_a_tight_cluster_is_exact_or_declines():
    # real rows 1e-9 apart seen from a million units away: float32 products cannot tell them
    # apart, so every row is a candidate; past 64 per query the tree answers instead
    rng = np.random.default_rng(11)
    real = 1.0 + 1e-9 * rng.random((3000, 8))
    syn = np.r_[1e6 + rng.random((500, 8)), 1.0 + 1e-9 * rng.random((500, 8))]
    prep = distance_mod._real_tree(real)
    assert nearest_by_cells(syn, prep.uniq, prep.first, prep.tree, 1, math.inf) is None
    few = syn[-500:]  # near the cluster the products separate the rows again
    got = nearest_by_cells(few, prep.uniq, prep.first, prep.tree, 1, math.inf)
    assert got is not None and got.tolist() == brute_nearest(few, real)[1]
    assert dcr(syn, real)[1].tolist() == brute_nearest(syn, real)[1]


def test_dcr_report_with_the_cell_search_equals_the_tree_only_report(monkeypatch):
    # the report's DCR and LOO distances come from the cell search (every distance exact) where
    # it applies; the figures must be bit for bit those of the previous, tree-only code
    rng = np.random.default_rng(21)
    real = np.r_[rng.random((9000, 9)), rng.integers(0, 3, size=(3000, 9)) / 2.0]
    syn = np.r_[rng.random((9000, 9)), real[:1000]]
    monkeypatch.setattr(cells_mod, "MAX_SHARE", 1.0)
    calls = cell_search_answers(monkeypatch)
    got = dcr_report(syn, real)
    assert calls == [True, True]  # the LOO reference and the DCR
    monkeypatch.setattr(distance_mod, "CELLS_MIN_DIM", 10**9)
    assert got == dcr_report(syn, real)
    assert got == dcr_report(syn, real, distances=(dcr(syn, real)[0], dcr_loo(real)[0]))


@settings(max_examples=200, deadline=None)
@given(dcr_cases(), st.sampled_from([1, 2]), st.sampled_from([1.0, 1e-30, 1e30]))
def test_cell_search_excluding_each_row_itself_equals_brute_force_loo(case, workers, scale):
    # the leave-one-out search: each distinct real row's nearest *other* distinct row
    _, real = case
    real = real * scale
    uniq, first = np.unique(real, axis=0, return_index=True)
    if uniq.shape[0] < 2:
        return
    tree = distance_mod.cKDTree(uniq)
    own = np.arange(uniq.shape[0])
    got = nearest_by_cells(uniq, uniq, first, tree, workers, math.inf, exclude=own)
    assert got is not None
    full = np.sqrt(((uniq[:, None, :] - uniq[None]) ** 2).sum(axis=2))
    np.fill_diagonal(full, np.inf)
    want = [int(first[np.flatnonzero(row <= row.min() * (1 + 1e-12))].min()) for row in full]
    assert got.tolist() == want
    assert all(not np.array_equal(real[j], uniq[i]) for i, j in enumerate(got))


def test_report_loo_reference_by_cells_equals_dcr_loo(monkeypatch):
    # at scale the report's LOO distances come from the cell search with each row excluded:
    # rows with a twin at 0, every other one exactly as dcr_loo (brute force checked above)
    rng = np.random.default_rng(31)
    real = np.r_[rng.random((10_500, 9)), rng.integers(0, 3, size=(1500, 9)) / 2.0]
    real[11_900:] = real[:100]
    monkeypatch.setattr(cells_mod, "MAX_SHARE", 1.0)
    loo = distance_mod._loo_by_cells(real)
    assert loo is not None
    assert np.array_equal(loo, dcr_loo(real)[0])
    assert np.all(loo[:100] == 0.0)
