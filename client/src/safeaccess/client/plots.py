"""`result.plot()`: a matplotlib figure of a released output, drawn from the released numbers only.

Histograms and DP histograms as bars over their bins (DP ones with ±1.96 standard-error whiskers),
DP means as the means c + S / n with their delta-method standard errors (not the noisy sums and
count they are computed from), DP counts and sums as their noisy estimates,
frequency and magnitude tables as grouped bars, regressions as coefficients with 95 % intervals,
survival tables as Kaplan–Meier step curves, trained models as their released ROC curve (else
their test metrics). matplotlib
is optional: install it (or the client's `plot` extra) to plot.
"""

from __future__ import annotations

import math
from typing import Any, Protocol

from safeaccess.client.dpresult import DPResult
from safeaccess.client.missing_values import missing_note

Z95 = 1.959963984540054


class StepResult(Protocol):
    """What a plot reads of a step's result (`safeaccess.client.results.StepResult`): read
    through this protocol so that the results module, which draws through this one, is not
    imported back."""

    @property
    def index(self) -> int: ...

    @property
    def status(self) -> str: ...

    @property
    def output(self) -> dict[str, Any] | None: ...

    def frame(self) -> Any: ...


def _pyplot() -> Any:
    try:
        import matplotlib.pyplot as plt
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            "plotting needs matplotlib: pip install matplotlib (or the client's 'plot' extra)"
        ) from exc
    return plt


def _axes(ax: Any) -> Any:
    if ax is not None:
        return ax
    _, new = _pyplot().subplots(figsize=(7, 4))
    return new


def _label(labels: list[Any]) -> str:
    return ", ".join(str(v) for v in labels) or "all"


def _table(result: StepResult, out: dict[str, Any], ax: Any) -> Any:
    frame = result.frame()
    histogram = out.get("source") == "histogram"
    if frame.columns.size == 1 or histogram:
        # One series per row label for a histogram by groups: the bins are the columns.
        data = frame.T if histogram and frame.shape[0] > 1 else frame
        data = data.astype("float64")
        data.plot.bar(ax=ax, legend=data.shape[1] > 1, width=0.9 if histogram else 0.8)
    else:
        frame.astype("float64").plot.bar(ax=ax)
    what = out.get("value") or "records"
    ax.set_ylabel(f"{out.get('statistic', 'count')} of {what}")
    ax.set_title(f"step {result.index}: {out.get('source', 'table').replace('_', ' ')}")
    return ax


def _dp_means(result: StepResult, dp: DPResult, ax: Any) -> Any:
    """A dp_mean: each variable's mean per group with ±1.96 delta-method standard errors (NaN, so
    no bar, where the noisy count was not positive and no mean was released)."""
    rows = dp.means()
    names = list(dict.fromkeys(r["variable"] for r in rows))
    width = 0.8 / max(1, len(dp.groups))
    for g, labels in enumerate(dp.groups):
        mine = rows[g * len(names) : (g + 1) * len(names)]
        offset = (g - (len(dp.groups) - 1) / 2) * width
        ax.bar(
            [p + offset for p in range(len(names))],
            [math.nan if r["mean"] is None else r["mean"] for r in mine],
            width=width,
            yerr=[math.nan if r["std_error"] is None else Z95 * r["std_error"] for r in mine],
            capsize=2,
            label=_label(labels) if labels else None,
        )
    ax.set_xticks(list(range(len(names))), names, rotation=45, ha="right")
    ax.set_ylabel("mean")
    if any(dp.groups):
        ax.legend()
    ax.set_title(f"step {result.index}: dp_mean (noisy means, ±95 % interval)")
    return ax


def _dp(result: StepResult, dp: DPResult, ax: Any) -> Any:
    if dp.kind == "dp_mean":
        return _dp_means(result, dp, ax)
    estimates, errors = dp.estimates(), dp.standard_errors()
    width = 0.8 / max(1, len(estimates))
    positions = range(len(dp.components))
    for g, (est, se) in enumerate(zip(estimates, errors, strict=True)):
        offset = (g - (len(estimates) - 1) / 2) * width
        ax.bar(
            [p + offset for p in positions],
            est,
            width=width,
            yerr=[Z95 * s for s in se],
            capsize=2,
            label=_label(dp.groups[g]) if dp.groups[g] else None,
        )
    ax.set_xticks(list(positions), dp.components, rotation=45, ha="right")
    if any(dp.groups):
        ax.legend()
    ax.set_title(f"step {result.index}: {dp.kind} (noisy, ±95 % interval)")
    return ax


