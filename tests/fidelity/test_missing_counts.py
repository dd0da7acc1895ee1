"""Every rule-checked kind's released missing counts against pandas' `isna().sum()` per group,
through the real server and client, on the reference survey (5 % missing incomes, 8 % missing
smokers): the answer says how many records it left out, a count below the threshold is
suppressed (with the smallest shown ones until the suppressed hold a threshold's worth), and the
frame, the plot's caption and the results folder say so."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from fidelity_data import Fidelity

from safeaccess.client.analyses import (
    Correlation,
    FrequencyTable,
    Histogram,
    MagnitudeTable,
    Regression,
    StatTest,
    Summary,
    Survival,
    to_body,
)
from safeaccess.client.protocol import seal
from safeaccess.client.results import StepResult
from safeaccess.client.results_folder import save_results
from safeaccess.client.session import connect

THRESHOLD = 10  # the default rule set's


def _released(results: list[StepResult]) -> list[dict[str, Any]]:
    assert [r.status for r in results] == ["released"] * len(results), [
        (r.status, r.error_code, r.error_message, r.reasons) for r in results
    ]
    return [r.output for r in results if r.output is not None]


def _expected(counts: dict[tuple[Any, ...], int]) -> dict[tuple[Any, ...], int | None]:
    """The documented rule, written out here: counts 1..threshold-1 are suppressed, then the
    smallest shown ones until the suppressed hold at least threshold records together."""
    hidden = {k for k, c in counts.items() if 0 < c < THRESHOLD}
    total = sum(counts[k] for k in hidden)
    if hidden:
        for k in sorted((k for k in counts if k not in hidden and counts[k]), key=counts.get):
            if total >= THRESHOLD:
                break
            hidden.add(k)
            total += counts[k]
    return {k: None if k in hidden else c for k, c in counts.items()}


def _released_counts(out: dict[str, Any]) -> dict[tuple[Any, ...], int | None]:
    found = {}
    for m in out["missing"]:
        assert m["suppressed"] == (m["count"] is None)
        found[(tuple(m["variables"]), *m["group"])] = m["count"]
    return found


def _per_group(frame: pd.DataFrame, by: list[str], variable: str) -> dict[tuple[Any, ...], int]:
    """pandas: per group of `by` (declared levels, missing keys dropped), `variable`'s missing
    values; plus the records whose group is missing."""
    out: dict[tuple[Any, ...], int] = {}
    if by:
        sums = frame.groupby(by, observed=False)[variable].apply(lambda s: int(s.isna().sum()))
        for key, count in sums.items():
            out[((variable,), *(key if isinstance(key, tuple) else (key,)))] = int(count)
        out[(tuple(by),)] = int(frame[by].isna().any(axis=1).sum())
    else:
        out[((variable,),)] = int(frame[variable].isna().sum())
    return out


def test_tables_and_histograms_count_their_missing_values_as_pandas(fidelity: Fidelity) -> None:
    frame = fidelity.frame
    (freq,) = _released(fidelity.run([FrequencyTable(rows=["smoker"], cols=["sex"])]))
    assert _released_counts(freq) == {
        (("smoker", "sex"),): int(frame[["smoker", "sex"]].isna().any(axis=1).sum())
    }
    (mag,) = _released(fidelity.run([MagnitudeTable(value="income", agg="mean", rows=["region"])]))
    expected = _per_group(frame, ["region"], "income")
    assert _released_counts(mag) == _expected(expected)
    # isles' few missing incomes are suppressed, and west's with them (secondary)
    assert _released_counts(mag)[(("income",), "isles")] is None
    (hist,) = _released(
        fidelity.run([Histogram(variable="income", edges=[0, 50_000, 250_000], by=["smoker"])])
    )
    assert _released_counts(hist) == _expected(_per_group(frame, ["smoker"], "income"))


def test_summaries_count_missing_values_per_variable_and_group(fidelity: Fidelity) -> None:
    frame = fidelity.frame
    (out,) = _released(fidelity.run([Summary(variables=["income", "age"], by=["smoker"])]))
    expected = {
        **_per_group(frame, ["smoker"], "income"),
        **_per_group(frame, ["smoker"], "age"),
    }
    assert _released_counts(out) == _expected(expected)


def test_listwise_kinds_count_the_records_they_dropped(fidelity: Fidelity) -> None:
    frame = fidelity.frame
    reg, corr = _released(
        fidelity.run(
            [
                Regression(formula="income ~ age + C(smoker)"),
                Correlation(variables=["income", "age"]),
            ]
        )
    )
    assert _released_counts(reg) == {
        (("age", "income", "smoker"),): int(
            frame[["income", "age", "smoker"]].isna().any(axis=1).sum()
        )
    }
    assert reg["n"] + reg["missing"][0]["count"] == len(frame)
    assert _released_counts(corr) == {
        (("income", "age"),): int(frame[["income", "age"]].isna().any(axis=1).sum())
    }


def test_tests_and_survival_count_missing_values_per_group(fidelity: Fidelity) -> None:
    frame = fidelity.frame
    (chi2,) = _released(
        fidelity.run([StatTest(test="chi2_independence", rows="smoker", cols="sex")])
    )
    assert _released_counts(chi2) == {
        (("smoker", "sex"),): int(frame[["smoker", "sex"]].isna().any(axis=1).sum())
    }
    (t,) = _released(
        fidelity.run([StatTest(test="t_two_sample", variable="income", group="smoker")])
    )
    assert _released_counts(t) == _expected(_per_group(frame, ["smoker"], "income"))
    (km,) = _released(
        fidelity.run([Survival(time="days", event="died", by=["sex"], interval=100, max_time=1000)])
    )
    lost = frame[["days", "died"]].isna().any(axis=1)
    expected = {(("days", "died"), s): int(lost[frame["sex"] == s].sum()) for s in ("F", "M")}
    expected[(("sex",),)] = int(frame["sex"].isna().sum())
    assert _released_counts(km) == expected


def test_frame_plot_and_results_folder_show_the_missing_counts(
    fidelity: Fidelity, tmp_path: Path
) -> None:
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    frame = fidelity.frame
    who = fidelity.free.pop()
    analyses = [MagnitudeTable(value="income", agg="sum", rows=["smoker"])]
    sealed = seal(
        [to_body(a) for a in analyses],
        fidelity.keys[who],
        researcher=who,
        project="p1",
        dataset="survey",
        server=fidelity.server_id,
    )
    with connect(fidelity.url, fidelity.keys[who], who) as session:
        (result,) = session.run(sealed)
    assert result.status == "released", result.reasons
    counts = frame.groupby("smoker", observed=False)["income"].apply(lambda s: s.isna().sum())
    no_smoker = int(frame["smoker"].isna().sum())
    shown = result.frame()
    assert shown.attrs["imputation"] == "none"
    for level, count in counts.items():
        assert f"income | {level}: {count}" in shown.attrs["missing"]
    assert f"smoker: {no_smoker}" in shown.attrs["missing"]
    table = result.missing()
    assert table["count"].tolist() == [*counts.tolist(), no_smoker]
    ax = result.plot()
    captions = [t.get_text() for t in ax.texts]
    assert any(f"smoker: {no_smoker}" in c and "imputation: none" in c for c in captions)
    folder = save_results([result], sealed, tmp_path / "out")
    step = json.loads((folder / "summary.json").read_text())["steps"][0]
    assert step["imputation"] == "none"
    assert [m["count"] for m in step["missing"]] == [*counts.tolist(), no_smoker]
