"""The reference suite's data and centre: one small centre: a generated dataset with what trips analyses up
(missing values (incomes, smokers), exact zeros, categorical 0/1 columns, a small group), registered twice (rule-
checked and with differential privacy), behind one real server for the whole module.

The references are computed here on the raw frame with pandas, statsmodels, scipy, lifelines
and scikit-learn, never with the code under test.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from safeaccess.client.analyses import Analysis, to_body
from safeaccess.client.metadata import Column, DatasetMetadata
from safeaccess.client.protocol import seal
from safeaccess.client.results import StepResult
from safeaccess.client.session import connect

ROWS = 3000
REGIONS = ["north", "south", "east", "west", "isles"]
INCOME_BOUNDS = (0.0, 250_000.0)


def make_frame(rows: int = ROWS, seed: int = 42) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    region = rng.choice(REGIONS, size=rows, p=[0.38, 0.3, 0.2, 0.1, 0.02])  # isles: ~60
    sex = rng.choice(["F", "M"], size=rows)
    age = rng.integers(18, 91, size=rows)
    employed = (rng.random(rows) < 0.35 + 0.006 * (age - 18)).astype(int)
    income = np.exp(rng.normal(10.3, 0.5, rows)) * (1 + 0.1 * (sex == "M")) + 300 * (age - 18)
    income = np.minimum(income, 240_000.0).round(2)
    income[rng.random(rows) < 0.06] = 0.0  # exact zeros
    income_missing = rng.random(rows) < 0.05
    visits = rng.poisson(np.exp(0.2 + 0.012 * (age - 18)))
    hazard = 0.0015 * np.exp(0.02 * (age - 50) + 0.3 * (sex == "M"))
    time = np.ceil(rng.exponential(1 / hazard)).astype(int)
    censor = rng.integers(30, 1500, size=rows)
    died = (time <= censor).astype(int)
    days = np.minimum(np.minimum(time, censor), 1500)
    frame = pd.DataFrame(
        {
            "person_id": [f"p{i:05d}" for i in range(rows)],
            "region": pd.Categorical(region, categories=REGIONS),
            "sex": pd.Categorical(sex, categories=["F", "M"]),
            "age": age.astype("int64"),
            "employed": employed.astype("int64"),
            "income": pd.Series(income).mask(income_missing),
            "visits": visits.astype("int64"),
            "days": days.astype("int64"),
            "died": died.astype("int64"),
        }
    )
    # Drawn last, so the columns above are those the rest of the suite was written for: a
    # grouping column with missing values (about 8 %), for the missing counts of every kind.
    smoker = rng.choice(["no", "yes"], size=rows, p=[0.7, 0.3])
    frame["smoker"] = pd.Categorical(
        pd.Series(smoker).mask(rng.random(rows) < 0.08), categories=["no", "yes"]
    )
    return frame


def metadata(name: str) -> DatasetMetadata:
    return DatasetMetadata(
        name=name,
        description="Generated survey for the reference suite.",
        record_key="person_id",
        columns=[
            Column(name="person_id", type="identifier"),
            Column(name="region", type="categorical", levels=list(REGIONS)),
            Column(name="sex", type="categorical", levels=["F", "M"]),
            Column(name="age", type="integer", bounds=(16, 95)),
            Column(name="employed", type="categorical", levels=[0, 1]),
            Column(name="income", type="continuous", bounds=INCOME_BOUNDS),
            Column(name="visits", type="integer", bounds=(0, 60)),
            Column(name="days", type="integer", bounds=(0, 1500)),
            Column(name="died", type="categorical", levels=[0, 1]),
            Column(name="smoker", type="categorical", levels=["no", "yes"]),
        ],
    )


#: One researcher per test, so that one test's query sets (audited per researcher across
#: sequences) cannot make another's refused.
RESEARCHERS = [f"r{i:02d}" for i in range(24)]


@dataclass
class Fidelity:
    root: Path
    server_id: str
    keys: dict[str, Ed25519PrivateKey]
    frame: pd.DataFrame
    url: str
    free: list[str]

    def run(
        self, analyses: list[Analysis], dataset: str = "survey", researcher: str | None = None
    ) -> list[StepResult]:
        who = researcher or self.free.pop()
        sealed = seal(
            [to_body(a) for a in analyses],
            self.keys[who],
            researcher=who,
            project="p1",
            dataset=dataset,
            server=self.server_id,
        )
        with connect(self.url, self.keys[who], who) as session:
            return session.run(sealed)
