"""Compact HTML cards for notebooks: what `_repr_html_` of a plan, a step result, a list of
results, a released model, a rehearsal and a DP answer shows (the sealed sequence draws its own,
`protocol.sealed.sealed_html`, re-exported here).

Each renderer reads the thing it shows through a protocol of `cards.py`, never by importing its
type: the types import this module to draw themselves, so the dependency runs one way.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from safeaccess.client.cards import (
    MAX_ROWS,
    DPCard,
    ModelCard,
    PlanCard,
    RehearsalCard,
    StepCard,
    badge,
    card,
    esc,
    frame_html,
    json_block,
    rows,
)
from safeaccess.client.protocol.sealed import sealed_html


def plan_html(plan: PlanCard) -> str:
    items = "".join(
        f"<li><code>{esc(a.kind)}</code> "
        f"<span style='color:#57606a'>{esc(_brief(a.model_dump(mode='json')))}</span></li>"
        for a in plan
    )
    body = f"<ol>{items}</ol>" if items else "<em>no analyses yet</em>"
    return card("plan", f"Plan on {esc(plan.dataset)}: {len(plan)} analyses", body)


def _brief(body: dict[str, Any]) -> str:
    shown = {k: v for k, v in body.items() if k != "kind" and v not in (None, [], {}, "")}
    return ", ".join(f"{k}={json.dumps(v, default=str)}" for k, v in shown.items())[:300]


def step_html(result: StepCard) -> str:
    on = f" on {esc(result.dataset_label)}" if result.dataset_label else ""
    title = f"Step {result.index} <code>{esc(result.kind or 'analysis')}</code>{on} " + badge(
        result.status
    )
    parts = []
    if result.reasons and not result.released:
        parts.append("<ul>" + "".join(f"<li>{esc(r)}</li>" for r in result.reasons) + "</ul>")
    if result.failed:
        parts.append(f"<p>{esc(result.error_code)}: {esc(result.error_message)}</p>")
    if result.review_note:
        parts.append(f"<p>output checker: {esc(result.review_note)}</p>")
    if result.output is not None:
        parts.append(_output_html(result))
    if result.withhold_budget is not None:
        parts.append(f"<p style='color:#57606a'>{esc(result.withhold_budget)}</p>")
    return card("step", title, "".join(parts))


#: Synthetic records shown in a card's preview.
PREVIEW_ROWS = 10


def synthetic_html(output: dict[str, Any], data: bytes | None) -> str:
    """A released synthetic_data output: the privacy figures, the file and a preview of the
    records (instead of the whole output as JSON)."""
    from safeaccess.client.synthetic_result import INSTALL_HINT, read_records

    privacy = output.get("privacy", {})
    file = output.get("file", {})
    pairs: list[tuple[str, object]] = [
        (
            "privacy",
            f"μ = {privacy.get('mu'):.4g} (ε = {privacy.get('epsilon'):.4g} at "
            f"δ = {privacy.get('delta'):.3g}), method {privacy.get('method')}",
        ),
        (
            "noise sd",
            f"one-way marginals σ = {privacy.get('sigma_oneway'):.4g}, "
            f"cliques σ = {privacy.get('sigma_cliques'):.4g}",
        ),
        ("tree", ", ".join(f"{a}–{b}" for a, b in privacy.get("tree", [])) or "none"),
        ("records", f"{file.get('rows')} synthetic rows, {file.get('bytes')} bytes of Parquet"),
        ("SHA-256", file.get("sha256")),
        ("measurements", f"{len(output.get('measurements', []))} noisy marginals released"),
    ]
    body = rows(pairs)
    if data is None:
        return (
            body + "<p>the records are not attached: fetch them with session.synthetic(result)</p>"
        )
    try:
        frame = read_records(data)
    except ImportError:
        return (
            body + f"<p>a preview of the records needs pandas and pyarrow: {esc(INSTALL_HINT)}</p>"
        )
    body += f"<p>first {min(PREVIEW_ROWS, len(frame))} of {len(frame)} synthetic records:</p>"
    return body + frame_html(frame.head(PREVIEW_ROWS))


def _output_html(result: StepCard) -> str:
    if result.output is not None and result.output.get("type") == "synthetic_data":
        return synthetic_html(result.output, result.file_data)
    try:
        frame = result.frame()
    except ImportError:
        frame = None
    body = frame_html(frame) if frame is not None else json_block(result.output)
    if frame is not None and frame.attrs:
        body += rows([(k, v) for k, v in frame.attrs.items()])
    dp = result.dp
    if dp is not None:
        body += f"<pre>{esc(dp.describe())}</pre>"
    return body


def results_html(results: Sequence[StepCard]) -> str:
    if not results:
        return card("results", "No step has run", "")
    head = "".join(
        f"<tr><td>{r.index}</td><td><code>{esc(r.kind)}</code></td><td>{badge(r.status)}</td></tr>"
        for r in results
    )
    summary = f"<table><tr><th>step</th><th>kind</th><th>verdict</th></tr>{head}</table>"
    title = f"Sequence {esc(results[0].sequence_id)}: {len(results)} steps revealed"
    return card("results", title, summary + "".join(step_html(r) for r in results))


def predictor_html(model: ModelCard) -> str:
    out = model.output
    pairs: list[tuple[str, object]] = [
        ("family", out.get("family")),
        ("target", f"{out.get('target')} ({', '.join(str(c) for c in model.classes)})"),
        ("features", ", ".join(str(f.get("name", f)) for f in out.get("features", []))),
        ("trained on", f"{out.get('n_train')} records; tested on {out.get('n_test')}"),
    ]
    pairs += [(k, v) for k, v in (out.get("metrics") or {}).items()]
    if out.get("roc"):
        pairs.append(("ROC curve", f"{len(out['roc'])} points on the test split (result.roc())"))
    return card("model", "Released model", rows(pairs))


def rehearsal_html(report: RehearsalCard) -> str:
    rows = []
    for step in report.steps:
        if step.refused:
            verdict = badge("refused")
            detail = "<br>".join(esc(r) for r in step.refused)
        elif step.mock_verdict == "not_rehearsed":
            verdict, detail = badge("not rehearsed"), esc(step.note or "")
        else:
            verdict = badge(step.mock_verdict)
            detail = "<br>".join(esc(c) for c in step.checks)
            if not detail:
                # Never "passed every check" beside a withhold: say why it was not released.
                detail = (
                    "passed every check on the mock" + (f"; {esc(step.note)}" if step.note else "")
                    if step.mock_verdict == "release"
                    else esc(step.note or f"{step.mock_verdict} on the mock")
                )
        rows.append(
            f"<tr><td>{step.index}</td><td><code>{esc(step.kind)}</code></td>"
            f"<td>{verdict}</td><td>{detail}</td></tr>"
        )
    notes = "".join(f"<li>{esc(n)}</li>" for n in report.notes)
    offline = (
        f"<p><strong>Offline</strong>: the centre could not be reached; rehearsed on this "
        f"machine on the {esc(report.mock_source)}, with the catalogue and rules cached at the "
        "last connection. DP requests meet your DP budget only when you seal.</p>"
        if report.offline
        else ""
    )
    body = (
        offline
        + f"<p><strong>{esc(report.disclaimer)}</strong></p>"
        + (f"<ul>{notes}</ul>" if notes else "")
        + "<table><tr><th>step</th><th>kind</th><th>on the mock</th><th>why</th></tr>"
        + "".join(rows)
        + "</table>"
    )
    title = (
        f"Rehearsal on a mock of {esc(report.dataset)} ({report.mock_rows} mock rows, "
        f"rules {esc(report.ruleset)})"
    )
    return card("rehearsal", title, body)


def _dp_table(dp: DPCard) -> str:
    """The noisy estimates ± their standard errors, one row per group (plain HTML: no pandas)."""
    try:
        estimates, errors = dp.estimates(), dp.standard_errors()
    except (KeyError, ValueError, ZeroDivisionError):
        return ""
    head = "".join(f"<th>{esc(c)}</th>" for c in dp.components)
    rows = "".join(
        f"<tr><th>{esc(', '.join(str(v) for v in group) or 'all')}</th>"
        + "".join(f"<td>{e:.4g} ± {s:.3g}</td>" for e, s in zip(est, se, strict=True))
        + "</tr>"
        for group, est, se in zip(dp.groups, estimates, errors, strict=True)
    )
    return f"<table class='dp'><tr><th>group</th>{head}</tr>{rows}</table>"


def _dp_means(dp: DPCard) -> str:
    """A dp_mean's means (with their standard errors, carrying both noises), the noisy count of
    the records they rest on and of those left out for a missing value."""
    if dp.kind != "dp_mean":
        return ""
    try:
        rows = dp.means()
    except (KeyError, ValueError, ZeroDivisionError):
        return ""

    def num(v: float | None, fmt: str) -> str:
        return "—" if v is None else format(v, fmt)

    body = "".join(
        f"<tr><th>{esc(', '.join(str(v) for v in r['group']) or 'all')}</th>"
        f"<td>{esc(r['variable'])}</td><td>{num(r['mean'], '.6g')} ± "
        f"{num(r['std_error'], '.3g')}</td><td>{num(r['count'], '.0f')}</td>"
        f"<td>{num(r['missing'], '.0f')}</td></tr>"
        for r in rows
    )
    return (
        "<table class='dp'><tr><th>group</th><th>variable</th><th>mean ± SE</th>"
        "<th>records used</th><th>left out (missing)</th></tr>" + body + "</table>"
    )


def dp_html(dp: DPCard) -> str:
    body = _dp_means(dp) + _dp_table(dp) + f"<pre>{esc(dp.describe())}</pre>"
    return card("dp", f"DP answer <code>{esc(dp.kind)}</code>", body)


__all__ = [
    "MAX_ROWS",
    "badge",
    "card",
    "dp_html",
    "esc",
    "frame_html",
    "plan_html",
    "predictor_html",
    "rehearsal_html",
    "results_html",
    "sealed_html",
    "step_html",
]
