"""A generated credit-decision dataset for model training (tests, benchmarks, demos).

Deterministic for a seed: a binary target `approved` that income, age, group and region predict
moderately well (so shallow trees with large leaves are safe to release and deep ones are not),
and a protected attribute `group` with one small group (D, about 2 %)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from safeaccess.client.metadata import Column, DatasetMetadata

GROUPS = ["A", "B", "C", "D"]
REGIONS = ["North", "South", "East", "West"]
OUTCOMES = ["no", "yes"]


def generate_applicants(n: int = 3000, seed: int = 11) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    group = rng.choice(GROUPS, size=n, p=[0.55, 0.3, 0.13, 0.02])
    region = rng.choice(REGIONS, size=n)
    age = rng.integers(18, 80, size=n)
    income = np.round(np.exp(rng.normal(10.2, 0.5, n)), -1)
    z_income = (np.log(income) - 10.2) / 0.5
    z_age = (age - 49) / 18
    logit = -0.2 + 0.9 * z_income + 0.4 * z_age + 0.5 * (group == "A") - 0.3 * (region == "East")
    approved = rng.random(n) < 1.0 / (1.0 + np.exp(-logit))
    return pd.DataFrame(
        {
            "applicant_id": np.arange(1, n + 1, dtype=np.int64),
            "group": pd.Categorical(group, categories=GROUPS),
            "region": pd.Categorical(region, categories=REGIONS),
            "age": age.astype(np.int64),
            "income": income,
            "approved": pd.Categorical(np.where(approved, "yes", "no"), categories=OUTCOMES),
        }
    )


def applicants_metadata(name: str = "applicants") -> DatasetMetadata:
    return DatasetMetadata(
        name=name,
        description="Generated credit applications.",
        record_key="applicant_id",
        columns=[
            Column(name="applicant_id", type="identifier"),
            Column(name="group", type="categorical", levels=list(GROUPS)),
            Column(name="region", type="categorical", levels=list(REGIONS)),
            Column(name="age", type="integer", bounds=(18, 80)),
            Column(name="income", type="continuous", bounds=(0, 1_000_000)),
            Column(name="approved", type="categorical", levels=list(OUTCOMES)),
        ],
    )
