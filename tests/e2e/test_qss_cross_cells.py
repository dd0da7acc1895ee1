"""The cross cells of two categorical model terms (issue 41) through the real server and client.

A main-effects model `income ~ C(smoker) + C(sex)` releases coefficients and their standard
errors. The standard errors are the diagonal of sigma^2 (X'X)^-1 (a logit's of (X'WX)^-1, with
W known from the released coefficients), and X'X's off-diagonal entry between the two dummies is
the count of the female smokers: with the two one-way tables (released, or reserved as standard
tables) that is the one unknown, and each standard error gives it. Here 3 women smoke, a cell the
threshold rule would suppress in a smoker x sex table. The same from a logit and a Poisson fit
(W = p(1 - p), or the fitted mean). And X'X's entry of x and x² (Σ x³): `income ~ visits` with
`income ~ visits + I(visits ** 2)` gives the count of the 3 people with 4 visits.

Each attack runs twice, like `test_qss_combination_attacks.py`: with admission replaced by
"admit everything" (the attacker's own arithmetic below must then find the 3) and as deployed
(the model must not be released). A main-effects model whose cross cells are large, and one
on a few-valued numeric regressor beside the categorical term, stay released.
"""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest
from e2e_helpers import Centre, add_people

from safeaccess.client.analyses import Analysis, FrequencyTable, Regression
from safeaccess.client.metadata import Column
from safeaccess.client.session import connect
from safeaccess.server.config import QssSettings
from safeaccess.server.http.embedded import EmbeddedServer

N = 1200
FEMALE_SMOKERS = 3
RARE_VISITS = 3


