"""Nothing sealed is silently dropped: this walks every field of every kind of the analysis
language (the pydantic discriminated union) and proves, for each, that it is honoured — two
requests that differ only in that field give different answers — or that a value the kind cannot
honour is refused when the analysis is parsed (at plan time in the client and again when the
server parses the revealed body), with a message naming the field.

A new field without a proof here fails `test_every_field_of_every_kind_has_a_proof`.
"""

from __future__ import annotations

import functools
import json
import typing
from typing import Any

import numpy as np
import pytest
from fidelity_data import make_frame, metadata
from pydantic import ValidationError

from safeaccess.client.analyses import DP_KINDS, Analysis, parse_analysis
from safeaccess.client.dpquery import layout
from safeaccess.rules.outputs import MembershipFacts
from safeaccess.rules.ruleset import DEFAULT_RULESET
from safeaccess.sandbox.release import mitigate_output
from safeaccess.sandbox.runner import execute
from safeaccess.sandbox.runner.compute import model_attacks

META = metadata("survey")
FRAME = make_frame(400, seed=7).drop(columns=["person_id"])

# Per kind: a base request, and per field the proofs: ("differs", a, b) -- the base updated
# with a and with b answer differently; ("refused", a, text) -- the base updated with a is
# refused at parse time with `text` in the message.
Proof = tuple[Any, ...]
CASES: dict[str, tuple[dict[str, Any], dict[str, list[Proof]]]] = {
    "frequency_table": (
        {"rows": ["region"]},
        {
            "where": [("differs", {}, {"where": "age >= 40"})],
            "rows": [("differs", {}, {"rows": ["employed"]})],
            "cols": [("differs", {}, {"cols": ["sex"]})],
            "margins": [("differs", {}, {"margins": True})],
            "mitigations": [("differs", {}, {"mitigations": {"round_to": 7}})],
        },
    ),
    "magnitude_table": (
        {"value": "income", "rows": ["region"]},
        {
            "where": [("differs", {}, {"where": "age >= 40"})],
            "value": [("differs", {}, {"value": "age"})],
            "agg": [("differs", {}, {"agg": "mean"})],
            "rows": [("differs", {}, {"rows": ["sex"]})],
            "cols": [("differs", {}, {"cols": ["sex"]})],
            "margins": [("differs", {}, {"margins": True})],
            "mitigations": [("differs", {}, {"mitigations": {"round_to": 1000}})],
        },
    ),
    "summary": (
        {"variables": ["income"]},
        {
            "where": [("differs", {}, {"where": "age >= 40"})],
            "variables": [("differs", {}, {"variables": ["age"]})],
            "statistics": [("differs", {}, {"statistics": ["count", "var"]})],
            "quantiles": [
                (
                    "differs",
                    {"statistics": ["quantiles"], "quantiles": [0.25]},
                    {"statistics": ["quantiles"], "quantiles": [0.75]},
                ),
                ("refused", {"quantiles": [0.25, 0.5]}, "'quantiles'"),
            ],
            "quantile_type": [
                (
                    "differs",
                    {"statistics": ["quantiles"], "quantiles": [0.31]},
                    {"statistics": ["quantiles"], "quantiles": [0.31], "quantile_type": 1},
                ),
                ("refused", {"quantile_type": 1}, "'quantile_type'"),
            ],
            "by": [("differs", {}, {"by": ["sex"]})],
            "round": [("differs", {}, {"round": 0})],
        },
    ),
    "regression": (
        {"formula": "income ~ age"},
        {
            "where": [("differs", {}, {"where": "age >= 40"})],
            "family": [
                (
                    "differs",
                    {"formula": "employed ~ age", "family": "logit"},
                    {"formula": "employed ~ age", "family": "probit"},
                )
            ],
            "formula": [("differs", {}, {"formula": "income ~ age + C(sex)"})],
        },
    ),
    "correlation": (
        {"variables": ["age", "income"]},
        {
            "where": [("differs", {}, {"where": "age >= 40"})],
            "method": [("differs", {}, {"method": "spearman"})],
            "variables": [("differs", {}, {"variables": ["age", "visits"]})],
        },
    ),
    "histogram": (
        {"variable": "age", "edges": [16, 40, 95]},
        {
            "where": [("differs", {}, {"where": "age >= 40"})],
            "variable": [("differs", {}, {"variable": "visits", "edges": [0, 2, 60]})],
            "bins": [("differs", {"edges": None, "bins": 3}, {"edges": None, "bins": 4})],
            "edges": [("differs", {}, {"edges": [16, 50, 95]})],
            "by": [("differs", {}, {"by": ["sex"]})],
        },
    ),
    "test": (
        {"test": "chi2_independence", "rows": "region", "cols": "sex"},
        {
            "where": [("differs", {}, {"where": "age >= 40"})],
            "test": [
                (
                    "differs",
                    {},
                    {
                        "test": "t_two_sample",
                        "rows": None,
                        "cols": None,
                        "variable": "age",
                        "group": "sex",
                    },
                )
            ],
            "rows": [("differs", {}, {"rows": "employed"})],
            "cols": [("differs", {}, {"cols": "died"})],
            "variable": [
                (
                    "differs",
                    {
                        "test": "t_two_sample",
                        "rows": None,
                        "cols": None,
                        "variable": "age",
                        "group": "sex",
                    },
                    {
                        "test": "t_two_sample",
                        "rows": None,
                        "cols": None,
                        "variable": "visits",
                        "group": "sex",
                    },
                ),
                ("refused", {"variable": "age"}, "'variable'"),
            ],
            "group": [
                (
                    "differs",
                    {
                        "test": "t_two_sample",
                        "rows": None,
                        "cols": None,
                        "variable": "age",
                        "group": "sex",
                    },
                    {
                        "test": "t_two_sample",
                        "rows": None,
                        "cols": None,
                        "variable": "age",
                        "group": "employed",
                    },
                ),
                ("refused", {"group": "sex"}, "'group'"),
            ],
            "equal_var": [
                (
                    "differs",
                    {
                        "test": "t_two_sample",
                        "rows": None,
                        "cols": None,
                        "variable": "age",
                        "group": "sex",
                    },
                    {
                        "test": "t_two_sample",
                        "rows": None,
                        "cols": None,
                        "variable": "age",
                        "group": "sex",
                        "equal_var": True,
                    },
                ),
                ("refused", {"equal_var": True}, "'equal_var'"),
            ],
        },
    ),
    "survival": (
        {"time": "days", "event": "died"},
        {
            "where": [("differs", {}, {"where": "age >= 40"})],
            "time": [("differs", {}, {"time": "visits"})],
            "event": [("differs", {}, {"event": "employed"})],
            "by": [("differs", {}, {"by": ["sex"]})],
            "interval": [("differs", {}, {"interval": 90})],
            "max_time": [("differs", {}, {"max_time": 400})],
        },
    ),
    "script": (
        {"code": "result = 1"},
        {
            "where": [
                (
                    "differs",
                    {"code": "result = len(df)"},
                    {"code": "result = len(df)", "where": "age >= 40"},
                )
            ],
            "code": [("differs", {}, {"code": "result = 2"})],
        },
    ),
    "model_training": (
        {
            "family": "decision_tree",
            "target": "employed",
            "features": ["age", "visits"],
            "params": {"max_depth": 3},
        },
        {
            "where": [("differs", {}, {"where": "age >= 30"})],
            "family": [("differs", {}, {"family": "logistic_regression", "params": {}})],
            "target": [("differs", {}, {"target": "died"})],
            "features": [("differs", {}, {"features": ["age"]})],
            "params": [("differs", {}, {"params": {"max_depth": 1}})],
            "test_fraction": [("differs", {}, {"test_fraction": 0.5})],
            "seed": [("differs", {}, {"seed": 3})],
            "fairness": [("differs", {}, {"fairness": {"protected": "sex"}})],
            "roc": [("differs", {}, {"roc": True})],
        },
    ),
}

