"""Tables counted on a dataset version's stored code arrays equal tables coded afresh.

`safeaccess.sandbox.codes` writes a version's code arrays once; a fork server template maps
them and the runner's tables, histograms, summaries and chi-squared tests group on them
(`runner.stored_codes`). The reply a job writes must be byte for byte the reply of the pandas
path (`run_request` on the frame alone), on random datasets with missing values, declared levels
no record has, undeclared values, Categoricals, filters that select few or no records of a
level, margins and magnitudes. Arrays of another dataset, or altered ones, are refused.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from safeaccess.client.metadata import Column, DatasetMetadata
from safeaccess.sandbox.backend import RunnerRequest
from safeaccess.sandbox.codes import (
    MANIFEST,
    CodesError,
    codes_dir,
    load_codes,
    map_codes,
    sha256_file,
    write_codes,
)
from safeaccess.sandbox.runner import LoadedDataset, reply_for

REGIONS = ["north", "south", "east", "west", "centre"]  # declared; "centre" may have no record
META = DatasetMetadata(
    name="codes",
    columns=[
        Column(name="region", type="categorical", levels=REGIONS),
        Column(name="band", type="ordinal", levels=[1, 2, 3, 4]),
        Column(name="sex", type="categorical"),  # no declared levels: sorted observed values
        Column(name="kids", type="integer"),  # gaps make it float in the file
        Column(name="sector", type="categorical"),  # stored as a pandas Categorical
        Column(name="flag", type="categorical"),
        Column(name="income", type="continuous"),
    ],
)
WHERE = [
    None,
    "income > 0",
    "region == 'north'",
    "sex is null",
    "kids >= 2",
    "income > 1000000",  # selects nothing: both paths must fail alike
    "region in ('east', 'south') and flag == 1",
]
KEYS = ["region", "band", "sex", "kids", "sector", "flag"]


def _frame(seed: int, n: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)

    def gaps(values: np.ndarray, share: float) -> np.ndarray:
        out = values.astype(object)
        out[rng.random(n) < share] = None
        return out

    return pd.DataFrame(
        {
            "region": gaps(rng.choice(REGIONS[:4], n), 0.1),
            "band": pd.array(rng.integers(1, 4, n), dtype="Int64"),  # level 4 never occurs
            "sex": gaps(rng.choice(["f", "m", "x"], n, p=[0.5, 0.45, 0.05]), 0.05),
            "kids": np.where(rng.random(n) < 0.1, np.nan, rng.integers(0, 6, n)),
            "sector": pd.Categorical(
                rng.choice(["farm", "shop", "mill"], n), categories=["mill", "shop", "farm", "x"]
            ),
            "flag": rng.integers(0, 2, n).astype(bool),
            "income": np.where(rng.random(n) < 0.05, np.nan, rng.normal(500, 300, n)),
        }
    )


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory) -> dict[int, tuple[pd.DataFrame, Any]]:
    """Three stored datasets (different sizes and seeds), each with its code arrays."""
    out = {}
    for seed, n in ((1, 40), (2, 700), (3, 5000)):
        path = tmp_path_factory.mktemp(f"d{seed}") / "v1.parquet"
        _frame(seed, n).to_parquet(path, index=False)
        write_codes(path, META)
        codes = load_codes(path)
        assert codes is not None
        out[seed] = (pq.read_table(path).to_pandas(), codes)
    return out


def _reply(analysis: dict[str, Any], dataset: LoadedDataset) -> bytes:
    request = RunnerRequest(
        analysis=analysis, metadata=META.model_dump(mode="json"), dataset_path="unused"
    )
    return b"".join(reply_for(request, dataset))


def _analyses() -> st.SearchStrategy[dict[str, Any]]:
    keys = st.lists(st.sampled_from(KEYS), min_size=1, max_size=3, unique=True)
    where = st.sampled_from(WHERE)
    freq = st.builds(
        lambda k, split, m, w: {
            "kind": "frequency_table",
            "rows": k[: max(1, split)],
            "cols": k[max(1, split) :],
            "margins": m,
            "where": w,
        },
        keys,
        st.integers(1, 3),
        st.booleans(),
        where,
    )
    magnitude = st.builds(
        lambda k, agg, m, w: {
            "kind": "magnitude_table",
            "rows": k[:1],
            "cols": k[1:],
            "value": "income",
            "agg": agg,
            "margins": m,
            "where": w,
        },
        keys,
        st.sampled_from(["sum", "mean", "std", "mode"]),
        st.booleans(),
        where,
    )
    histogram = st.builds(
        lambda k, bins, w: {
            "kind": "histogram",
            "variable": "income",
            "bins": bins,
            "by": k[:2],
            "where": w,
        },
        keys,
        st.integers(1, 6),
        where,
    )
    summary = st.builds(
        lambda k, w: {"kind": "summary", "variables": ["income"], "by": k[:2], "where": w},
        keys,
        where,
    )
    chi2 = st.builds(
        lambda k, w: {
            "kind": "test",
            "test": "chi2_independence",
            "rows": k[0],
            "cols": k[1],
            "where": w,
        },
        st.lists(st.sampled_from(KEYS), min_size=2, max_size=2, unique=True),
        where,
    )
    return st.one_of(freq, magnitude, histogram, summary, chi2)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(analysis=_analyses(), seed=st.sampled_from([1, 2, 3]))
def test_codes_give_the_same_reply(
    stored: dict[int, tuple[pd.DataFrame, Any]], analysis: dict[str, Any], seed: int
) -> None:
    frame, codes = stored[seed]
    fresh = _reply(analysis, LoadedDataset(frame))
    on_codes = _reply(analysis, LoadedDataset(frame, codes))
    assert on_codes == fresh


def test_every_grouping_column_is_coded(stored: dict[int, tuple[pd.DataFrame, Any]]) -> None:
    """The differential test above compares something: every key is served from codes, in the
    smallest type, and the continuous column is not coded."""
    codes = stored[3][1]
    assert sorted(codes.columns) == sorted(KEYS)
    assert all(c.codes.dtype == np.int8 for c in codes.columns.values())
    region = codes.columns["region"]
    assert region.levels == REGIONS and region.fixed == len(REGIONS)
    assert codes.columns["sector"].levels[: codes.columns["sector"].fixed] == [
        "mill",
        "shop",
        "farm",
        "x",
    ]
    assert not codes.columns["region"].codes.flags.writeable


def test_codes_of_another_dataset_are_refused(tmp_path: Path) -> None:
    one, two = tmp_path / "a" / "v1.parquet", tmp_path / "b" / "v1.parquet"
    for path, seed in ((one, 4), (two, 5)):
        path.parent.mkdir()
        _frame(seed, 50).to_parquet(path, index=False)
    write_codes(one, META)
    directory = codes_dir(one)
    files = {p.name: __import__("os").open(p, 0) for p in directory.iterdir()}
    with pytest.raises(CodesError, match="another dataset"):
        map_codes(files, sha256_file(two))


def test_altered_codes_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "v1.parquet"
    _frame(6, 50).to_parquet(path, index=False)
    directory = write_codes(path, META)
    manifest = json.loads((directory / MANIFEST).read_text())
    target = directory / manifest["columns"]["region"]["file"]
    target.chmod(0o640)
    data = bytearray(target.read_bytes())
    data[-1] = (data[-1] + 1) % 4
    target.write_bytes(bytes(data))
    with pytest.raises(CodesError, match="region"):
        load_codes(path)


def test_no_codes_is_the_old_path(tmp_path: Path) -> None:
    """A version registered before code arrays existed has none, and its tables still run."""
    path = tmp_path / "v1.parquet"
    _frame(7, 60).to_parquet(path, index=False)
    assert load_codes(path) is None
    frame = pq.read_table(path).to_pandas()
    reply = _reply({"kind": "frequency_table", "rows": ["region"]}, LoadedDataset(frame))
    assert reply == b"".join(
        reply_for(
            RunnerRequest(
                analysis={"kind": "frequency_table", "rows": ["region"]},
                metadata=META.model_dump(mode="json"),
                dataset_path="unused",
            ),
            frame,
        )
    )


def test_keys_come_from_the_codes(stored: dict[int, tuple[pd.DataFrame, Any]]) -> None:
    """Under `using`, a key is the stored codes selected by record position; outside, the column."""
    from safeaccess.rules.tabulate import Coded
    from safeaccess.sandbox.runner.stored_codes import key_for, using

    frame, codes = stored[2]
    picked = frame.loc[frame["income"] > 500]
    with using(codes):
        key = key_for(picked, "region", META)
    assert isinstance(key, Coded)
    expected = codes.columns["region"].codes[picked.index.to_numpy()]
    assert np.array_equal(key.codes, expected)
    assert isinstance(key_for(picked, "region", META), pd.Series)


@settings(max_examples=60, deadline=None)
@given(analysis=_analyses(), seed=st.integers(0, 2**32 - 1), n=st.integers(1, 300))
def test_codes_give_the_same_reply_on_drawn_datasets(
    analysis: dict[str, Any], seed: int, n: int
) -> None:
    """As above, on a dataset drawn for each example (tiny ones included: one record, a level
    that no record has, a column that is all missing)."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "v1.parquet"
        _frame(seed, n).to_parquet(path, index=False)
        write_codes(path, META)
        codes = load_codes(path)
        assert codes is not None
        frame = pq.read_table(path).to_pandas()
        fresh = _reply(analysis, LoadedDataset(frame))
        assert _reply(analysis, LoadedDataset(frame, codes)) == fresh
