"""Outputs rendered for an output checker to read: HTML tables and inline SVG charts.

Everything is built from the stored output (facts included, which only checkers see) and the
rules' findings; every value is escaped. A kind without a renderer here, or an output that does not
parse as its kind, is shown as pretty JSON: never an error page.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from markupsafe import Markup
from pydantic import TypeAdapter, ValidationError

from safeaccess.rules.checks.cells import cell_name
from safeaccess.rules.decision import Finding
from safeaccess.rules.outputs import (
    CorrelationOutput,
    Output,
    RegressionOutput,
    ScriptOutput,
    SummaryOutput,
    SurvivalOutput,
    TableOutput,
    TestOutput,
)

_OUTPUT = TypeAdapter(Output)


# A list whose items are scalars or one-line lists (no objects, no multi-line lists).
_SHORT_LIST = re.compile(r"\[\s+((?:[^\[\]{}]|\[[^{}\n]*\])*?)\s+\]")


def _join_short(match: re.Match[str]) -> str:
    joined = "[" + " ".join(match.group(1).split()) + "]"
    return joined if len(joined) <= 100 else match.group(0)


def pretty_json(value: Any) -> Markup:
    """Indented JSON with lists of scalars kept on one line (cell grids stay readable)."""
    text = json.dumps(value, indent=2, sort_keys=True, default=str, allow_nan=True)
    previous = None
    while previous != text:  # innermost lists first, then the lists of them
        previous = text
        text = _SHORT_LIST.sub(_join_short, text)
    return Markup('<pre class="json">{}</pre>').format(text)


def _num(value: Any, digits: int = 6) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return str(value)
        if value.is_integer() and abs(value) < 1e15:
            return f"{int(value):,}"
        return f"{value:.{digits}g}"
    return str(value)


def _label(labels: Sequence[Any]) -> str:
    return ", ".join(_num(x) if isinstance(x, float) else str(x) for x in labels) or "(all)"


def _svg_chart(
    title: str,
    series: list[tuple[str, list[tuple[float, float]]]],
    *,
    x_label: str,
    y_label: str,
    step: bool,
    bars: list[tuple[float, float, float, bool]] | None = None,
) -> Markup:
    """A small line/step chart or histogram (bars: x0, x1, height, flagged) as inline SVG."""
    width, height, left, bottom, top, right = 640, 300, 70, 40, 20, 20
    xs = [x for _, pts in series for x, _ in pts]
    ys = [y for _, pts in series for _, y in pts]
    if bars:
        xs += [b[0] for b in bars] + [b[1] for b in bars]
        ys += [b[2] for b in bars] + [0.0]
    finite_x = [x for x in xs if math.isfinite(x)]
    finite_y = [y for y in ys if math.isfinite(y)]
    if not finite_x or not finite_y:
        return Markup('<p class="muted">nothing to draw</p>')
    x0, x1 = min(finite_x), max(finite_x)
    y0, y1 = min(0.0, min(finite_y)), max(finite_y)
    if x1 == x0:
        x1 = x0 + 1
    if y1 == y0:
        y1 = y0 + 1

    def px(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * (width - left - right)

    def py(y: float) -> float:
        return height - bottom - (y - y0) / (y1 - y0) * (height - top - bottom)

    parts = [
        Markup(
            '<svg class="chart" role="img" viewBox="0 0 {w} {h}" width="{w}" height="{h}" '
            'xmlns="http://www.w3.org/2000/svg"><title>{t}</title>'
        ).format(w=width, h=height, t=title),
        Markup(
            '<line x1="{l}" y1="{b}" x2="{r}" y2="{b}" class="axis"/>'
            '<line x1="{l}" y1="{t}" x2="{l}" y2="{b}" class="axis"/>'
        ).format(l=left, r=width - right, t=top, b=height - bottom),
    ]
    for frac in (0.0, 0.5, 1.0):
        yv = y0 + frac * (y1 - y0)
        xv = x0 + frac * (x1 - x0)
        parts.append(
            Markup(
                '<text x="{x}" y="{y}" class="tick" text-anchor="end">{v}</text>'
                '<text x="{x2}" y="{y2}" class="tick" text-anchor="middle">{v2}</text>'
            ).format(
                x=left - 6,
                y=f"{py(yv) + 4:.1f}",
                v=_num(yv, 3),
                x2=f"{px(xv):.1f}",
                y2=height - bottom + 16,
                v2=_num(xv, 3),
            )
        )
    parts.append(
        Markup(
            '<text x="{x}" y="{y}" class="axis-label" text-anchor="middle">{t}</text>'
            '<text x="14" y="{ym}" class="axis-label" text-anchor="middle" '
            'transform="rotate(-90 14 {ym})">{yl}</text>'
        ).format(x=(left + width - right) / 2, y=height - 6, t=x_label, ym=height / 2, yl=y_label)
    )
    for bx0, bx1, bh, flagged in bars or []:
        if not all(math.isfinite(v) for v in (bx0, bx1, bh)):
            continue
        parts.append(
            Markup(
                '<rect x="{x}" y="{y}" width="{w}" height="{h}" class="{c}"><title>{t}</title></rect>'
            ).format(
                x=f"{px(bx0):.1f}",
                y=f"{min(py(bh), py(0)):.1f}",
                w=f"{max(px(bx1) - px(bx0) - 1, 1):.1f}",
                h=f"{abs(py(0) - py(bh)):.1f}",
                c="bar flagged" if flagged else "bar",
                t=f"[{_num(bx0)}, {_num(bx1)}): {_num(bh)}" + (" — flagged" if flagged else ""),
            )
        )
    for n, (name, pts) in enumerate(series):
        coords: list[str] = []
        prev_y: float | None = None
        for x, y in pts:
            if not (math.isfinite(x) and math.isfinite(y)):
                continue
            if step and prev_y is not None:
                coords.append(f"{px(x):.1f},{py(prev_y):.1f}")
            coords.append(f"{px(x):.1f},{py(y):.1f}")
            prev_y = y
        parts.append(
            Markup('<polyline points="{p}" class="line s{n}"><title>{t}</title></polyline>').format(
                p=" ".join(coords), n=n % 6, t=name
            )
        )
    parts.append(Markup("</svg>"))
    if len(series) > 1:
        legend = Markup("").join(
            Markup('<li><span class="swatch s{n}"></span>{t}</li>').format(n=n % 6, t=name)
            for n, (name, _) in enumerate(series)
        )
        parts.append(Markup('<ul class="legend">{}</ul>').format(legend))
    return Markup("").join(parts)


def _facts(items: Iterable[tuple[str, Any]]) -> Markup:
    """A list of facts, `<dl class="facts">`: each (term, value) pair escaped."""
    return Markup('<dl class="facts">{}</dl>').format(
        Markup("").join(Markup("<dt>{}</dt><dd>{}</dd>").format(k, v) for k, v in items)
    )


def _findings_by_item(findings: list[Finding]) -> dict[str, list[Finding]]:
    by: dict[str, list[Finding]] = {}
    for f in findings:
        if f.item is not None:
            by.setdefault(f.item, []).append(f)
    return by


def _table(out: TableOutput, findings: list[Finding]) -> Markup:
    by_item = _findings_by_item([f for f in findings if f.verdict != "release"])
    cells = out.facts.cells
    head = Markup("").join(
        Markup('<th scope="col">{}</th>').format(_label(c)) for c in out.col_labels
    )
    rows = []
    details = []
    for i, row_label in enumerate(out.row_labels):
        tds = []
        for j, _ in enumerate(out.col_labels):
            value = out.values[i][j] if i < len(out.values) and j < len(out.values[i]) else None
            name = cell_name(out, i, j)
            fired = by_item.get(name, [])
            suppressed = bool(out.suppressed and out.suppressed[i][j])
            count = cells.counts[i][j] if i < len(cells.counts) else None
            checks = ", ".join(sorted({f.check for f in fired}))
            classes = ["flagged"] if fired else []
            if suppressed:
                classes.append("suppressed")
            note = Markup('<span class="check-name">{}</span>').format(checks) if fired else ""
            tds.append(
                Markup('<td class="{c}" title="{t}">{v}{n}</td>').format(
                    c=" ".join(classes),
                    t=f"{name}: {count} records" + (f"; flagged by {checks}" if fired else ""),
                    v="suppressed" if suppressed else _num(value),
                    n=note,
                )
            )
            details.append(_cell_facts(out, i, j, name, fired))
        rows.append(
            Markup('<tr><th scope="row">{}</th>{}</tr>').format(
                _label(row_label), Markup("").join(tds)
            )
        )
    caption = f"{out.source.replace('_', ' ')}: {out.statistic}" + (
        f" of {out.value}" if out.value else ""
    )
    corner = " × ".join(out.row_vars) + (" \\ " + " × ".join(out.col_vars) if out.col_vars else "")
    html = Markup(
        '<table class="output"><caption>{cap}</caption><thead><tr><th scope="col">{corner}</th>'
        "{head}</tr></thead><tbody>{rows}</tbody></table>"
    ).format(cap=caption, corner=corner, head=head, rows=Markup("").join(rows))
    if out.bin_edges and len(out.bin_edges) == len(out.row_labels) + 1:
        bars = []
        for i in range(len(out.row_labels)):
            v = out.values[i][0] if out.values[i] else None
            flagged = bool(by_item.get(cell_name(out, i, 0)))
            bars.append((out.bin_edges[i], out.bin_edges[i + 1], float(v or 0.0), flagged))
        html += _svg_chart(
            f"Histogram of {', '.join(out.row_vars)}",
            [],
            x_label=", ".join(out.row_vars),
            y_label=out.statistic,
            step=False,
            bars=bars,
        )
    facts_table = Markup(
        '<details open><summary>Cell facts (checkers only)</summary><table class="facts">'
        '<thead><tr><th scope="col">cell</th><th scope="col">records</th>'
        '<th scope="col">contributors</th><th scope="col">total</th>'
        '<th scope="col">largest contributions</th><th scope="col">top-1 / top-2 share</th>'
        '<th scope="col">negative</th><th scope="col">checks fired</th></tr></thead>'
        "<tbody>{}</tbody></table></details>"
    ).format(Markup("").join(details))
    return html + facts_table


def _cell_facts(out: TableOutput, i: int, j: int, name: str, fired: list[Finding]) -> Markup:
    cells = out.facts.cells

    def at(grid: list[list[Any]] | None) -> Any:
        if grid is None or i >= len(grid) or j >= len(grid[i]):
            return None
        return grid[i][j]

    top = at(cells.top) or []
    total = at(cells.total)
    share = "–"
    if top and total:
        share = f"{top[0] / total:.1%} / {sum(top[:2]) / total:.1%}"
    return Markup(
        '<tr class="{c}"><th scope="row">{n}</th><td>{cnt}</td><td>{con}</td><td>{tot}</td>'
        "<td>{top}</td><td>{share}</td><td>{neg}</td><td>{f}</td></tr>"
    ).format(
        c="flagged" if fired else "",
        n=name,
        cnt=_num(at(cells.counts)),
        con=_num(at(cells.contributors)),
        tot=_num(total),
        top=", ".join(_num(t) for t in top) or "–",
        share=share,
        neg=_num(at(cells.negative)),
        f="; ".join(f"{f.check}: {f.message}" for f in fired) or "–",
    )


def _survival(out: SurvivalOutput, findings: list[Finding]) -> Markup:
    series = []
    rows = []
    for curve in out.curves:
        name = _label(curve.labels)
        pts = [(0.0, 1.0)] + [(s.time, s.survival) for s in curve.steps]
        series.append((name, pts))
        for s in curve.steps:
            rows.append(
                Markup(
                    "<tr><td>{g}</td><td>{t}</td><td>{r}</td><td>{e}</td><td>{c}</td><td>{s}</td></tr>"
                ).format(
                    g=name,
                    t=_num(s.time),
                    r=_num(s.at_risk),
                    e=_num(s.events),
                    c=_num(s.censored),
                    s=_num(s.survival, 4),
                )
            )
    chart = _svg_chart(
        f"Kaplan-Meier survival of {out.time}",
        series,
        x_label=out.time,
        y_label="survival",
        step=True,
    )
    table = Markup(
        '<details><summary>Survival table</summary><table class="output"><thead><tr>'
        '<th scope="col">group</th><th scope="col">time</th><th scope="col">at risk</th>'
        '<th scope="col">events</th><th scope="col">censored</th><th scope="col">survival</th>'
        "</tr></thead><tbody>{}</tbody></table></details>"
    ).format(Markup("").join(rows))
    return chart + table


def _regression(out: RegressionOutput, findings: list[Finding]) -> Markup:
    rows = Markup("").join(
        Markup(
            '<tr><th scope="row">{t}</th><td>{e}</td><td>{se}</td><td>{st}</td><td>{p}</td>'
            "<td>{lo} … {hi}</td></tr>"
        ).format(
            t=c.term,
            e=_num(c.estimate),
            se=_num(c.std_error),
            st=_num(c.statistic),
            p=_num(c.p_value, 3),
            lo=_num(c.ci_low),
            hi=_num(c.ci_high),
        )
        for c in out.coefficients
    )
    facts = out.facts
    lev = facts.leverage
    lev_text = "not computed"
    if lev is not None:
        lev_text = f"max {lev.max:.4g} over {lev.n} records; largest: " + ", ".join(
            f"{h:.3g}" for h in lev.top[:10]
        )
    fit = ", ".join(f"{k} = {_num(v, 4)}" for k, v in out.fit.items())
    bins = "; ".join(
        f"{r.term}: {r.ones} ones / {r.zeros} zeros" for r in facts.regressors if r.binary
    )
    return Markup(
        '<p><code>{formula}</code> ({family})</p><table class="output"><thead><tr>'
        '<th scope="col">term</th><th scope="col">estimate</th><th scope="col">std. error</th>'
        '<th scope="col">statistic</th><th scope="col">p</th><th scope="col">95 % CI</th>'
        "</tr></thead><tbody>{rows}</tbody></table>{facts}"
    ).format(
        formula=out.formula,
        family=out.family,
        rows=rows,
        facts=_facts(
            [
                ("records", _num(out.n)),
                ("residual df", _num(out.df_resid)),
                ("model df", _num(out.df_model)),
                ("fit", fit or "–"),
                ("categorical only / saturated", f"{facts.categorical_only} / {facts.saturated}"),
                ("leverage (hat values)", lev_text),
                ("binary regressors", bins or "–"),
            ]
        ),
    )


def _summary(out: SummaryOutput, findings: list[Finding]) -> Markup:
    stats = out.statistics
    head = Markup("").join(Markup('<th scope="col">{}</th>').format(s) for s in ["n", *stats])
    rows = []
    for group in out.groups:
        for var in group.variables:
            shown = [var.stats.get(s) for s in stats]
            cells = Markup("").join(Markup("<td>{}</td>").format(_num(v)) for v in shown)
            rows.append(
                Markup('<tr><th scope="row">{g}{v}</th><td>{n}</td>{c}</tr>').format(
                    g=(_label(group.labels) + ": ") if out.by else "",
                    v=var.variable,
                    n=_num(var.n),
                    c=cells,
                )
            )
    return Markup(
        '<table class="output"><thead><tr><th scope="col">variable</th>{h}</tr></thead>'
        "<tbody>{r}</tbody></table>"
    ).format(h=head, r=Markup("").join(rows))


def _correlation(out: CorrelationOutput, findings: list[Finding]) -> Markup:
    head = Markup("").join(Markup('<th scope="col">{}</th>').format(v) for v in out.variables)
    rows = Markup("").join(
        Markup('<tr><th scope="row">{v}</th>{c}</tr>').format(
            v=v,
            c=Markup("").join(Markup("<td>{}</td>").format(_num(x, 4)) for x in row),
        )
        for v, row in zip(out.variables, out.matrix, strict=False)
    )
    return Markup(
        '<table class="output"><caption>{m} correlation, n = {n}</caption><thead><tr><td></td>'
        "{h}</tr></thead><tbody>{r}</tbody></table>"
    ).format(m=out.method, n=_num(out.n), h=head, r=rows)


def _test(out: TestOutput, findings: list[Finding]) -> Markup:
    return _facts(
        [
            ("test", out.test),
            ("statistic", _num(out.statistic)),
            ("df", _num(out.df)),
            ("p", _num(out.p_value, 4)),
            ("n", _num(out.n)),
            *((k, _num(v)) for k, v in out.details.items()),
        ]
    )


def _script(out: ScriptOutput, findings: list[Finding]) -> Markup:
    return Markup(
        '<h3>printed output: stdout and stderr ({b} bytes)</h3><pre class="stdout">{o}</pre><h3>result</h3>{r}'
    ).format(b=_num(out.facts.stdout_bytes), o=out.stdout or "(empty)", r=pretty_json(out.result))


_RENDERERS: dict[type, Callable[[Any, list[Finding]], Markup]] = {
    TableOutput: _table,
    SurvivalOutput: _survival,
    RegressionOutput: _regression,
    SummaryOutput: _summary,
    CorrelationOutput: _correlation,
    TestOutput: _test,
    ScriptOutput: _script,
}


def render_output(output: dict[str, Any] | None, findings: list[Finding]) -> Markup:
    """The output for reading, with flagged cells marked; pretty JSON when it cannot be drawn."""
    if output is None:
        return Markup('<p class="muted">no output (the run failed or has not finished)</p>')
    try:
        parsed = _OUTPUT.validate_python(output)
    except ValidationError:
        return pretty_json({k: v for k, v in output.items() if k != "facts"})
    renderer = _RENDERERS.get(type(parsed))
    if renderer is None:
        return pretty_json({k: v for k, v in output.items() if k != "facts"})
    try:
        return renderer(parsed, findings)
    except (ValueError, TypeError, IndexError, KeyError, ZeroDivisionError):
        # A shape the renderer did not foresee still gets read, as JSON.
        return pretty_json({k: v for k, v in output.items() if k != "facts"})