def _regression(result: StepResult, out: dict[str, Any], ax: Any) -> Any:
    rows = [c for c in out["coefficients"] if c["term"] != "Intercept"] or out["coefficients"]
    terms = [c["term"] for c in rows]
    estimates = [c["estimate"] for c in rows]
    half = [Z95 * (c["std_error"] or 0.0) for c in rows]
    ax.errorbar(estimates, range(len(rows)), xerr=half, fmt="o", capsize=3)
    ax.axvline(0.0, color="grey", linewidth=0.8)
    ax.set_yticks(range(len(rows)), terms)
    ax.set_xlabel("estimate (95 % interval)")
    ax.set_title(f"step {result.index}: {out['family']} {out['formula']}")
    return ax


def _survival(result: StepResult, out: dict[str, Any], ax: Any) -> Any:
    for curve in out["curves"]:
        times = [0.0] + [s["time"] for s in curve["steps"]]
        values = [1.0] + [s["survival"] for s in curve["steps"]]
        ax.step(times, values, where="post", label=_label(curve["labels"]))
    ax.set_ylim(0.0, 1.05)
    ax.set_xlabel(out["time"])
    ax.set_ylabel("survival")
    if out.get("by"):
        ax.legend()
    ax.set_title(f"step {result.index}: Kaplan–Meier estimate")
    return ax


def _roc(result: StepResult, out: dict[str, Any], ax: Any) -> Any:
    points = out["roc"]
    ax.plot([p["fpr"] for p in points], [p["tpr"] for p in points], marker="o", label="model")
    ax.plot([0.0, 1.0], [0.0, 1.0], color="grey", linewidth=0.8, linestyle="--", label="chance")
    ax.set_xlim(0.0, 1.0)
    ax.set_ylim(0.0, 1.0)
    ax.set_xlabel("false positive rate")
    ax.set_ylabel("true positive rate")
    auc = out["metrics"].get("roc_auc")
    ax.set_title(
        f"step {result.index}: ROC of {out['family']}"
        + (f" (AUC {auc:.3f} on the test split)" if auc is not None else "")
    )
    ax.legend(loc="lower right")
    return ax


def _model(result: StepResult, out: dict[str, Any], ax: Any) -> Any:
    if out.get("roc"):
        return _roc(result, out, ax)
    metrics = {k: v for k, v in out["metrics"].items() if v is not None}
    ax.bar(list(metrics), list(metrics.values()))
    ax.set_ylim(0.0, 1.0)
    ax.set_title(f"step {result.index}: {out['family']} test metrics (n = {out['n_test']})")
    return ax


def plot_result(result: StepResult, ax: Any = None) -> Any:
    """Draw the released output of `result` on `ax` (a new figure's axes by default); returns
    the axes. Raises ValueError for a step with nothing released or nothing to draw."""
    out = result.output
    if out is None:
        raise ValueError(f"step {result.index} is {result.status}: nothing was released to plot")
    kind = out.get("type")
    drawers = {"table", "dp_answer", "regression", "survival", "model"}
    if kind not in drawers or (kind == "dp_answer" and out.get("kind") == "dp_mean_test"):
        raise ValueError(
            f"a {kind} output has no plot; plots exist for tables and histograms, DP answers, "
            "regressions, survival tables and trained models"
        )
    ax = _axes(ax)
    if kind == "table":
        drawn = _table(result, out, ax)
    elif kind == "dp_answer":
        drawn = _dp(result, DPResult(out), ax)
    elif kind == "regression":
        drawn = _regression(result, out, ax)
    elif kind == "survival":
        drawn = _survival(result, out, ax)
    else:
        drawn = _model(result, out, ax)
    return _caption(drawn, out)


def _caption(ax: Any, out: dict[str, Any]) -> Any:
    """The records left out for a missing value (and that none was imputed), under the plot."""
    note = missing_note(out)
    if note is not None:
        ax.annotate(
            note,
            xy=(0.0, 0.0),
            xycoords="figure fraction",
            xytext=(4, 4),
            textcoords="offset points",
            fontsize=7,
            wrap=True,
        )
    return ax


__all__ = ["plot_result"]