def population(seed: int = 41) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    sex = np.where(np.arange(N) < N // 2, "F", "M")
    smoker = np.where(rng.random(N) < 0.3, "yes", "no")
    smoker[: N // 2] = "no"  # no woman smokes ...
    smoker[:FEMALE_SMOKERS] = "yes"  # ... but three
    region = rng.choice(["North", "South"], N)
    visits = rng.choice([0, 1, 2, 3], N)
    visits[N - RARE_VISITS :] = 4  # three people visited four times
    return pd.DataFrame(
        {
            "person_id": np.arange(1, N + 1, dtype=np.int64),
            "sex": sex,
            "smoker": smoker,
            "region": region,
            "children": rng.choice([0, 1, 2, 3], N),
            "visits": visits,
            "sick": (rng.random(N) < 0.3).astype(np.int64),
            "income": np.round(rng.uniform(20_000, 60_000, N), 2),
        }
    )


DATA = population()
_names = itertools.count(1)


def register(centre: Centre) -> str:
    name = add_people(
        centre.root,
        f"cross{next(_names)}",
        DATA,
        [
            Column(name="person_id", type="identifier"),
            Column(name="sex", type="categorical", levels=["F", "M"]),
            Column(name="smoker", type="categorical", levels=["no", "yes"]),
            Column(name="region", type="categorical", levels=["North", "South"]),
            Column(name="children", type="integer", bounds=(0, 10)),
            Column(name="visits", type="integer", bounds=(0, 10)),
            Column(name="sick", type="integer", bounds=(0, 1)),
            Column(name="income", type="continuous", bounds=(0, 100_000)),
        ],
        QssSettings(scope="project"),
    )
    return name


def run(centre: Centre, url: str, name: str, analyses: list[Analysis]) -> list[dict | None]:
    with connect(url, centre.keys["ada"], "ada") as session:
        steps = session.run(centre.seal(analyses, dataset=name))
    outputs: list[dict | None] = [s.output if s.released else None for s in steps]
    return outputs + [None] * (len(analyses) - len(outputs))


def one_way(output: dict | None) -> dict[str, int]:
    """A released one-way table's counts by level."""
    assert output is not None
    return {
        str(label[0]): int(row[0])
        for label, row in zip(output["row_labels"], output["values"], strict=True)
    }


def cross_count(
    fit: dict | None, sex: dict[str, int], smoker: dict[str, int], family: str
) -> int | None:
    """The attacker's arithmetic: the count of female smokers that makes the design's
    standard errors those released (every candidate from the margins, the exact fit kept)."""
    if fit is None:
        return None
    coef = {c["term"]: (float(c["estimate"]), float(c["std_error"])) for c in fit["coefficients"]}
    terms = ["Intercept", "C(smoker)[T.yes]", "C(sex)[T.M]"]
    beta = np.array([coef[t][0] for t in terms])
    se = np.array([coef[t][1] for t in terms])
    n = sum(sex.values())
    # the cells' design rows: (smoker yes?, male?)
    patterns = np.array([[1, s, m] for s in (0, 1) for m in (0, 1)], dtype=np.float64)
    if family == "logit":
        p = 1.0 / (1.0 + np.exp(-(patterns @ beta)))
        weight = p * (1.0 - p)
        scale = 1.0
    elif family == "poisson":
        weight, scale = np.exp(patterns @ beta), 1.0
    else:
        weight = np.ones(4)
        rss = n * np.exp(-2.0 * float(fit["fit"]["llf"]) / n - np.log(2 * np.pi) - 1.0)
        scale = rss / (n - 3)
    best: tuple[float, int] | None = None
    for fs in range(0, min(sex["F"], smoker["yes"]) + 1):
        cells = np.array(
            [sex["F"] - fs, smoker["no"] - sex["F"] + fs, fs, smoker["yes"] - fs], dtype=np.float64
        )  # (no, F), (no, M), (yes, F), (yes, M)
        if np.any(cells < 0):
            continue
        xtwx = (patterns * (cells * weight)[:, None]).T @ patterns
        predicted = np.sqrt(scale * np.diag(np.linalg.inv(xtwx)))
        misfit = float(np.max(np.abs(predicted / se - 1.0)))
        if best is None or misfit < best[0]:
            best = (misfit, fs)
    return None if best is None or best[0] > 1e-6 else best[1]


@pytest.fixture(scope="module")
def margins(centre_server: tuple[Centre, EmbeddedServer]) -> tuple[str, dict, dict]:
    """A dataset and its two one-way tables, released (they are ordinary research)."""
    centre, srv = centre_server
    name = register(centre)
    sex, smoker = run(
        centre, srv.url, name, [FrequencyTable(rows=["sex"]), FrequencyTable(rows=["smoker"])]
    )
    return name, one_way(sex), one_way(smoker)


@pytest.mark.parametrize("family", ["ols", "logit", "poisson"])
def test_a_main_effects_model_gives_a_small_cross_cell(
    centre_server: tuple[Centre, EmbeddedServer],
    margins: tuple[str, dict, dict],
    guard: str,
    family: str,
) -> None:
    centre, srv = centre_server
    name, sex, smoker = margins
    assert (sex, smoker["yes"]) == ({"F": N // 2, "M": N // 2}, int((DATA.smoker == "yes").sum()))
    outcome = {"ols": "income", "logit": "sick", "poisson": "children"}[family]
    (fit,) = run(
        centre,
        srv.url,
        name,
        [Regression(formula=f"{outcome} ~ C(smoker) + C(sex)", family=family)],
    )
    found = cross_count(fit, sex, smoker, family)
    if guard == "unguarded":
        assert found == FEMALE_SMOKERS
    else:
        assert fit is None and found is None


def test_main_effects_on_large_cross_cells_stay_released(
    centre_server: tuple[Centre, EmbeddedServer], margins: tuple[str, dict, dict]
) -> None:
    centre, srv = centre_server
    name, _, _ = margins
    # region x sex and region x children cells hold 60 to 310 people each
    assert DATA.groupby(["region", "sex"]).size().min() >= 100
    fits = run(
        centre,
        srv.url,
        name,
        [
            Regression(formula="income ~ C(region) + C(sex)"),
            Regression(formula="sick ~ C(region) + C(sex)", family="logit"),
            Regression(formula="income ~ C(region) + children"),
        ],
    )
    assert all(f is not None for f in fits)


def _fit_design(fit: dict) -> tuple[np.ndarray, float]:
    """The released standard errors and the residual variance of an OLS fit."""
    n = int(fit["n"])
    rss = n * np.exp(-2.0 * float(fit["fit"]["llf"]) / n - np.log(2 * np.pi) - 1.0)
    se = np.array([float(c["std_error"]) for c in fit["coefficients"]])
    return se, rss / (n - len(se))


def rare_group(simple: dict | None, joint: dict | None) -> int | None:
    """The attacker's arithmetic: `income ~ visits` gives n, sum x and sum x^2 (its design's
    moments), `income ~ visits + I(visits ** 2)` the diagonal of the inverse of the moment
    matrix up to x^4; the counts of the five values 0..4 that fit both exactly."""
    if simple is None or joint is None:
        return None
    n = int(simple["n"])
    se1, s1 = _fit_design(simple)
    se2, s2 = _fit_design(joint)
    # y ~ 1 + x: var(slope) = s2 / Sxx, var(intercept) = s2 (1/n + xbar^2 / Sxx)
    sxx = s1 / se1[1] ** 2
    xbar = np.sqrt(max(se1[0] ** 2 / s1 - 1.0 / n, 0.0) * sxx)
    sx, sx2 = n * xbar, sxx + n * xbar**2
    # every (n3, n4); then n0 + n1 + n2, n1 + 2 n2 and n1 + 4 n2 are known
    n3, n4 = (a.ravel() for a in np.meshgrid(np.arange(n + 1.0), np.arange(60.0)))
    n2 = ((sx2 - 9 * n3 - 16 * n4) - (sx - 3 * n3 - 4 * n4)) / 2.0
    n1 = (sx - 3 * n3 - 4 * n4) - 2.0 * n2
    n0 = n - n3 - n4 - n1 - n2
    counts = np.stack([n0, n1, n2, n3, n4], axis=1)
    whole = np.all(counts > -0.5, axis=1) & np.all(np.abs(counts - np.rint(counts)) < 1e-3, axis=1)
    values = np.arange(5.0)
    best: tuple[float, int] | None = None
    for full in np.rint(counts[whole]):
        m = np.array([[full @ values ** (a + b) for b in range(3)] for a in range(3)])
        predicted = np.sqrt(s2 * np.diag(np.linalg.inv(m)))
        misfit = float(np.max(np.abs(predicted / se2 - 1.0)))
        if best is None or misfit < best[0]:
            best = (misfit, int(full[4]))
    return None if best is None or best[0] > 1e-6 else best[1]


def test_x_and_x_squared_in_one_fit_give_a_small_value_group(
    centre_server: tuple[Centre, EmbeddedServer], margins: tuple[str, dict, dict], guard: str
) -> None:
    # X'X of `income ~ visits + I(visits ** 2)` holds sum x^3 (the entry of x and x^2), which
    # the auditor did not see: with `income ~ visits` the five value groups' counts follow
    centre, srv = centre_server
    name, _, _ = margins
    simple, joint = run(
        centre,
        srv.url,
        name,
        [
            Regression(formula="income ~ visits"),
            Regression(formula="income ~ visits + I(visits ** 2)"),
        ],
    )
    assert simple is not None
    found = rare_group(simple, joint)
    assert found == (RARE_VISITS if guard == "unguarded" else None)
