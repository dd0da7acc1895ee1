"""Kaplan-Meier survival curves -> SurvivalOutput.

The product-limit estimate is computed by hand (it is a running product over the event times),
with Greenwood's standard error as statsmodels' `SurvfuncRight` gives it (the rules tests check
the two agree) and the usual pointwise log(-log) 95 % interval. Steps are the event times (after pooling by
`interval` and ending at `max_time`).

Query set: one partition of the records behind a curve, two cells per step: the events at the
step's time and the records censored from that time until the next step (or later, after the
last). Every released count is a sum of these cells (at risk at step i = every cell from step i
on) and every cell a difference of released counts, so the auditor sees exactly what the curve
reveals. Records censored before the first event are behind no released count (-1).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from safeaccess.client.analyses import Survival
from safeaccess.client.metadata import DatasetMetadata
from safeaccess.rules.outputs import (
    SurvivalCurve,
    SurvivalCurveFacts,
    SurvivalFacts,
    SurvivalOutput,
    SurvivalStep,
    SurvivalStepFacts,
)
from safeaccess.sandbox.runner.compute import missing
from safeaccess.sandbox.runner.compute._common import (
    AnalysisError,
    fnum,
    label_text,
    numeric_values,
    query_set,
    require_columns,
)
from safeaccess.sandbox.runner.compute._common import (
    group as group_records,
)

Z95 = 1.959963984540054
# More steps than this in one curve is almost certainly un-pooled continuous time.
MAX_STEPS = 10_000


def _prepared_times(
    analysis: Survival, time: np.ndarray, event: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(usable, time, event): records with a time and a 0/1 event, times pooled and capped."""
    usable = ~np.isnan(time) & ((event == 0) | (event == 1))
    t = time.copy()
    died = event == 1
    if analysis.max_time is not None:
        # Administrative censoring: past max_time nobody is followed any more.
        late = t > analysis.max_time
        died = died & ~late
        t = np.where(late, analysis.max_time, t)
    if analysis.interval is not None:
        # Rounded so that e.g. 3 * 0.1 reads 0.3 (no float noise in the released times).
        t = np.round(np.ceil(t / analysis.interval) * analysis.interval, 10)
    return usable, t, died


def _curve(
    t: np.ndarray, died: np.ndarray, positions: np.ndarray, cells: np.ndarray, first_cell: int
) -> tuple[list[SurvivalStep], list[SurvivalStepFacts]]:
    """Steps of one curve from its records' times and events; writes each record's cell."""
    event_times = np.unique(t[died])
    if event_times.size > MAX_STEPS:
        raise AnalysisError(
            "too_many_cells",
            f"the survival curve would have more than {MAX_STEPS} steps; pool times with "
            "'interval'",
        )
    order = np.sort(t)
    steps: list[SurvivalStep] = []
    facts: list[SurvivalStepFacts] = []
    survival, greenwood = 1.0, 0.0
    # The step a record falls in: the last event time at or before its time (-1 before the first).
    step_of = np.searchsorted(event_times, t, side="right") - 1
    for i, when in enumerate(event_times):
        at_risk = int(order.size - np.searchsorted(order, when, side="left"))
        events = int(np.count_nonzero(died & (t == when)))
        in_step = step_of == i
        censored = int(np.count_nonzero(in_step)) - events
        survival *= 1.0 - events / at_risk
        if at_risk > events:
            greenwood += events / (at_risk * (at_risk - events))
        se = survival * math.sqrt(greenwood) if at_risk > events else None
        low = high = None
        if se is not None and 0.0 < survival < 1.0:
            # log(-log S) interval, as SurvfuncRight's default.
            spread = Z95 * math.sqrt(greenwood) / abs(math.log(survival))
            log_minus_log = math.log(-math.log(survival))
            low = math.exp(-math.exp(log_minus_log + spread))
            high = math.exp(-math.exp(log_minus_log - spread))
        steps.append(
            SurvivalStep(
                time=float(when),
                at_risk=at_risk,
                events=events,
                censored=censored,
                survival=survival,
                std_error=fnum(se),
                ci_low=fnum(low),
                ci_high=fnum(high),
            )
        )
        facts.append(
            SurvivalStepFacts(time=float(when), at_risk=at_risk, events=events, censored=censored)
        )
        base = first_cell + 2 * i
        cells[positions[in_step & died]] = base
        cells[positions[in_step & ~died]] = base + 1
    return steps, facts


def survival(
    analysis: Survival, frame: pd.DataFrame, metadata: DatasetMetadata, n_records: int
) -> SurvivalOutput:
    """Kaplan-Meier curves of `time` with `event`, one per level combination of `by`."""
    names = [analysis.time, analysis.event, *analysis.by]
    if len(set(names)) != len(names):
        raise AnalysisError("bad_analysis", "time, event and 'by' must be different variables")
    require_columns(frame, names)
    time = numeric_values(frame, analysis.time)
    event = numeric_values(frame, analysis.event)
    usable, t, died = _prepared_times(analysis, time, event)
    groups = group_records(frame, list(analysis.by), metadata)
    group_of = np.where(usable, groups.codes, -1)
    cells = np.full(len(frame), -1, dtype=np.int64)  # per row of the filtered frame
    rows = np.arange(len(frame))
    curves: list[SurvivalCurve] = []
    curve_facts: list[SurvivalCurveFacts] = []
    cell_names: list[str] = []
    for g, labels in enumerate(groups.labels):
        mine = group_of == g
        steps, facts = _curve(t[mine], died[mine], rows[mine], cells, len(cell_names))
        curves.append(SurvivalCurve(labels=labels, steps=steps))
        curve_facts.append(SurvivalCurveFacts(labels=labels, steps=facts))
        group = label_text(labels)
        for i, step in enumerate(steps):
            until = f"{steps[i + 1].time:g}" if i + 1 < len(steps) else "end"
            cell_names += [
                f"{group}: events at {step.time:g}",
                f"{group}: censored from {step.time:g} to {until}",
            ]
    # Per curve, its records without a time or a 0/1 event; then those in no curve.
    left_out, left_out_sets = missing.joined(
        missing.per_group(
            [analysis.time, analysis.event], ~usable, groups.codes, groups.labels, frame, n_records
        ),
        missing.keys(list(analysis.by), frame, metadata, n_records),
    )
    return SurvivalOutput(
        time=analysis.time,
        event=analysis.event,
        by=list(analysis.by),
        curves=curves,
        missing=left_out,
        facts=SurvivalFacts(
            missing_query_sets=left_out_sets,
            curves=curve_facts,
            query_set=query_set(cell_names, frame, cells, n_records),
            n_total=int(np.count_nonzero(group_of >= 0)),
        ),
    )