# The DP kinds: the sandbox computes the exact statistic, the server the noise. A field is
# honoured when the statistic or the plan (sensitivity, sigma, weights) changes with it.
_PRIVACY: dict[str, list[Proof]] = {
    "epsilon": [("differs", {}, {"epsilon": 2.0})],
    "delta": [("differs", {}, {"delta": 1e-9})],
    "sigma": [
        (
            "differs",
            {"epsilon": None, "delta": None, "sigma": 5.0},
            {"epsilon": None, "delta": None, "sigma": 6.0},
        )
    ],
}
DP_CASES: dict[str, tuple[dict[str, Any], dict[str, list[Proof]]]] = {
    "dp_count": (
        {"epsilon": 1.0, "delta": 1e-7},
        {
            "where": [("differs", {}, {"where": "age >= 40"})],
            "by": [("differs", {}, {"by": ["sex"]})],
            "transform": [
                (
                    "differs",
                    {"by": ["sex"]},
                    {"by": ["sex"], "transform": {"goal": "test", "eta": [0, 1]}},
                )
            ],
            **_PRIVACY,
        },
    ),
    "dp_sum": (
        {"variable": "income", "epsilon": 1.0, "delta": 1e-7},
        {
            "where": [("differs", {}, {"where": "age >= 40"})],
            "variable": [("differs", {}, {"variable": "age"})],
            "by": [("differs", {}, {"by": ["sex"]})],
            "transform": [("differs", {}, {"transform": {"goal": "test", "eta": [1, 0]}})],
            **_PRIVACY,
        },
    ),
    "dp_mean": (
        {"variables": ["income"], "epsilon": 1.0, "delta": 1e-7},
        {
            "where": [("differs", {}, {"where": "age >= 40"})],
            "variables": [("differs", {}, {"variables": ["age"]})],
            "by": [("differs", {}, {"by": ["sex"]})],
            "transform": [
                (
                    "differs",
                    {"variables": ["age", "income"]},
                    {"variables": ["age", "income"], "transform": {"goal": "region"}},
                )
            ],
            **_PRIVACY,
        },
    ),
    "dp_histogram": (
        {"variable": "age", "edges": [16, 40, 95], "epsilon": 1.0, "delta": 1e-7},
        {
            "where": [("differs", {}, {"where": "age >= 40"})],
            "variable": [("differs", {}, {"variable": "visits", "edges": [0, 2, 60]})],
            "edges": [("differs", {}, {"edges": [16, 50, 95]})],
            "by": [("differs", {}, {"by": ["sex"]})],
            "transform": [("differs", {}, {"transform": {"goal": "test", "eta": [1, 0, 0]}})],
            **_PRIVACY,
        },
    ),
    "dp_mean_test": (
        {"variables": ["age"], "group": "sex", "epsilon": 1.0, "delta": 1e-7},
        {
            "where": [("differs", {}, {"where": "age >= 40"})],
            "variables": [("differs", {}, {"variables": ["income"]})],
            "group": [("differs", {}, {"group": "employed"})],
            "epsilon": [("differs", {}, {"epsilon": 2.0})],
            "delta": [("differs", {}, {"delta": 1e-9})],
            "sigma": [("refused", {"sigma": 5.0}, "'sigma'")],
            "by": [("refused", {"by": ["region"]}, "'by'")],
            "alpha": [("differs", {}, {"alpha": 0.01})],
        },
    ),
}

