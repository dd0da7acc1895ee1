"""Outputs rendered for output checkers: flagged cells, inline SVG charts, regression facts, and a
readable fallback (never an error) for what has no renderer."""

from __future__ import annotations

import re

from safeaccess.rules import outputs
from safeaccess.rules.decision import Finding
from safeaccess.rules.outputs import (
    CellFacts,
    Coefficient,
    LeverageFacts,
    RegressionFacts,
    RegressionOutput,
    RegressorFacts,
    ScriptFacts,
    ScriptOutput,
    SurvivalCurve,
    SurvivalCurveFacts,
    SurvivalFacts,
    SurvivalOutput,
    SurvivalStep,
    SurvivalStepFacts,
    TableFacts,
    TableOutput,
)
from safeaccess.server.web.render import render_output

HIST = TableOutput(
    source="histogram",
    statistic="count",
    row_vars=["age"],
    col_vars=[],
    row_labels=[["[16, 40)"], ["[40, 70)"], ["[70, 96)"]],
    col_labels=[[]],
    values=[[120.0], [200.0], [4.0]],
    bin_edges=[16.0, 40.0, 70.0, 96.0],
    facts=TableFacts(cells=CellFacts(counts=[[120], [200], [4]]), n_total=324),
)


def test_a_histogram_is_an_svg_chart_with_the_flagged_bar_marked() -> None:
    flag = Finding(check="threshold", verdict="withhold", item="age=[70, 96)", message="4 < 10")
    html = str(render_output(HIST.model_dump(mode="json"), [flag]))
    assert html.count('class="bar"') == 2 and html.count('class="bar flagged"') == 1
    assert "<svg" in html and "<script" not in html
    # The table names the check on the flagged cell only.
    flagged = re.findall(r'<td class="flagged"[^>]*>(.*?)</td>', html)
    assert len(flagged) == 1 and "threshold" in flagged[0] and "4" in flagged[0]


def test_survival_curves_are_step_lines_one_per_group() -> None:
    steps = [
        SurvivalStep(time=t, at_risk=50 - 10 * i, events=5, survival=1 - 0.1 * (i + 1))
        for i, t in enumerate([2.0, 5.0, 9.0])
    ]
    out = SurvivalOutput(
        time="months",
        event="died",
        by=["sex"],
        curves=[SurvivalCurve(labels=["F"], steps=steps), SurvivalCurve(labels=["M"], steps=steps)],
        facts=SurvivalFacts(
            curves=[
                SurvivalCurveFacts(
                    labels=[s], steps=[SurvivalStepFacts(time=1.0, at_risk=5, events=1)]
                )
                for s in ("F", "M")
            ],
            n_total=100,
        ),
    )
    html = str(render_output(out.model_dump(mode="json"), []))
    assert html.count("<polyline") == 2 and 'class="legend"' in html
    # A step function: each drop is drawn as a horizontal then a vertical segment.
    first = re.search(r'<polyline points="([^"]+)"', html)
    assert first is not None and len(first.group(1).split()) == 1 + 2 * 3


def test_a_regression_shows_df_and_leverage() -> None:
    out = RegressionOutput(
        family="ols",
        formula="income ~ age",
        n=500,
        df_resid=498.0,
        df_model=1.0,
        coefficients=[
            Coefficient(
                term="age",
                estimate=1.5,
                std_error=0.1,
                statistic=15.0,
                p_value=0.0,
                ci_low=1.3,
                ci_high=1.7,
            )
        ],
        facts=RegressionFacts(
            n=500,
            df_resid=498.0,
            df_model=1.0,
            categorical_only=False,
            saturated=False,
            regressors=[RegressorFacts(term="age", binary=False)],
            leverage=LeverageFacts(n=500, max=0.031, top=[0.031, 0.02]),
        ),
    )
    html = str(render_output(out.model_dump(mode="json"), []))
    assert "residual df</dt><dd>498" in html and "max 0.031 over 500 records" in html


def test_a_tests_facts_list_its_details_escaped() -> None:
    # (Through the module: pytest would take names starting with Test for test classes.)
    out = outputs.TestOutput(
        test="t_two_sample",
        statistic=2.5,
        df=10.0,
        p_value=0.03125,
        n=12,
        details={"mean <a>": 1.5, "b": None},
        facts=outputs.TestFacts(n=12),
    )
    assert str(render_output(out.model_dump(mode="json"), [])) == (
        '<dl class="facts"><dt>test</dt><dd>t_two_sample</dd><dt>statistic</dt><dd>2.5</dd>'
        "<dt>df</dt><dd>10</dd><dt>p</dt><dd>0.03125</dd><dt>n</dt><dd>12</dd>"
        "<dt>mean &lt;a&gt;</dt><dd>1.5</dd><dt>b</dt><dd>–</dd></dl>"
    )


def test_script_output_is_escaped_and_unknown_outputs_fall_back_to_json() -> None:
    out = ScriptOutput(
        stdout="<script>alert(1)</script>", result={"a": 1}, facts=ScriptFacts(stdout_bytes=25)
    )
    html = str(render_output(out.model_dump(mode="json"), []))
    assert "<script>" not in html and "&lt;script&gt;" in html
    odd = {"type": "table", "values": "not a table"}
    assert '<pre class="json">' in str(render_output(odd, []))
    future = {"type": "model", "trees": [1, 2], "facts": {"secret": 1}}
    shown = str(render_output(future, []))
    assert "trees" in shown and "secret" not in shown
    assert "no output" in str(render_output(None, []))
