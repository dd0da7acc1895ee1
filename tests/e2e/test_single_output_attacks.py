"""Single-output attacks of issue 20 through the real server and client.

A dataset of 400 people with one target: the only person aged 97, income 81 234.56. Sixteen
companions have incomes in 30 000..30 150 and nobody else does.

- Attack 5, padding by the filtered variable: ONE summary of income on
  `age == 97 or income between 30000 and 30150`. The filter pins the sixteen companions, so
  the count and mean fix the target's income to +-1 200, and the sd to about one unit.
  `unguarded`: the single-output rules this issue adds (the spread concentration rule and the
  bound-aware reconstruction check) are switched off in the server and the attack extracts the
  income; `guarded`: the real server withholds.
- The quantile variant of attack 1: type-1 quantile lists on "C + target" and "C + another"
  used to be lists of exact record values (the target sits at the median position of her
  set); the server now releases windowed quantiles, none of which is a record's value.
- Two outsiders (ages 96 and 97) among the companions: the total and the sd give both.
- The same padding through `income ~ 1`: the residual spread rule withholds it.
- At most 19 quantiles per summary: refused by the client, and by the server when a body
  skips the client's check.
- Benign: ordinary income summaries (a few hundred people, grouped, with quantiles) are
  released.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd
import pytest
import rfc8785
from e2e_helpers import Centre, add_dataset, open_body, signed
from pydantic import ValidationError

from safeaccess.client.analyses import Summary
from safeaccess.client.metadata import Column, DatasetMetadata
from safeaccess.client.protocol import seal
from safeaccess.client.session import connect
from safeaccess.rules.checks import summary as summary_checks
from safeaccess.rules.reconstruction import check as reconstruction_check
from safeaccess.server.http.embedded import EmbeddedServer
from safeaccess.server.qss import admission
from safeaccess.server.qss.gate import Gate

N = 400
REGIONS = ["North", "South", "East", "West"]
TARGET_INCOME = 81_234.56
BAND = (30_000.0, 30_150.0)
PADDED = "age == 97 or income between 30000 and 30150"


def people(seed: int = 5) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    income = np.round(rng.uniform(31_000, 79_000, N), 2)
    income[1:17] = np.round(rng.uniform(*BAND, 16), 2)  # the sixteen companions
    income[0] = TARGET_INCOME
    age = rng.integers(18, 90, N)
    age[0] = 97
    age[17] = 96  # the other person of the quantile swap
    return pd.DataFrame(
        {
            "person_id": np.arange(1, N + 1, dtype=np.int64),
            "region": rng.choice(REGIONS, N),
            "age": age,
            "income": income,
        }
    )


DATA = people()


def metadata(name: str) -> DatasetMetadata:
    return DatasetMetadata(
        name=name,
        record_key="person_id",
        columns=[
            Column(name="person_id", type="identifier"),
            Column(name="region", type="categorical", levels=REGIONS),
            Column(name="age", type="integer", bounds=(18, 99)),
            Column(name="income", type="continuous", bounds=(0, 200_000)),
        ],
    )


_names = itertools.count(1)


def register(centre: Centre, frame: pd.DataFrame) -> str:
    name = f"single{next(_names)}"
    add_dataset(centre.root, name=name, frame=frame, metadata=metadata(name), project="p1")
    return name


def run(centre: Centre, url: str, name: str, analyses: list[Summary]) -> list[dict | None]:
    """One sequence; the released outputs, None for a withheld (or never revealed) step."""
    with connect(url, centre.keys["ada"], "ada") as session:
        steps = session.run(centre.seal(list(analyses), dataset=name))
    out: list[dict | None] = [s.output if s.released else None for s in steps]
    return out + [None] * (len(analyses) - len(out))


def stats_of(output: dict | None) -> dict[str, float] | None:
    if output is None:
        return None
    return dict(output["groups"][0]["variables"][0]["stats"])


def unguard(monkeypatch: pytest.MonkeyPatch) -> None:
    """The centre before this issue's single-output rules (and without the auditor's state)."""
    monkeypatch.setattr(summary_checks, "_spread_findings", lambda *a, **k: [])
    monkeypatch.setattr(reconstruction_check, "bounded_findings", lambda *a, **k: [])
    monkeypatch.setattr(
        admission, "gate", lambda output, decision, **_: Gate(decision, {"admitted": True})
    )


@pytest.fixture(params=["unguarded", "guarded"])
def guard(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "unguarded":
        unguard(monkeypatch)
    return str(request.param)


# ------------------------------------------------------------------------------------- attack 5


def from_count_mean_sd(stats: dict[str, float]) -> float:
    """The target's income from one summary: the sixteen companions are within a 150-wide band,
    so their sum of squares is (their sum)^2 / 16 to within 16 * 75^2; solve
    t^2 + (S - t)^2 / 16 = Q for the root above the band."""
    n, mean, sd = stats["count"], stats["mean"], stats["sd"]
    s = n * mean
    q = (n - 1) * sd**2 + n * mean**2
    m = n - 1
    # (1 + 1/m) t^2 - (2 S / m) t + S^2 / m - Q = 0
    a, b, c = 1 + 1 / m, -2 * s / m, s * s / m - q
    return (-b + math.sqrt(b * b - 4 * a * c)) / (2 * a)


def test_padding_by_the_filtered_variable_count_mean_sd(
    centre_server: tuple[Centre, EmbeddedServer], guard: str
) -> None:
    centre, srv = centre_server
    name = register(centre, DATA)
    analysis = Summary(variables=["income"], statistics=["count", "mean", "sd"], where=PADDED)
    stats = stats_of(run(centre, srv.url, name, [analysis])[0])
    if guard == "unguarded":
        assert stats is not None and stats["count"] == 17
        assert abs(from_count_mean_sd(stats) - TARGET_INCOME) < 2.0
    else:
        assert stats is None


def test_padding_by_the_filtered_variable_count_and_mean(
    centre_server: tuple[Centre, EmbeddedServer], guard: str
) -> None:
    # no spread statistic at all: the bound-aware reconstruction check alone must stop it
    centre, srv = centre_server
    name = register(centre, DATA)
    analysis = Summary(variables=["income"], statistics=["count", "mean"], where=PADDED)
    stats = stats_of(run(centre, srv.url, name, [analysis])[0])
    if guard == "unguarded":
        assert stats is not None
        estimate = stats["count"] * stats["mean"] - 16 * sum(BAND) / 2
        assert abs(estimate - TARGET_INCOME) <= 16 * (BAND[1] - BAND[0]) / 2  # within 1.5 %
    else:
        assert stats is None


# ---------------------------------------------------------------------- quantiles (attack 1)


def swap_sets() -> tuple[str, str]:
    """C + target and C + the 96-year-old; C is everyone outside the North under 80 (not 90:
    every scope reserves the region table, and "outside the North" less one of its two people
    over 89 would isolate the other)."""
    base = "region != 'North' and age < 80"
    return f"({base}) or age == 97", f"({base}) or age == 96"


def test_type1_quantiles_no_longer_release_record_values(
    centre_server: tuple[Centre, EmbeddedServer],
) -> None:
    centre, srv = centre_server
    # put the target at the median position of "C + target": a type-1 list then holds her
    # exact income, as it did before this issue
    frame = DATA.copy()
    with_target, with_other = swap_sets()
    c_incomes = np.sort(frame.query("region != 'North' and age < 80")["income"].to_numpy())
    k = math.ceil((c_incomes.size + 1) / 2)  # her rank among C + target
    frame.loc[0, "income"] = round((c_incomes[k - 2] + c_incomes[k - 1]) / 2, 2)
    target = float(frame.loc[0, "income"])
    probs = [round(0.05 * j, 2) for j in range(1, 20)]
    old_lists = [
        np.quantile(frame.query(w)["income"].to_numpy(), probs, method="inverted_cdf")
        for w in (with_target, with_other)
    ]
    # the old definition: the median of "C + target" is her income, and every entry is a
    # record's value
    assert target in set(old_lists[0].tolist()) - set(old_lists[1].tolist())
    assert set(old_lists[0].tolist()) <= set(frame["income"].tolist())

    name = register(centre, frame)
    analyses = [
        Summary(
            variables=["income"],
            statistics=["count", "quantiles"],
            quantiles=probs,
            quantile_type=1,
            where=w,
        )
        for w in (with_target, with_other)
    ]
    outputs = run(centre, srv.url, name, analyses)
    released = [stats_of(o) for o in outputs]
    assert released[0] is not None  # an ordinary request: released
    values = {v for s in released if s for k_, v in s.items() if k_.startswith("q")}
    assert len([k_ for k_ in released[0] if k_.startswith("q")]) == 19
    assert target not in values
    assert not values & set(frame["income"].tolist())


def test_more_than_19_quantiles_are_refused(centre_server: tuple[Centre, EmbeddedServer]) -> None:
    centre, srv = centre_server
    name = register(centre, DATA)
    probs = [round(0.04 * j, 2) for j in range(1, 25)]
    with pytest.raises(ValidationError, match="at most 19 quantiles"):
        Summary(variables=["income"], statistics=["quantiles"], quantiles=probs)
    # a body that skips the client's check: the server refuses the step, naming the limit
    body = {
        "kind": "summary",
        "variables": ["income"],
        "statistics": ["quantiles"],
        "quantiles": probs,
    }
    sealed = seal(
        [rfc8785.dumps(body)],
        centre.keys["ada"],
        researcher="ada",
        project="p1",
        dataset=name,
        server=centre.server_id,
    )
    response = signed(
        srv.url, centre.keys["ada"], "ada", "POST", "/v1/sequences", open_body(sealed)
    )
    step = response.json()
    assert step["state"] == "failed" and step["output"] is None, step
    assert step["error"]["code"] == "invalid_analysis"
    assert "at most 19 quantiles" in step["error"]["message"]


# ------------------------------------------------------------------------------------- benign


def test_ordinary_income_summaries_are_released(
    centre_server: tuple[Centre, EmbeddedServer],
) -> None:
    centre, srv = centre_server
    name = register(centre, DATA)
    probs = [0.1, 0.25, 0.5, 0.75, 0.9]
    analyses = [
        Summary(
            variables=["income"],
            statistics=["count", "mean", "sd", "median", "quantiles"],
            quantiles=probs,
        ),
        Summary(
            variables=["income"],
            statistics=["count", "mean", "sd", "quantiles"],
            quantiles=[0.25, 0.5, 0.75],  # about 100 per region: the 10 % ends rest on < 10
            by=["region"],
        ),
        Summary(variables=["income"], statistics=["count", "mean", "sd"], where="income > 40000"),
    ]
    outputs = run(centre, srv.url, name, analyses)
    assert all(o is not None for o in outputs), outputs
    whole = stats_of(outputs[0])
    assert whole is not None
    assert whole["count"] == N
    assert whole["mean"] == pytest.approx(DATA["income"].mean())
    ordered = np.sort(DATA["income"].to_numpy())
    # type 7 median position 200.5 -> the mean of order statistics 196..205
    assert whole["median"] == pytest.approx(ordered[195:205].mean())


def test_padding_through_an_intercept_only_regression(
    centre_server: tuple[Centre, EmbeddedServer], monkeypatch: pytest.MonkeyPatch, guard: str
) -> None:
    # `income ~ 1` is a count, mean and sd in another form: estimate = mean, se = sd / sqrt(n)
    from safeaccess.client.analyses import Regression
    from safeaccess.rules import engine
    from safeaccess.rules.checks import regression as regression_checks

    if guard == "unguarded":
        original = engine.regression_findings

        def without_spread(output, rs):  # type: ignore[no-untyped-def]
            return [f for f in original(output, rs) if f.check != "spread_dominance"]

        monkeypatch.setattr(engine, "regression_findings", without_spread)
        # and without the summary rules on the outcome (issue 41), which catch it as well
        monkeypatch.setattr(regression_checks, "outcome_findings", lambda *a, **k: [])
    centre, srv = centre_server
    name = register(centre, DATA)
    with connect(srv.url, centre.keys["ada"], "ada") as session:
        sealed = centre.seal([Regression(formula="income ~ 1", where=PADDED)], dataset=name)
        step = session.run(sealed)[0]
    if guard == "unguarded":
        assert step.released and step.output is not None
        coef = step.output["coefficients"][0]
        n = step.output["n"]
        stats = {"count": n, "mean": coef["estimate"], "sd": coef["std_error"] * math.sqrt(n)}
        assert abs(from_count_mean_sd(stats) - TARGET_INCOME) < 2.0
    else:
        assert not step.released


def test_two_outsiders_padded_by_the_filtered_variable(
    centre_server: tuple[Centre, EmbeddedServer], guard: str
) -> None:
    # the target (97) and the 96-year-old among the 16 companions: the total gives a + b, the
    # sd a^2 + b^2, so both incomes follow (which is whose is the only thing left open)
    centre, srv = centre_server
    name = register(centre, DATA)
    where = "age >= 96 or income between 30000 and 30150"
    analysis = Summary(variables=["income"], statistics=["count", "mean", "sd"], where=where)
    stats = stats_of(run(centre, srv.url, name, [analysis])[0])
    truth = sorted(DATA.query("age >= 96")["income"].tolist())
    if guard == "unguarded":
        assert stats is not None and stats["count"] == 18
        n, mean, sd = stats["count"], stats["mean"], stats["sd"]
        mid = sum(BAND) / 2
        pair_sum = n * mean - 16 * mid
        pair_squares = (n - 1) * sd**2 + n * mean**2 - 16 * mid**2
        gap = math.sqrt(max(2 * pair_squares - pair_sum**2, 0.0))
        found = sorted([(pair_sum - gap) / 2, (pair_sum + gap) / 2])
        for estimate, value in zip(found, truth, strict=True):
            assert abs(estimate - value) < 0.03 * value
    else:
        assert stats is None


# --------------------------------------------------------------------- a mode held by one record


def test_a_mode_held_by_one_record_is_not_a_value_released(
    centre_server: tuple[Centre, EmbeddedServer], monkeypatch: pytest.MonkeyPatch, guard: str
) -> None:
    # every income is distinct, so the modal value is held by one record and, ties going to the
    # smallest value, it is the lowest income: the raw minimum the extremes rule withholds
    if guard == "unguarded":
        monkeypatch.setattr(summary_checks, "_mode_findings", lambda *a, **k: [])
    assert DATA["income"].is_unique
    centre, srv = centre_server
    name = register(centre, DATA)
    analysis = Summary(variables=["income"], statistics=["count", "mode"], by=["region"])
    output = run(centre, srv.url, name, [analysis])[0]
    if guard == "unguarded":
        assert output is not None
        released = {g["labels"][0]: g["variables"][0]["stats"]["mode"] for g in output["groups"]}
        lowest = DATA.groupby("region")["income"].min().to_dict()
        assert released == pytest.approx(lowest)
    else:
        assert output is None


def test_a_mode_shared_by_many_records_is_released(
    centre_server: tuple[Centre, EmbeddedServer],
) -> None:
    centre, srv = centre_server
    frame = DATA.copy()
    frame["age"] = 18 + (frame["person_id"] % 5)  # each age held by 80 people
    frame.loc[frame["person_id"] <= 100, "age"] = 40  # 40 is the mode, held by 100
    name = register(centre, frame)
    analysis = Summary(variables=["age"], statistics=["count", "mode"])
    stats = stats_of(run(centre, srv.url, name, [analysis])[0])
    assert stats is not None
    assert stats["mode"] == float(frame["age"].mode().iloc[0])