# synthetic_data: where, columns, marginals and bins shape the sandbox's exact tables; the other
# fields are honoured after the sandbox, on the server, each proved on the deterministic part of
# the server's own code it reaches (the noise drawn and the records sampled are random, so two
# answers would differ whatever a field did): epsilon and delta set the noise scales `measure`
# draws with, method the marginals it measures, rows the records the worker samples (fitted to
# noise-free marginals), keys and targets the disclosure check's attacks (on the real records
# standing in for the synthetic ones, with a fixed seed).
SYNTH_PART = {
    "where": "tables",
    "columns": "tables",
    "marginals": "tables",
    "bins": "tables",
    "epsilon": "noise",
    "delta": "noise",
    "method": "noise",
    "rows": "sample",
    "keys": "check",
    "targets": "check",
}
SYNTH_CASES: dict[str, list[Proof]] = {
    "where": [("differs", {}, {"where": "age >= 40"})],
    "columns": [("differs", {}, {"columns": ["region", "sex", "died"]})],
    "marginals": [("differs", {}, {"marginals": [["region", "sex"]]})],
    "bins": [("differs", {}, {"columns": ["region", "sex", "age"], "bins": {"age": [16, 50, 95]}})],
    "epsilon": [("differs", {}, {"epsilon": 2.0})],
    "delta": [("differs", {}, {"delta": 1e-9})],
    "method": [
        (
            "differs",
            {"marginals": [["region", "sex"]]},
            {"method": "fixed", "marginals": [["region", "sex"]]},
        ),
        ("refused", {"method": "fixed"}, "'fixed' needs at least one marginal in 'marginals'"),
    ],
    "rows": [("differs", {}, {"rows": 50})],
    "keys": [("differs", {}, {"keys": ["region", "sex"]})],
    "targets": [("differs", {}, {"targets": ["sex"]})],
}
SYNTH_BASE: dict[str, Any] = {
    "columns": ["region", "sex", "employed"],
    "epsilon": 1.0,
    "delta": 1e-7,
}


