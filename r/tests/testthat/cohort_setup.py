"""The R suite's survival dataset `cohort`, registered in the demo centre before it serves
(`sa_demo_centre(setup = ...)` calls `setup(data_dir)`): the cohort of tests/e2e/test_survival.py,
two arms of 514 and 480 patients whose curve pooled in 90-day steps up to day 720 is released."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from safeaccess.client.metadata import DatasetMetadata

METADATA = DatasetMetadata.model_validate(
    {
        "name": "cohort",
        "record_key": "patient",
        "columns": [
            {"name": "patient", "type": "identifier"},
            {"name": "arm", "type": "categorical", "levels": ["a", "b"]},
            {"name": "days", "type": "continuous", "bounds": [0, 2000], "unit": "days"},
            {"name": "died", "type": "integer", "bounds": [0, 1]},
        ],
    }
)


def cohort() -> pd.DataFrame:
    """Per arm and quarter (90 days): 40 deaths and 20 censored; 60 followed past day 900;
    arm a also has 4 deaths at day 1000 and 30 censored later."""
    days: list[float] = []
    died: list[int] = []
    arm: list[str] = []
    for a in ("a", "b"):
        for k in range(1, 9):
            days += [90.0 * k - 45] * 40 + [90.0 * k - 10] * 20
            died += [1] * 40 + [0] * 20
            arm += [a] * 60
        days += [900.0] * 60
        died += [0] * 60
        arm += [a] * 60
    days += [1000.0] * 4 + [1100.0] * 30
    died += [1] * 4 + [0] * 30
    arm += ["a"] * 34
    n = len(days)
    return pd.DataFrame(
        {
            "patient": np.arange(1, n + 1, dtype=np.int64),
            "arm": pd.Categorical(arm, categories=["a", "b"]),
            "days": days,
            "died": died,
        }
    )


def setup(root: Path) -> None:
    # The server's modules only here: the R suite also imports this file for `cohort()`.
    from safeaccess.server.config import DataDir
    from safeaccess.server.datasets import register_dataset
    from safeaccess.server.demo.run import PROJECT
    from safeaccess.server.store import Store

    data = DataDir(root)
    store = Store(data.database_url(data.load_config()))
    try:
        register_dataset(
            data, store, name="cohort", frame=cohort(), metadata=METADATA, project=PROJECT
        )
    finally:
        store.close()
