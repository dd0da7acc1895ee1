"""Models that fit single records exactly, attacked through the real server and client.

Each attack picks, from the confidential data the test knows, an age held by one person, filters
the records to that age and one common age, and reads that person's income back from a released
model: the model fits the lone record exactly (its leverage is 1). The leverage check must
withhold every one of them while a regression on all records is still released.
"""

from __future__ import annotations

import itertools

import pandas as pd
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from e2e_helpers import Centre

from safeaccess.client.analyses import Analysis, Correlation, Regression, Summary
from safeaccess.client.keys import fingerprint, public_key_text
from safeaccess.client.results import StepResult
from safeaccess.client.session import connect
from safeaccess.server.http.embedded import EmbeddedServer
from safeaccess.server.service import Service

_FRESH = itertools.count(1)


def _lone_ages(census: pd.DataFrame, how_many: int) -> list[int]:
    """Ages held by exactly one person each (the oldest such ages)."""
    counts = census["age"].value_counts()
    lone = sorted(int(a) for a in counts[counts == 1].index)
    assert len(lone) >= how_many, "the test census needs ages held by one person"
    return lone[-how_many:]


def _common_age(census: pd.DataFrame) -> int:
    """The most frequent working age (many records, many employers behind their incomes)."""
    return int(census.loc[census["age"] < 66, "age"].value_counts().idxmax())


def _income(census: pd.DataFrame, age: int) -> float:
    values = census.loc[census["age"] == age, "income"].to_numpy(float)
    assert values.size == 1
    return float(values[0])


def _run(
    centre: Centre, server: tuple[Service, EmbeddedServer], analyses: list[Analysis]
) -> list[StepResult]:
    """Run as a researcher with no earlier releases, so that each attack stands on its own
    (checks across releases would otherwise see the previous test's outputs)."""
    service, srv = server
    name = f"mallory{next(_FRESH)}"
    key = Ed25519PrivateKey.generate()
    service.store.add_researcher(
        name, public_key_text(key.public_key()), fingerprint(key.public_key()), ["p1"]
    )
    centre.keys[name] = key
    with connect(srv.url, key, name) as session:
        return session.run(centre.seal(analyses, researcher=name))


def _true_causes(service: Service, result: StepResult) -> set[str]:
    """The checks that fired, as the decision record holds them for output checkers (what the
    researcher is shown is decided elsewhere)."""
    step = next(s for s in service.store.steps(result.sequence_id) if s.index == result.index)
    assert step.decision is not None
    return {f["check"] for f in step.decision["findings"] if f["verdict"] == "withhold"}


def _coefficients(result: StepResult) -> dict[str, float]:
    assert result.output is not None
    return {c["term"]: c["estimate"] for c in result.output["coefficients"]}


def test_a_regression_on_two_ages_does_not_give_the_lone_persons_income(
    centre: Centre, server: tuple[Service, EmbeddedServer]
) -> None:
    census = centre.census
    (lone,) = _lone_ages(census, 1)
    common = _common_age(census)
    where = f"age = {common} or age = {lone}"
    (result,) = _run(centre, server, [Regression(formula="income ~ age", where=where)])
    if result.released:  # the leak: intercept + lone x slope is the person's income
        coef = _coefficients(result)
        recovered = coef["Intercept"] + lone * coef["age"]
        assert recovered != pytest.approx(_income(census, lone), rel=1e-6), "income recovered"
    assert result.withheld, result.describe()
    assert _true_causes(server[0], result) == {"leverage"}
    # the audit event records what the decision rested on, not which record
    (event,) = [e for e in server[0].store.events(result.sequence_id) if e.kind == "checks"]
    record = event.data["leverage"]
    assert record["max"] == pytest.approx(1.0, abs=1e-9)
    assert (record["over"], record["limit"]) == (1, pytest.approx(0.1))


def test_a_quadratic_on_three_ages_does_not_give_two_incomes(
    centre: Centre, server: tuple[Service, EmbeddedServer]
) -> None:
    census = centre.census
    lone = _lone_ages(census, 2)
    common = _common_age(census)
    where = f"age = {common} or age = {lone[0]} or age = {lone[1]}"
    formula = "income ~ age + I(age ** 2)"
    (result,) = _run(centre, server, [Regression(formula=formula, where=where)])
    if result.released:
        coef = _coefficients(result)
        for age in lone:
            fitted = coef["Intercept"] + coef["age"] * age + coef["I(age ** 2)"] * age**2
            assert fitted != pytest.approx(_income(census, age), rel=1e-6), "income recovered"
    assert result.withheld, result.describe()
    assert "leverage" in _true_causes(server[0], result)


def test_a_correlation_with_means_and_sds_does_not_give_the_lone_persons_income(
    centre: Centre, server: tuple[Service, EmbeddedServer]
) -> None:
    census = centre.census
    (lone,) = _lone_ages(census, 1)
    common = _common_age(census)
    where = f"age = {common} or age = {lone}"
    # The means and sds the attack needs are themselves withheld now: the lone person holds
    # m/(m + 1) of the age's squared deviations (the spread concentration rule), so their
    # release would tell that exactly one person has that age.
    summary = _run(
        centre,
        server,
        [Summary(variables=["age", "income"], statistics=["count", "mean", "sd"], where=where)],
    )[0]
    assert summary.withheld, summary.describe()
    assert "spread_dominance" in _true_causes(server[0], summary)
    # ... and the correlation on its own is withheld by leverage, whatever else was released
    results = _run(
        centre,
        server,
        [
            Summary(variables=["income"], statistics=["count"], where=where),
            Correlation(variables=["age", "income"], where=where),
        ],
    )
    assert results[0].released, results[0].describe()
    correlation = results[1]
    assert correlation.withheld, correlation.describe()
    assert _true_causes(server[0], correlation) == {"leverage"}


def test_ordinary_models_on_the_census_are_still_released(
    centre: Centre, server: tuple[Service, EmbeddedServer]
) -> None:
    results = _run(
        centre,
        server,
        [
            Regression(formula="log(income) ~ age + I(age ** 2) + C(sex)", where="income > 0"),
            Regression(formula="health ~ age", family="poisson"),
            Correlation(variables=["age", "income", "health"]),
        ],
    )
    assert [r.status for r in results] == ["released"] * 3, [r.describe() for r in results]
    # the Poisson fit: statsmodels' coefficients and likelihood-ratio statistic; the statistics
    # carrying sum log(y!) are named as not released (issue 41)
    import statsmodels.formula.api as smf

    poisson = results[1].output
    assert poisson is not None
    reference = smf.poisson("health ~ age", centre.census.dropna(subset=["health", "age"])).fit(
        disp=0
    )
    assert [c["estimate"] for c in poisson["coefficients"]] == pytest.approx(
        reference.params.to_list(), rel=1e-6
    )
    assert poisson["fit"]["llr"] == pytest.approx(reference.llr, rel=1e-9)
    assert sorted(poisson["fit_withheld"]) == ["aic", "bic", "llf", "llnull", "pseudo_r2"]
    assert "llf" not in poisson["fit"]
