"""The generated census: deterministic, consistent with its metadata, and with a rare group."""

import pandas as pd

from safeaccess.server.demo.data import census_metadata, generate_census


def test_same_seed_same_data_other_seed_other_data() -> None:
    a = generate_census(2_000, seed=1)
    pd.testing.assert_frame_equal(a, generate_census(2_000, seed=1))
    assert not a.equals(generate_census(2_000, seed=2))


def test_columns_match_metadata_levels_and_bounds() -> None:
    df = generate_census()
    meta = census_metadata()
    assert [c.name for c in meta.columns] == list(df.columns)
    for col in meta.columns:
        if col.levels is not None:
            assert set(df[col.name].dropna().unique()) <= set(col.levels), col.name
        if col.bounds is not None:
            assert df[col.name].min() >= col.bounds[0] and df[col.name].max() <= col.bounds[1]
    assert len(df) >= 20_000
    assert df["person_id"].is_unique


def test_rare_group_gives_small_cells_by_region() -> None:
    # The demo's withheld step relies on this: some region x ethnicity cell is below 10.
    table = pd.crosstab(generate_census()["region"], generate_census()["ethnicity"])
    assert (table.to_numpy() < 10).any()
    assert (table.to_numpy() >= 10).sum() > table.size // 2
