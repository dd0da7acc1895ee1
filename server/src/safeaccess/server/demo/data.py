"""A generated census-like confidential dataset for the demo, benchmarks and tests.

Deterministic for a given seed. The distributions are plausible rather than realistic: what matters
is that ordinary analyses are safe to release while some (e.g. a rare ethnic group by region) fall
below the threshold and must be withheld.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from safeaccess.client.metadata import Column, DatasetMetadata

REGIONS = ["North", "North East", "East", "South East", "South", "South West", "West", "Capital"]
SEXES = ["F", "M"]
ETHNICITIES = ["White", "Asian", "Black", "Mixed", "Other", "Traveller"]
# "Traveller" is rare on purpose: cross-tabulated by region it yields cells below 10.
_ETHNICITY_P = [0.78, 0.09, 0.06, 0.035, 0.032, 0.003]
EMPLOYMENT = ["employed", "unemployed", "inactive", "retired"]
_REGION_P = [0.10, 0.08, 0.12, 0.16, 0.11, 0.10, 0.09, 0.24]


def generate_census(n: int = 20_000, seed: int = 20221012) -> pd.DataFrame:
    """Return `n` synthetic people: region, sex, age, ethnicity, health, employment, employer, income."""
    if n < 1:
        raise ValueError("n must be at least 1")
    rng = np.random.default_rng(seed)
    region = rng.choice(REGIONS, size=n, p=_REGION_P)
    sex = rng.choice(SEXES, size=n)
    age = np.clip(rng.gamma(shape=6.0, scale=7.0, size=n).round().astype(np.int64) + 16, 16, 95)
    # A census reaches the youngest declared ages too (the gamma above leaves nobody under 19,
    # which made `age >= 18` a filter that removes nobody): 2 % of people are 16 to 18, drawn
    # from a stream of their own so every other column stays as it was.
    young_rng = np.random.default_rng([seed, 16])
    young = young_rng.random(n) < 0.02
    age[young] = young_rng.integers(16, 19, size=int(young.sum()))
    ethnicity = rng.choice(ETHNICITIES, size=n, p=_ETHNICITY_P)

    # Employment depends on age: retired past 66, otherwise mostly employed.
    u = rng.random(n)
    employment = np.where(
        age >= 66,
        np.where(u < 0.85, "retired", "inactive"),
        np.where(u < 0.74, "employed", np.where(u < 0.80, "unemployed", "inactive")),
    )
    # Health score 1 (very bad) .. 5 (very good), declining with age.
    latent = 4.2 - 0.025 * (age - 16) + rng.normal(0.0, 0.9, n)
    health = np.clip(np.rint(latent), 1, 5).astype(np.int64)

    # Employers: a few large ones dominate (relevant to dominance checks on magnitude tables).
    n_employers = max(1, n // 40)
    weights = 1.0 / np.arange(1, n_employers + 1) ** 1.1
    employer = rng.choice(n_employers, size=n, p=weights / weights.sum()) + 1000
    employed = employment == "employed"

    base = np.exp(rng.normal(10.2, 0.55, n))
    age_effect = 1.0 + 0.02 * np.minimum(age - 16, 30)
    sex_effect = np.where(sex == "M", 1.12, 1.0)
    income = np.where(
        employed,
        base * age_effect * sex_effect,
        np.where(employment == "retired", base * 0.55, base * 0.25),
    ).round(-1)

    return pd.DataFrame(
        {
            "person_id": np.arange(1, n + 1, dtype=np.int64),
            "region": pd.Categorical(region, categories=REGIONS),
            "sex": pd.Categorical(sex, categories=SEXES),
            "age": age,
            "ethnicity": pd.Categorical(ethnicity, categories=ETHNICITIES),
            "health": health,
            "employment": pd.Categorical(employment, categories=EMPLOYMENT),
            "employer_id": pd.Series(employer, dtype="Int64").mask(~employed),
            "income": income,
        }
    )


def census_metadata(name: str = "census") -> DatasetMetadata:
    """The metadata researchers see for the generated census (never the data)."""
    return DatasetMetadata(
        name=name,
        description="Synthetic census-like microdata: one row per person aged 16-95.",
        record_key="person_id",
        columns=[
            Column(name="person_id", type="identifier", description="Person number"),
            Column(name="region", type="categorical", levels=list(REGIONS)),
            Column(name="sex", type="categorical", levels=list(SEXES)),
            Column(name="age", type="integer", bounds=(16, 95), unit="years"),
            Column(name="ethnicity", type="categorical", levels=list(ETHNICITIES)),
            Column(
                name="health",
                type="ordinal",
                levels=[1, 2, 3, 4, 5],
                scale=(1, 5),
                description="Self-rated health, 1 = very bad .. 5 = very good",
            ),
            Column(name="employment", type="categorical", levels=list(EMPLOYMENT)),
            Column(
                name="employer_id",
                type="identifier",
                contributor=True,
                description="Employer of employed people (contributor unit for dominance checks)",
            ),
            Column(name="income", type="continuous", bounds=(0, 2_000_000), unit="EUR per year"),
        ],
    )
