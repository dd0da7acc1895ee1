"""A generalised linear model of a padded set (issue 41, part 2) through the real server and client.

400 people with whole incomes; the target is the only person aged 97 (income 81 234) and
sixteen companions have incomes in 30 000..30 150 (nobody else does). ONE
`poisson("income ~ 1")` on `age == 97 or income between 30000 and 30150` releases:

- the intercept b0 = log(mean), so the total S = 17 exp(b0);
- the log-likelihood llf = S b0 - 17 exp(b0) - sum lgamma(y + 1), so sum lgamma(y + 1).

The filter pins the companions to a 150-wide band, so their share of both sums is known to
within a few units: the total alone puts the target within +-1 200, and sum lgamma(y + 1)
(a convex function of the values, like a sum of squares) leaves one whole income.

`unguarded`: the rules this issue adds for models (the outcome's moments meet the summary rules,
and a Poisson fit's statistics that carry sum lgamma(y + 1) are not released) are switched off in
the server, and the attack extracts the income; `guarded`: the real server gives nothing that
places the income. Both in `span` and in `atoms` mode (a single output: the auditor's mode must
not matter). The attacker's arithmetic is scipy on the released numbers.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd
import pytest
from e2e_helpers import Centre, add_dataset
from scipy.optimize import brentq
from scipy.special import gammaln

from safeaccess.client.analyses import Regression
from safeaccess.client.metadata import Column, DatasetMetadata
from safeaccess.client.session import connect
from safeaccess.rules.checks import regression as regression_checks
from safeaccess.sandbox import release
from safeaccess.server.config import QssSettings
from safeaccess.server.http.embedded import EmbeddedServer

N = 400
TARGET = 81_234
BAND = (30_000, 30_150)
PADDED = "age == 97 or income between 30000 and 30150"


def people(seed: int = 5) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    income = rng.integers(31_000, 79_000, N)
    income[1:17] = rng.integers(BAND[0], BAND[1] + 1, 16)  # the sixteen companions
    income[0] = TARGET
    age = rng.integers(18, 90, N)
    age[0] = 97
    return pd.DataFrame(
        {
            "person_id": np.arange(1, N + 1, dtype=np.int64),
            "age": age,
            "income": income.astype(np.int64),
        }
    )


DATA = people()
_names = itertools.count(1)


_registered: dict[tuple[str, str], str] = {}


def register(centre: Centre, mode: str) -> str:
    """One dataset per auditor mode, shared by the guarded and unguarded runs (each dataset
    version starts its own sandbox template, the costly part of a first step)."""
    key = (str(centre.root), mode)
    if key in _registered:
        return _registered[key]
    name = f"glmpad{next(_names)}"
    meta = DatasetMetadata(
        name=name,
        record_key="person_id",
        columns=[
            Column(name="person_id", type="identifier"),
            Column(name="age", type="integer", bounds=(18, 99)),
            Column(name="income", type="integer", bounds=(0, 200_000)),
        ],
    )
    add_dataset(
        centre.root,
        name=name,
        frame=DATA,
        metadata=meta,
        project="p1",
        qss=QssSettings(mode=mode),  # type: ignore[arg-type]
    )
    _registered[key] = name
    return name


def unguard(monkeypatch: pytest.MonkeyPatch) -> None:
    """The centre before this issue: no summary rules on a model's outcome, every fit statistic
    released."""
    monkeypatch.setattr(regression_checks, "outcome_findings", lambda *a, **k: [])
    monkeypatch.setattr(release, "regression_release_view", lambda output, rs: output)


def target_from(output: dict) -> float | None:
    """The attacker: the total from the intercept, sum lgamma(y + 1) from the log-likelihood,
    the companions' part from their band; solve for the one value outside it."""
    n = int(output["n"])
    b0 = float(output["coefficients"][0]["estimate"])
    llf = output["fit"].get("llf")
    if llf is None:
        return None
    total = n * math.exp(b0)
    lgammas = total * b0 - n * math.exp(b0) - float(llf)
    m = n - 1
    # the companions' sum lgamma(y + 1) given their total s: m lgamma(s/m + 1) plus half their
    # sum of squared deviations over the mean (lgamma'' = 1/y), uniform in the band on average
    spread = m * ((BAND[1] - BAND[0]) ** 2 / 12) / (2 * sum(BAND) / 2)

    def gap(t: float) -> float:
        return float(gammaln(t + 1) + m * gammaln((total - t) / m + 1) + spread - lgammas)

    return float(brentq(gap, BAND[1] + 1.0, 199_999.0))


@pytest.mark.parametrize("mode", ["span", "atoms"])
def test_a_poisson_fit_of_a_padded_set_does_not_give_the_income(
    centre_server: tuple[Centre, EmbeddedServer],
    monkeypatch: pytest.MonkeyPatch,
    guard: str,
    mode: str,
) -> None:
    if guard == "unguarded":
        unguard(monkeypatch)
    centre, srv = centre_server
    name = register(centre, mode)
    with connect(srv.url, centre.keys["ada"], "ada") as session:
        sealed = centre.seal(
            [Regression(formula="income ~ 1", family="poisson", where=PADDED)], dataset=name
        )
        step = session.run(sealed)[0]
    if guard == "unguarded":
        assert step.released and step.output is not None and step.output["n"] == 17
        found = target_from(step.output)
        assert found is not None and round(found) == TARGET
        # the total alone is far less precise: the band leaves +-1 200
        assert (
            abs(
                step.output["n"] * math.exp(step.output["coefficients"][0]["estimate"])
                - DATA["income"].iloc[:17].sum()
            )
            < 1e-3
        )
    else:
        assert not step.released, step.output
