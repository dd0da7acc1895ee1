"""How many plausible models on the census demo the leverage rule still releases.

Enumerates models a researcher would plausibly fit on the generated census
(`safeaccess.server.demo.data`): OLS of income and log income, logit of being employed, Poisson
of the health score, each on the whole population and on common sub-populations, plus a few
small ones (the oldest ages, a rare ethnic group, a region by ethnicity cell). Each model is
computed by the runner's own code (`safeaccess.sandbox.runner.execute`, in process) and checked
three ways:

- ACRO's regression rule alone: residual degrees of freedom >= 10 (the peer's check);
- our rules before the leverage check (`leverage_limit: 1.0` switches it off);
- our rules with the default limit, 1/threshold.

Two outcome columns are derived here because the census has no 0/1 or count variable: `employed`
(1 when employment is 'employed') for the logits, and `health` (the 1..5 score) read as an
integer count for the Poisson models. Models that cannot be computed (no records, singular,
non-convergence) are counted apart: no rule decides them.

    python benchmarks/models_released.py [--rows 20000] [--seed 20221012] [--list]
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import pandas as pd

from safeaccess.client.analyses import parse_analysis
from safeaccess.client.metadata import Column, DatasetMetadata
from safeaccess.rules.engine import check
from safeaccess.rules.outputs import RegressionOutput
from safeaccess.rules.ruleset import DEFAULT_RULESET
from safeaccess.sandbox.runner import execute
from safeaccess.sandbox.runner.compute._common import AnalysisError
from safeaccess.server.demo.data import census_metadata, generate_census

OLS = [
    "income ~ age",
    "income ~ age + C(sex)",
    "log(income) ~ age + I(age ** 2) + C(sex)",
    "log(income) ~ age + C(sex) + C(region)",
    "income ~ age * C(sex)",
    "income ~ C(region) + C(sex)",
    "income ~ C(ethnicity) + age",
    "log(income) ~ C(employment) + age + C(sex)",
    "income ~ C(health) + age",
    "log(income) ~ age + I(age ** 2) + C(region) + C(ethnicity)",
]
LOGIT = [
    "employed ~ age + C(sex)",
    "employed ~ age + I(age ** 2) + C(sex)",
    "employed ~ age + C(region) + C(ethnicity)",
    "employed ~ C(health) + age",
]
POISSON = [
    "health ~ age",
    "health ~ age + C(sex) + C(region)",
    "health ~ age + I(age ** 2) + C(employment)",
]
FILTERS = [
    None,
    "age >= 18",
    "age between 25 and 64",
    "sex = 'F'",
    "region = 'Capital'",
    "region = 'North'",
    "employment = 'employed'",
    "age >= 65",
    # small sub-populations a researcher might try
    "age >= 85",
    "ethnicity = 'Mixed' and region = 'South'",
    "ethnicity = 'Traveller'",
]


@dataclass
class Outcome:
    family: str
    formula: str
    where: str | None
    acro: bool
    before: bool
    after: bool
    max_leverage: float


def _data(rows: int, seed: int) -> tuple[pd.DataFrame, DatasetMetadata]:
    frame = generate_census(rows, seed=seed)
    frame["employed"] = (frame["employment"] == "employed").astype("int64")
    base = census_metadata("census")
    columns = [
        Column(name="health", type="integer", bounds=(1, 5)) if c.name == "health" else c
        for c in base.columns
    ]
    columns.append(Column(name="employed", type="integer", bounds=(0, 1)))
    return frame, base.model_copy(update={"columns": columns})


def _where(extra: str | None, formula: str) -> str | None:
    # log(income) needs positive incomes: a researcher adds the condition
    needs = "income > 0" if formula.startswith("log(income)") else None
    parts = [p for p in (extra, needs) if p]
    return " and ".join(f"({p})" for p in parts) if parts else None


def run(rows: int, seed: int) -> tuple[list[Outcome], int]:
    frame, metadata = _data(rows, seed)
    off = DEFAULT_RULESET.with_overrides({"leverage_limit": 1.0})
    outcomes: list[Outcome] = []
    failed = 0
    models = [("ols", f) for f in OLS] + [("logit", f) for f in LOGIT]
    models += [("poisson", f) for f in POISSON]
    for family, formula in models:
        for extra in FILTERS:
            where = _where(extra, formula)
            body = {"kind": "regression", "family": family, "formula": formula}
            if where:
                body["where"] = where
            try:
                out = execute(parse_analysis(body), frame, metadata)
            except AnalysisError:
                failed += 1
                continue
            assert isinstance(out, RegressionOutput) and out.facts.leverage is not None
            outcomes.append(
                Outcome(
                    family=family,
                    formula=formula,
                    where=extra,
                    acro=out.facts.df_resid >= DEFAULT_RULESET.dof,
                    before=check(out, off).verdict == "release",
                    after=check(out).verdict == "release",
                    max_leverage=out.facts.leverage.max,
                )
            )
    return outcomes, failed


def _share(flags: list[bool]) -> str:
    return f"{sum(flags):4d}/{len(flags)} = {100.0 * sum(flags) / max(len(flags), 1):5.1f} %"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=20221012)
    parser.add_argument("--list", action="store_true", help="print every model's verdicts")
    args = parser.parse_args()
    outcomes, failed = run(args.rows, args.seed)
    print(f"census demo: {args.rows} rows, seed {args.seed}")
    print(f"models computed: {len(outcomes)} (plus {failed} that could not be computed)")
    print(f"released by ACRO's df rule alone:        {_share([o.acro for o in outcomes])}")
    print(f"released before the leverage check:      {_share([o.before for o in outcomes])}")
    print(f"released with leverage <= 1/threshold:   {_share([o.after for o in outcomes])}")
    for family in ("ols", "logit", "poisson"):
        sub = [o for o in outcomes if o.family == family]
        print(
            f"  {family:8s} before {_share([o.before for o in sub])}   after "
            f"{_share([o.after for o in sub])}"
        )
    everyone = [o for o in outcomes if o.where in (None, "age >= 18", "age between 25 and 64")]
    print(
        f"  whole adult population: before {_share([o.before for o in everyone])}   after "
        f"{_share([o.after for o in everyone])}"
    )
    flipped = [o for o in outcomes if o.before and not o.after]
    if outcomes:
        ratio = sum(o.after for o in outcomes) / max(sum(o.before for o in outcomes), 1)
        print(f"after/before: {ratio:.3f}; newly withheld by leverage: {len(flipped)}")
    for o in flipped:
        print(
            f"  withheld now: {o.family} {o.formula!r} where {o.where!r} "
            f"(max leverage {o.max_leverage:.3f})"
        )
    if args.list:
        for o in outcomes:
            print(
                f"{o.family:8s} acro={o.acro!s:5} before={o.before!s:5} after={o.after!s:5} "
                f"h_max={o.max_leverage:.4f} {o.formula} | {o.where}"
            )


if __name__ == "__main__":
    main()
