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
from e2e_helpers import Centre, add_people
from scipy.optimize import brentq
from scipy.special import gammaln

from safeaccess.client.analyses import Regression
from safeaccess.client.metadata import Column
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


COLUMNS = [
    Column(name="person_id", type="identifier"),
    Column(name="age", type="integer", bounds=(18, 99)),
    Column(name="income", type="integer", bounds=(0, 200_000)),
]
_registered: dict[tuple[str, str], str] = {}


def register(centre: Centre, mode: str) -> str:
    """One dataset per auditor mode, shared by the guarded and unguarded runs (each dataset
    version starts its own sandbox template, the costly part of a first step)."""
    key = (str(centre.root), mode)
    if key in _registered:
        return _registered[key]
    name = add_people(
        centre.root,
        f"glmpad{next(_names)}",
        DATA,
        COLUMNS,
        QssSettings(mode=mode),  # type: ignore[arg-type]
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


# --- A transformed outcome: `log(income) ~ 1` on a padded set (issue 41, part 2) -------------
#
# The same 400 people, with ten of them on the round salary 150 000 (a pay scale). The filter
# `age == 97 or income between 30000 and 30150 or income == 150000` gives 27 records: the
# target, sixteen companions pinned to the band and ten pinned to one value. The ten give the
# residuals enough spread that no record holds 90 % of them (the spread concentration rule
# passes); their log income is known exactly. OLS releases the mean of log income (the
# intercept) and its sd (the intercept's standard error times sqrt(n)), so with the sixteen's
# sum S_b = A - t and their sum of squares S_b^2 / 16 + (their small spread in the band),
# t + S_b = A and t^2 + S_b^2 / 16 = B give the target's log income to about 1e-5.
LOG_PADDED = "age == 97 or income between 30000 and 30150 or income == 150000"
SALARY = 150_000


def salaried() -> pd.DataFrame:
    frame = people().copy()
    frame.loc[17:26, "income"] = SALARY
    return frame


LOG_DATA = salaried()


def _register_log(centre: Centre) -> str:
    """A dataset of its own per run: the same step asked again of one dataset would be a repeat
    of the earlier release, released as such."""
    return add_people(centre.root, f"logpad{next(_names)}", LOG_DATA, COLUMNS)


def log_target_from(output: dict) -> float:
    """The attacker: the mean and sd of log income from the intercept and its standard error,
    the ten salaries' part exactly, the sixteen's through their band; solve the quadratic."""
    n = int(output["n"])
    b0 = float(output["coefficients"][0]["estimate"])
    se = float(output["coefficients"][0]["std_error"])
    ten = 10 * math.log(SALARY)
    a = n * b0 - ten  # t + S_b
    squares = (n - 1) * (se * math.sqrt(n)) ** 2 + n * b0**2  # sum of y^2
    # the sixteen's spread around their own mean: uniform in the band on average
    inside = 16 * ((math.log(BAND[1]) - math.log(BAND[0])) ** 2 / 12)
    b = squares - 10 * math.log(SALARY) ** 2 - inside  # t^2 + S_b^2 / 16

    def gap(t: float) -> float:
        return t * t + (a - t) ** 2 / 16 - b

    return math.exp(brentq(gap, math.log(BAND[1] + 1), math.log(199_999)))


@pytest.mark.parametrize("fixed", [False, True], ids=["before_the_fix", "deployed"])
def test_a_log_income_model_of_a_padded_set_does_not_give_the_income(
    centre_server: tuple[Centre, EmbeddedServer], monkeypatch: pytest.MonkeyPatch, fixed: bool
) -> None:
    if not fixed:
        # the centre before this fix: a transformed outcome carried no filter bounds
        original = regression_checks.bounded_findings

        def untransformed_only(item: str, stats: dict, vf: object, *args: object) -> list:
            if getattr(vf, "transform", None):
                return []
            return original(item, stats, vf, *args)  # type: ignore[arg-type]

        monkeypatch.setattr(regression_checks, "bounded_findings", untransformed_only)
    centre, srv = centre_server
    name = _register_log(centre)
    with connect(srv.url, centre.keys["ada"], "ada") as session:
        sealed = centre.seal(
            [Regression(formula="log(income) ~ 1", where=LOG_PADDED)], dataset=name
        )
        step = session.run(sealed)[0]
    if not fixed:
        assert step.released and step.output is not None and step.output["n"] == 27
        assert abs(log_target_from(step.output) - TARGET) < 5  # out of a range of 200 000
    else:
        # withheld with the one uniform reason; the run before the fix differs only in the
        # filters-as-bounds check on a transformed outcome, so that is what refuses it
        assert not step.released, step.output
        assert {r.check for r in step.reasons} == {"disclosure_control"}