def _kinds() -> dict[str, type]:
    union = typing.get_args(typing.get_args(Analysis)[0])
    return {m.model_fields["kind"].default: m for m in union}


def _fields(model: type) -> set[str]:
    return set(model.model_fields) - {"kind"}  # type: ignore[attr-defined]


def test_every_field_of_every_kind_has_a_proof() -> None:
    kinds = _kinds()
    covered = {**CASES, **DP_CASES}
    for kind, model in kinds.items():
        fields = _fields(model)
        if kind == "synthetic_data":
            assert fields == set(SYNTH_CASES) == set(SYNTH_PART), kind
            continue
        assert kind in covered, f"no proofs for kind {kind}"
        assert set(covered[kind][1]) == fields, (kind, fields ^ set(covered[kind][1]))


def _body(kind: str, base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    body = {"kind": kind, **base, **update}
    return {k: v for k, v in body.items() if v is not None}


def _answer(body: dict[str, Any], part: str | None = None) -> Any:
    if body["kind"] == "synthetic_data":
        assert part is not None
        return json.loads(_synth_answer(json.dumps(body, sort_keys=True), part))
    return json.loads(_answer_of(json.dumps(body, sort_keys=True)))


@functools.cache
def _synth_answer(text: str, part: str) -> str:
    """The part of the server's synthetic-data pipeline a field reaches, computed with the
    pipeline's own functions (`server.synth.step`, `measure`, the worker, the check job)."""
    from dataclasses import asdict

    from safeaccess.rules.dp import gaussian_mu_for
    from safeaccess.sandbox.runner.compute.synthetic import (
        code_records,
        encode_codes,
        synthetic_check,
    )
    from safeaccess.server.synth import step
    from safeaccess.server.synth.measure import Measurement, measure
    from safeaccess.server.synth.worker_client import run_worker

    analysis = parse_analysis(to_body_json(json.loads(text)))
    assert analysis.kind == "synthetic_data"
    work = step.workload(analysis, META, DEFAULT_RULESET)
    tables = execute(analysis, FRAME, META).facts.tables  # type: ignore[union-attr]
    if part == "tables":
        return json.dumps(tables)
    if part == "noise":
        released = measure(work, tables, gaussian_mu_for(analysis.epsilon, analysis.delta), 1)
        scales = [released.sigma_oneway, released.sigma_selection, released.sigma_cliques]
        return json.dumps({"sigmas": scales, "measured": len(released.all)})
    if part == "sample":
        exact = [
            Measurement(clique, np.asarray(t, dtype=np.float64), 1.0)
            for clique, t in zip(work.tables, tables, strict=True)
            if len(clique) == 1
        ]
        request = step.worker_request(analysis, work, exact).model_copy(
            update={"iterations": 20, "seed": 0}
        )
        # in its own process, as the server runs it (JAX in this process would warn at every
        # later fork of a test on the same xdist worker)
        return json.dumps(len(run_worker(request).codes))
    assert part == "check"
    rows = FRAME if analysis.where is None else FRAME.query(analysis.where)
    request = {
        "analysis": analysis.model_dump(mode="json"),
        "synthetic": encode_codes(code_records(rows, work)),
        "rules": asdict(DEFAULT_RULESET.synth_rules),
        "seed": 0,
    }
    return json.dumps(synthetic_check(request, FRAME, META).facts.checks, sort_keys=True)


@functools.cache
def _answer_of(text: str) -> str:
    body = json.loads(text)
    analysis = parse_analysis(to_body_json(body))
    if analysis.kind == "model_training":
        # The membership attacks train 500 forests per model (seconds) and read no field of
        # the request but the seed; their own tests are in tests/sandbox. Here they are skipped.
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(model_attacks, "membership", _no_attack)
            computed = execute(analysis, FRAME.iloc[:150], META)
    else:
        computed = execute(analysis, FRAME, META)
    # What the server releases of it: the mitigations asked for, a model's release view.
    out = mitigate_output(computed, analysis, DEFAULT_RULESET).model_dump(mode="json")
    if analysis.kind in DP_KINDS:
        from safeaccess.server import dp

        shape = layout(analysis, META)
        weights, sensitivity, sigma = dp._calibrate(analysis, shape, 1)  # type: ignore[arg-type]
        out = {"statistic": out, "plan": [weights, sensitivity, sigma]}
        if analysis.kind == "dp_mean_test":
            out["alpha"] = body.get("alpha", 0.05)  # read by hotelling_test on the server
    return json.dumps(out, sort_keys=True)


def _no_attack(
    y_train: Any, proba_train: Any, y_test: Any, proba_test: Any, seed: int
) -> MembershipFacts:
    return MembershipFacts(
        n_train=len(y_train),
        n_test=len(y_test),
        loss_auc=0.5,
        loss_auc_p_value=1.0,
        worst_case_auc=0.5,
        worst_case_auc_max=None,
        worst_case_reps=0,
        train_accuracy=0.0,
        test_accuracy=None,
    )


def to_body_json(body: dict[str, Any]) -> bytes:
    return json.dumps(body).encode()


def _proofs() -> list[tuple[str, str, dict[str, Any], Proof]]:
    out = []
    for kind, (base, fields) in {**CASES, **DP_CASES}.items():
        for name, proofs in fields.items():
            out += [(kind, name, base, p) for p in proofs]
    for name, proofs in SYNTH_CASES.items():
        out += [("synthetic_data", name, SYNTH_BASE, p) for p in proofs]
    return out


@pytest.mark.parametrize(
    ("kind", "field", "base", "proof"),
    _proofs(),
    ids=[f"{k}.{f}.{p[0]}" for k, f, _, p in _proofs()],
)
def test_a_field_is_honoured_or_refused_by_name(
    kind: str, field: str, base: dict[str, Any], proof: Proof
) -> None:
    if proof[0] == "refused":
        with pytest.raises(ValidationError) as refused:
            parse_analysis(to_body_json(_body(kind, base, proof[1])))
        assert proof[2] in str(refused.value)
        return
    a, b = _body(kind, base, proof[1]), _body(kind, base, proof[2])
    assert a != b
    part = SYNTH_PART.get(field) if kind == "synthetic_data" else None
    assert _answer(a, part) != _answer(b, part), f"{kind}.{field} changed nothing in the answer"
