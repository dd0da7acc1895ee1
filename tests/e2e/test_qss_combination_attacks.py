"""The combination attacks of issue 20 through the real server and client.

Each attack combines outputs that each pass every single-output check into one person's exact
income (or, for the public row count, the size of a group of one). Like `test_trackers.py`, each
runs twice against the same real centre:

- `unguarded`: the server's admission step is replaced by one that admits everything: the attack
  must extract the true value, which proves the attack is real and that the test sees it;
- `guarded`: the real server: nothing released may let the researcher derive that value.

The extraction arithmetic below is the attacker's own (numpy on the released numbers and the
published catalogue), independent of the server's code. Attacks the server does not stop yet are
marked xfail(strict=True) with the part of issue 20 that closes them, so the suite flips loudly
when that part lands.

1. signed swaps: "C + person 1" and "C + person 2" (count/mean/sd; a regression income ~ age)
   determine the difference of two people, and then both values (the type-1 quantile variant is
   in `test_single_output_attacks.py`: quantiles are now windowed and at most 19 per summary);
2. a union of four one-record atoms, determined by three sets: count, mean, sd, skewness and
   kurtosis give the power sums of the four incomes, Newton's identities the incomes;
3. `income ~ C(sex) + age` on two sets: the men's totals differ by one man;
4. regressions on one set with x, x^2 and x^3 of a few-valued column: each value group's total;
   and (issue 41, weighted rows) one such fit with the totals of its lower groups, or with the
   same fit on the set without its top groups;
5. padding by the filtered variable: in `test_single_output_attacks.py` (a single output's
   rules close it, so its unguarded run disables those rules instead of the admission);
6. refusal as an oracle: a binary search with one-step probes on
   `age < 90 or (age >= 96 and income > X)`;
7. the public row count: a count of `age < 96` against the catalogue's row count.

The benign side: a whole-population table stays released after a colleague's release.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pytest
from e2e_helpers import Centre, add_dataset

from safeaccess.client.analyses import (
    Analysis,
    FrequencyTable,
    Histogram,
    Regression,
    Summary,
)
from safeaccess.client.metadata import Column, DatasetMetadata
from safeaccess.client.session import connect
from safeaccess.server.config import QssSettings, Scope
from safeaccess.server.http.embedded import EmbeddedServer

N = 3000
REGIONS = ["North", "South", "East", "West"]
OCCUPATIONS = ["clerk", "nurse", "teacher", "driver"]
# the incomes of the people the attacks single out (all distinct, inside the bulk's range)
SWAP = {90: 41_234.56, 91: 37_654.32}
FOUR = {92: 25_111.11, 93: 33_222.22, 94: 47_333.33, 95: 56_444.44}
OLDEST = 81_234.56  # the one person aged 97
BAND = (30_000.0, 30_150.0)  # attack 5's filter on income


def population(*, old_bulk: bool, seed: int = 20) -> pd.DataFrame:
    """N people with known targets.

    `old_bulk=False`: ages 18..79, plus the swap pair (90, 91, men, North excluded) and four
    people aged 92..95 with one occupation each; every child count is 0, 1 or 3 except the
    90-year-old's (2). `old_bulk=True`: ages 18..95 (many aged 90..95), one person aged 97 (the
    only one over 95), and 16 people with an income in BAND (no one else is in it).
    """
    rng = np.random.default_rng(seed)
    income = np.round(rng.uniform(20_500, 59_500, N), 2)
    # nobody but the planted companions falls in BAND
    inside = (income >= BAND[0] - 1) & (income <= BAND[1] + 1)
    income[inside] += 500.0
    frame = pd.DataFrame(
        {
            "person_id": np.arange(5001, 5001 + N, dtype=np.int64),
            "region": rng.choice(REGIONS, N),
            "sex": rng.choice(["F", "M"], N),
            "occupation": rng.choice(OCCUPATIONS, N),
            "age": rng.integers(18, 96 if old_bulk else 80, N),
            "children": rng.choice([0, 1, 3], N),
            "income": income,
        }
    )
    if old_bulk:
        frame.loc[0, ["age", "income"]] = [97, OLDEST]
        band = np.round(rng.uniform(BAND[0], BAND[1], 16), 2)
        for i, value in enumerate(band, start=1):
            frame.loc[i, "income"] = value
            frame.loc[i, "age"] = min(int(frame.loc[i, "age"]), 95)
    else:
        for i, (age, value) in enumerate(SWAP.items()):
            frame.loc[i, ["age", "income", "sex", "region"]] = [age, value, "M", "South"]
        frame.loc[0, "children"] = 2
        for i, ((age, value), job) in enumerate(zip(FOUR.items(), OCCUPATIONS, strict=True)):
            frame.loc[10 + i, ["age", "income", "occupation"]] = [age, value, job]
    return frame


def metadata(name: str) -> DatasetMetadata:
    return DatasetMetadata(
        name=name,
        record_key="person_id",
        columns=[
            Column(name="person_id", type="identifier"),
            Column(name="region", type="categorical", levels=REGIONS),
            Column(name="sex", type="categorical", levels=["F", "M"]),
            Column(name="occupation", type="categorical", levels=OCCUPATIONS),
            Column(name="age", type="integer", bounds=(18, 100)),
            Column(name="children", type="integer", bounds=(0, 10)),
            Column(name="income", type="continuous", bounds=(0, 100_000)),
        ],
    )


YOUNG = population(old_bulk=False)
OLD = population(old_bulk=True)


def income_of(frame: pd.DataFrame, condition: str) -> float:
    matched = frame.query(condition)
    assert len(matched) == 1
    return float(matched["income"].iloc[0])


# ---------------------------------------------------------------------------------- the centre

_names = itertools.count(1)


def register(
    centre: Centre, frame: pd.DataFrame, name: str | None = None, scope: Scope = "project"
) -> str:
    """Register `frame` as the next version of `name` (default: version 1 of a fresh name) in
    project p1, audited in `scope`; return the name."""
    name = name or f"combo{next(_names)}"
    add_dataset(
        centre.root,
        name=name,
        frame=frame,
        metadata=metadata(name),
        project="p1",
        qss=QssSettings(scope=scope),
    )
    return name


def run(
    centre: Centre, url: str, name: str, analyses: list[Analysis], researcher: str = "ada"
) -> list[dict | None]:
    """One sequence of the analyses: the released outputs, None for the others."""
    with connect(url, centre.keys[researcher], researcher) as session:
        steps = session.run(centre.seal(analyses, researcher=researcher, dataset=name))
    outputs: list[dict | None] = [s.output if s.released else None for s in steps]
    return outputs + [None] * (len(analyses) - len(outputs))


def run_each(centre: Centre, url: str, name: str, analyses: list[Analysis]) -> list[dict | None]:
    """Each analysis as a one-step sequence of its own."""
    return [run(centre, url, name, [a])[0] for a in analyses]


def close(value: float | None, secret: float, tol: float = 0.01) -> bool:
    return value is not None and math.isclose(value, secret, rel_tol=0.0, abs_tol=tol)


# ------------------------------------------------------------- reading released numbers back


@dataclass(frozen=True)
class Moments:
    """n and the central sums M_j = sum (y - mean)^j (j = 2, 3, 4; None when not asked)."""

    n: int
    mean: float
    m2: float
    m3: float | None = None
    m4: float | None = None

    def power_sums(self, centre: float, top: int) -> np.ndarray:
        """sum (y - centre)^j for j = 0..top, from the central sums (binomial expansion)."""
        central = [float(self.n), 0.0, self.m2, self.m3, self.m4]
        shift = self.mean - centre
        return np.array(
            [
                sum(math.comb(j, i) * central[i] * shift ** (j - i) for i in range(j + 1))  # type: ignore[operator]
                for j in range(top + 1)
            ]
        )


def stats_of(output: dict) -> dict[str, float]:
    return dict(output["groups"][0]["variables"][0]["stats"])


def moments(output: dict | None) -> Moments | None:
    """Invert count, mean, sd (and G1 skewness, G2 excess kurtosis when released)."""
    if output is None:
        return None
    s = stats_of(output)
    n = int(s["count"])
    m2 = (n - 1) * float(s["sd"]) ** 2
    m3 = m4 = None
    if s.get("skewness") is not None:
        g1 = float(s["skewness"]) * (n - 2) / math.sqrt(n * (n - 1))
        m3 = g1 * (m2 / n) ** 1.5 * n
    if s.get("kurtosis") is not None:
        g2 = (float(s["kurtosis"]) * (n - 2) * (n - 3) / (n - 1) - 6) / (n + 1)
        m4 = (g2 + 3) * (m2 / n) ** 2 * n
    return Moments(n=n, mean=float(s["mean"]), m2=m2, m3=m3, m4=m4)


@dataclass(frozen=True)
class Simple:
    """What one OLS fit y ~ 1 + z gives back: n, sum z, sum z^2, sum y, sum y^2, sum z y."""

    n: int
    sz: float
    szz: float
    sy: float
    syy: float
    szy: float


def coefficients(output: dict) -> dict[str, tuple[float, float]]:
    return {
        c["term"]: (float(c["estimate"]), float(c["std_error"])) for c in output["coefficients"]
    }


def ssr(output: dict) -> float:
    """The residual sum of squares from the Gaussian log-likelihood."""
    n = int(output["n"])
    return n * math.exp(-2.0 * float(output["fit"]["llf"]) / n - math.log(2 * math.pi) - 1.0)


def simple(output: dict | None, term: str) -> Simple | None:
    """Invert a released simple regression y ~ z (z >= 0 on every record)."""
    if output is None:
        return None
    n = int(output["n"])
    coef = coefficients(output)
    (a, se_a), (b, se_b) = coef["Intercept"], coef[term]
    rss = ssr(output)
    s2 = rss / (n - 2)
    sxx = s2 / se_b**2  # centred sum of squares of z
    zbar = math.sqrt(max(se_a**2 / s2 - 1.0 / n, 0.0) * sxx)
    ybar = a + b * zbar
    sst = rss / (1.0 - float(output["fit"]["r2"]))
    return Simple(
        n=n,
        sz=n * zbar,
        szz=sxx + n * zbar**2,
        sy=n * ybar,
        syy=sst + n * ybar**2,
        szy=b * sxx + n * zbar * ybar,
    )


# ------------------------------------------------------------------------ 1. signed swaps

C = "(region == 'North' and age < 80)"
SWAP_SETS = [f"{C} or age == 90", f"{C} or age == 91"]


def both_from_differences(d1: float, d2: float) -> tuple[float, float]:
    """y1, y2 from y1 - y2 = d1 and y1^2 - y2^2 = d2."""
    plus = d2 / d1
    return (plus + d1) / 2.0, (plus - d1) / 2.0


def swap_secrets() -> tuple[float, float]:
    return income_of(YOUNG, "age == 90"), income_of(YOUNG, "age == 91")


def assert_swap(guard: str, found: tuple[float, float] | None) -> None:
    secrets = swap_secrets()
    extracted = found is not None and all(close(f, s) for f, s in zip(found, secrets, strict=True))
    if guard == "unguarded":
        assert extracted
    else:
        assert not extracted


def test_signed_swap_with_count_mean_sd(
    centre_server: tuple[Centre, EmbeddedServer], guard: str
) -> None:
    centre, srv = centre_server
    name = register(centre, YOUNG)
    outputs = run(
        centre, srv.url, name, [Summary(variables=["income"], where=w) for w in SWAP_SETS]
    )
    a, b = (moments(o) for o in outputs)
    found = None
    if a is not None and b is not None:
        sum_a, sum_b = a.n * a.mean, b.n * b.mean
        sq_a, sq_b = a.m2 + a.n * a.mean**2, b.m2 + b.n * b.mean**2
        found = both_from_differences(sum_a - sum_b, sq_a - sq_b)
    assert_swap(guard, found)


def test_signed_swap_with_regressions(
    centre_server: tuple[Centre, EmbeddedServer], guard: str
) -> None:
    centre, srv = centre_server
    name = register(centre, YOUNG)
    outputs = run(
        centre, srv.url, name, [Regression(formula="income ~ age", where=w) for w in SWAP_SETS]
    )
    a, b = (simple(o, "age") for o in outputs)
    found = None
    if a is not None and b is not None:
        found = both_from_differences(a.sy - b.sy, a.syy - b.syy)
    assert_swap(guard, found)


# ------------------------------------------------------- 2. a union of four one-record atoms


def newton_roots(p: np.ndarray) -> np.ndarray:
    """The four numbers whose power sums p[1..4] are given (Newton's identities)."""
    e1 = p[1]
    e2 = (e1 * p[1] - p[2]) / 2
    e3 = (e2 * p[1] - e1 * p[2] + p[3]) / 3
    e4 = (e3 * p[1] - e2 * p[2] + e1 * p[3] - p[4]) / 4
    return np.sort(np.roots([1.0, -e1, e2, -e3, e4]).real)


def test_four_incomes_from_higher_moments(
    centre_server: tuple[Centre, EmbeddedServer], guard: str
) -> None:
    # The occupation table splits the four (one per occupation) into one-record atoms; then
    # q(T or F) + q(T or M) - q(all) is their union, for every power of income at once.
    centre, srv = centre_server
    name = register(centre, YOUNG)
    full = ["count", "mean", "sd", "skewness", "kurtosis"]
    four = "age >= 92"
    analyses: list[Analysis] = [
        FrequencyTable(rows=["occupation"]),
        Summary(variables=["income"], statistics=full, where=f"{four} or sex == 'F'"),
        Summary(variables=["income"], statistics=full, where=f"{four} or sex == 'M'"),
        Summary(variables=["income"], statistics=full),
    ]
    outputs = run(centre, srv.url, name, analyses)
    found = None
    parts = [moments(o) for o in outputs[1:]]
    if all(p is not None for p in parts):
        centre_value = 40_000.0
        f, m, everyone = (p.power_sums(centre_value, 4) for p in parts if p is not None)
        sums = f + m - everyone
        if round(sums[0]) == 4:
            found = newton_roots(sums) + centre_value
    secrets = np.sort(np.array(list(FOUR.values())))
    extracted = found is not None and bool(np.all(np.abs(found - secrets) < 0.01))
    assert extracted == (guard == "unguarded")


# ------------------------------------------------------- 3. a regression's dummy sub-groups


def men_total(sex_age: dict | None, age_only: dict | None) -> float | None:
    """The men's income total in a set, from income ~ C(sex) + age and income ~ age on it.

    income ~ age gives n, sum age and sum age^2; the standard errors of the first fit are
    diag((X'X)^-1) times s^2, which leaves two unknowns of X'X: the number of men (a whole
    number, searched) and their age total (a quadratic). Then X'y = X'X beta gives the total.
    """
    if sex_age is None or age_only is None:
        return None
    base = simple(age_only, "age")
    assert base is not None
    coef = coefficients(sex_age)
    male = next(t for t in coef if t.startswith("C(sex)"))
    n = int(sex_age["n"])
    s2 = ssr(sex_age) / (n - 3)
    d = np.array([coef["Intercept"][1], coef[male][1], coef["age"][1]]) ** 2 / s2
    best: tuple[float, float, float] | None = None
    for men in range(1, n):
        women = n - men
        # (X'X)^-1 [age, age] = 1 / (sum a^2 - Sm^2/men - (Sa - Sm)^2/women): Sm solves a quadratic
        qa = 1.0 / men + 1.0 / women
        qb = -2.0 * base.sz / women
        qc = base.sz**2 / women - base.szz + 1.0 / d[2]
        disc = qb * qb - 4 * qa * qc
        if disc < 0:
            continue
        for sm in ((-qb + math.sqrt(disc)) / (2 * qa), (-qb - math.sqrt(disc)) / (2 * qa)):
            xtx = np.array(
                [[n, men, base.sz], [men, men, sm], [base.sz, sm, base.szz]], dtype=np.float64
            )
            try:
                inv = np.linalg.inv(xtx)
            except np.linalg.LinAlgError:
                continue
            misfit = float(np.max(np.abs(np.diag(inv) / d - 1.0)))
            if best is None or misfit < best[0]:
                best = (misfit, float(men), sm)
    if best is None or best[0] > 1e-6:
        return None
    _, men_n, sm = best
    return men_n * (coef["Intercept"][0] + coef[male][0]) + coef["age"][0] * sm


def test_regression_dummy_subgroups(
    centre_server: tuple[Centre, EmbeddedServer], guard: str
) -> None:
    # The two sets differ by the 90-year-old man and by two unrelated groups of women: as wholes
    # they determine nothing small, their men differ by one.
    centre, srv = centre_server
    name = register(centre, YOUNG)
    men = "(sex == 'M' and region == 'North' and age < 80)"
    first = f"{men} or age == 90 or (sex == 'F' and region == 'South' and age < 80)"
    second = f"{men} or (sex == 'F' and region == 'East' and age < 80)"
    analyses: list[Analysis] = []
    for where in (first, second):
        analyses += [
            Regression(formula="income ~ C(sex) + age", where=where),
            Regression(formula="income ~ age", where=where),
        ]
    outputs = run(centre, srv.url, name, analyses)
    a, b = men_total(outputs[0], outputs[1]), men_total(outputs[2], outputs[3])
    found = None if a is None or b is None else a - b
    assert close(found, income_of(YOUNG, "age == 90")) == (guard == "unguarded")


# ------------------------------------------------ 4. weighted sums of a few-valued regressor


def test_weighted_sums_of_a_few_valued_regressor(
    centre_server: tuple[Centre, EmbeddedServer], guard: str
) -> None:
    # In the set, children takes the values 0, 1, 3 and (for the 90-year-old alone) 2:
    # sum children^p * income for p = 0..3 is a Vandermonde system in the four group totals.
    centre, srv = centre_server
    name = register(centre, YOUNG)
    where = f"{C} or age == 90"
    terms = ["children", "I(children ** 2)", "I(children ** 3)"]
    outputs = run(
        centre, srv.url, name, [Regression(formula=f"income ~ {t}", where=where) for t in terms]
    )
    fits = [simple(o, t) for o, t in zip(outputs, terms, strict=True)]
    found = None
    if all(f is not None for f in fits):
        sums = [fits[0].sy] + [f.szy for f in fits if f is not None]  # type: ignore[union-attr]
        values = np.array([0.0, 1.0, 2.0, 3.0])
        vandermonde = np.vander(values, 4, increasing=True).T  # row p: values ** p
        totals = np.linalg.solve(vandermonde, np.array(sums))
        found = float(totals[2])
    assert close(found, income_of(YOUNG, "age == 90")) == (guard == "unguarded")


def group_totals(output: dict | None) -> dict[str, float] | None:
    """Each group's total (count x mean) of a released summary by one variable."""
    if output is None:
        return None
    out = {}
    for group in output["groups"]:
        stats = dict(group["variables"][0]["stats"])
        out[str(group["labels"][0])] = float(stats["count"]) * float(stats["mean"])
    return out


# The attacks on a few-valued regressor pad the target with the North's people under 60, not
# `C`: nobody is 80 to 89, so the North's under-80s are the North but for the few planted
# people over 91 there, and `C or age == 90` is the reserved region table's North cell less
# and plus fewer than k people: the fit itself is refused from the start (as it would be after
# a colleague's region table; the default reserves the standard tables). An attacker pads with
# a set that is no standard cell, as here; the attacks then succeed unguarded as before.
FEW_VALUED_SET = "(region == 'North' and age < 60) or age == 90"


def test_a_fit_on_a_few_valued_regressor_then_sums_of_its_lower_groups(
    centre_server: tuple[Centre, EmbeddedServer], guard: str
) -> None:
    # Issue 41: a fit on a few-valued regressor is admitted as weighted rows (the set S and
    # sum children * 1[group]), so the fit alone is released. Its two rows with the totals of
    # the groups children 0 and 1 (a grouped summary on a subset of S) leave two equations in
    # the groups 2 and 3: G2 + G3 and 2 G2 + 3 G3, which give the 90-year-old's income. All
    # rows live in one matrix, so the summary is the refused release.
    centre, srv = centre_server
    name = register(centre, YOUNG)
    where = FEW_VALUED_SET
    fit, groups = run(
        centre,
        srv.url,
        name,
        [
            Regression(formula="income ~ children", where=where),
            Summary(
                variables=["income"],
                statistics=["count", "mean"],
                by=["children"],
                where=f"({where}) and children <= 1",
            ),
        ],
    )
    found = None
    simple_fit, totals = simple(fit, "children"), group_totals(groups)
    if simple_fit is not None and totals is not None:
        t0, t1 = totals.get("0", 0.0), totals.get("1", 0.0)
        found = 3.0 * (simple_fit.sy - t0 - t1) - (simple_fit.szy - t1)
    assert close(found, income_of(YOUNG, "age == 90")) == (guard == "unguarded")
    if guard == "guarded":
        assert fit is not None  # the single unsaturated fit is released (issue 41)
        assert groups is None


def test_the_same_fit_on_a_set_without_its_top_groups(
    centre_server: tuple[Centre, EmbeddedServer], guard: str
) -> None:
    # Two fits `income ~ children`, on S and on S without its two top groups (children 2 and
    # 3): the differences of their intercept rows and of their weighted rows are G2 + G3 and
    # 2 G2 + 3 G3, which give the 90-year-old's income (group 2). The second fit is refused.
    centre, srv = centre_server
    name = register(centre, YOUNG)
    where = FEW_VALUED_SET
    outer, inner = run(
        centre,
        srv.url,
        name,
        [
            Regression(formula="income ~ children", where=where),
            Regression(formula="income ~ children", where=f"({where}) and children <= 1"),
        ],
    )
    a, b = simple(outer, "children"), simple(inner, "children")
    found = None
    if a is not None and b is not None:
        found = 3.0 * (a.sy - b.sy) - (a.szy - b.szy)
    assert close(found, income_of(YOUNG, "age == 90")) == (guard == "unguarded")
    if guard == "guarded":
        assert outer is not None and inner is None


# ---------------------------------------------------------------- 6. refusal as an oracle


def probe(x: float) -> Summary:
    return Summary(
        variables=["income"],
        statistics=["count", "mean"],
        where=f"age < 90 or (age >= 96 and income > {x:.3f})",
    )


def count_of(output: dict | None) -> int | None:
    return None if output is None else int(stats_of(output)["count"])


def oracle_search(centre: Centre, url: str, name: str, *, baseline_first: bool) -> float:
    """Binary search of the oldest person's income over cents, one probe per sequence.

    The attacker learns "income > X" from each probe: a released count equal to that of the
    set with the target, or (guarded) a refusal when the scope holds the other set. The scope
    is first given one of the two sets: `age < 90` itself (`baseline_first`), or the probe at
    X = -1, which holds the target for sure.
    """
    if baseline_first:
        first = run(
            centre,
            url,
            name,
            [Summary(variables=["income"], statistics=["count", "mean"], where="age < 90")],
        )[0]
        assert first is not None
        with_target, held_with_target = count_of(first) + 1, False  # type: ignore[operator]
    else:
        first = run(centre, url, name, [probe(-1.0)])[0]
        assert first is not None
        with_target, held_with_target = count_of(first), True
    low, high = 0, 10_000_000  # cents: the income is in (low, high]
    while high - low > 1:
        mid = (low + high) // 2
        output = run(centre, url, name, [probe(mid / 100 + 0.005)])[0]
        # refused: the probe's set is the one the scope does not hold
        above = not held_with_target if output is None else count_of(output) == with_target
        low, high = (mid, high) if above else (low, mid)
    return high / 100


@pytest.mark.parametrize("baseline_first", [False, True], ids=["probes", "after-baseline"])
def test_refusal_as_an_oracle(
    centre_server: tuple[Centre, EmbeddedServer], guard: str, baseline_first: bool
) -> None:
    centre, srv = centre_server
    name = register(centre, OLD)
    found = oracle_search(centre, srv.url, name, baseline_first=baseline_first)
    assert close(found, OLDEST) == (guard == "unguarded")


PAD = "region == 'North' and age >= 90 and age <= 95"


def padded_probe(x: float) -> Summary:
    return Summary(
        variables=["income"],
        statistics=["count", "mean"],
        where=f"age < 90 or ({PAD}) or (age >= 96 and income > {x:.3f})",
    )


def test_padded_oracle_across_researchers(
    centre_server: tuple[Centre, EmbeddedServer], guard: str
) -> None:
    # The probe's "no" branch is the SUM of two released sets (ada's `age < 90` and the North
    # 90-95-year-olds, a group of k or more), so no single earlier set equals it; bob runs the
    # probes in ada's project scope, one sequence each.
    centre, srv = centre_server
    name = register(centre, OLD)
    base = [
        Summary(variables=["income"], statistics=["count", "mean"], where=w)
        for w in ("age < 90", PAD)
    ]
    first = run(centre, srv.url, name, base)
    assert all(o is not None for o in first)
    without_target = sum(count_of(o) or 0 for o in first)
    low, high = 0, 10_000_000
    while high - low > 1:
        mid = (low + high) // 2
        output = run(centre, srv.url, name, [padded_probe(mid / 100 + 0.005)], researcher="bob")[0]
        # refused: the probe holds the target (one more than the released pair)
        above = output is None or count_of(output) == without_target + 1
        low, high = (mid, high) if above else (low, mid)
    assert close(high / 100, OLDEST) == (guard == "unguarded")


def test_zeros_the_definitions_imply_stay_released(
    centre_server: tuple[Centre, EmbeddedServer],
) -> None:
    # Repeats, margins and a histogram bin asked again as a filter: the records make each a
    # combination of earlier releases, and so do the definitions; all are released.
    centre, srv = centre_server
    name = register(centre, OLD)
    edges = [0.0, 30_000.0, 45_000.0, 100_000.0]
    analyses: list[Analysis] = [
        FrequencyTable(rows=["region"], cols=["sex"]),
        FrequencyTable(rows=["region"], cols=["sex"]),
        FrequencyTable(rows=["sex"]),
        FrequencyTable(rows=["region"], where="sex == 'F'"),
        Histogram(variable="income", edges=edges),
        Summary(variables=["income"], where="income >= 30000 and income < 45000"),
        Summary(variables=["income"], where="age >= 18"),
    ]
    outputs = run(centre, srv.url, name, analyses)
    assert [o is not None for o in outputs] == [True] * len(analyses)


# ---------------------------------------------------------------- 7. the public row count


def test_public_row_count(centre_server: tuple[Centre, EmbeddedServer], guard: str) -> None:
    # The catalogue's row count minus a released count of `age < 96` is the number of people
    # aged 96 or more: one.
    centre, srv = centre_server
    name = register(centre, OLD)
    with connect(srv.url, centre.keys["ada"], "ada") as session:
        published = int(session.catalogue_entry(name)["rows"])
    output = run(centre, srv.url, name, [FrequencyTable(rows=["sex"], where="age < 96")])[0]
    found = None
    if output is not None:
        found = published - sum(float(row[0] or 0) for row in output["values"])
    secret = int((OLD["age"] >= 96).sum())
    assert secret == 1
    assert (found == secret) == (guard == "unguarded")


# ------------------------------------------------------------------ availability (benign)

EVERYONE = FrequencyTable(rows=["region"])


@pytest.mark.parametrize("scope", ["project", "dataset"])
def test_everyone_but_one_is_the_refused_release(
    centre_server: tuple[Centre, EmbeddedServer], scope: Scope
) -> None:
    # ada asks for everyone but the oldest person: with the universe admitted first that is a
    # table over the whole population minus one, refused; bob's whole-population table, after
    # it, in the same scope, is released.
    centre, srv = centre_server
    name = register(centre, OLD, scope=scope)
    but_one = run(centre, srv.url, name, [FrequencyTable(rows=["region"], where="age != 97")])
    whole = run(centre, srv.url, name, [EVERYONE], researcher="bob")
    assert but_one == [None]
    assert whole[0] is not None
    assert sum(float(row[0] or 0) for row in whole[0]["values"]) == N


@pytest.mark.parametrize("scope", ["project", "dataset"])
def test_whole_population_table_stays_released_after_a_colleague(
    centre_server: tuple[Centre, EmbeddedServer], scope: Scope
) -> None:
    # An ordinary colleague's release (women by region, an income summary of the over-60s)
    # does not make the whole-population table withheld.
    centre, srv = centre_server
    name = register(centre, OLD, scope=scope)
    colleague = run(
        centre,
        srv.url,
        name,
        [
            FrequencyTable(rows=["region"], where="sex == 'F'"),
            Summary(variables=["income"], where="age > 60"),
        ],
    )
    whole = run(centre, srv.url, name, [EVERYONE, FrequencyTable(rows=["sex"])], researcher="bob")
    assert all(o is not None for o in colleague)
    assert all(o is not None for o in whole)


def test_a_later_version_population_is_admitted_when_the_scope_first_sees_it(
    centre_server: tuple[Centre, EmbeddedServer],
) -> None:
    # The scope exists (v1's population admitted); v2 adds 50 people. At the scope's first
    # admission on v2, v2's published count is admitted too: "everyone on v2 but the oldest"
    # by sex is refused (without v2's count it differs from v1's population by the 50
    # newcomers and the oldest person, which determines nothing small), and a whole v2
    # population table is released.
    centre, srv = centre_server
    name = register(centre, OLD)
    assert run(centre, srv.url, name, [EVERYONE])[0] is not None
    newcomers = population(old_bulk=False, seed=21).iloc[100:150].copy()
    newcomers["person_id"] = np.arange(9001, 9051)
    register(centre, pd.concat([OLD, newcomers], ignore_index=True), name)
    but_one = FrequencyTable(rows=["sex"], where="age != 97")
    assert run(centre, srv.url, f"{name}@2", [but_one]) == [None]
    # by sex: by region, v2's cells minus v1's would count the newcomers of each region
    whole = run(centre, srv.url, f"{name}@2", [FrequencyTable(rows=["sex"])], researcher="bob")[0]
    assert whole is not None
    assert sum(float(row[0] or 0) for row in whole["values"]) == N + 50
