"""Synthetic data in the sandbox: exact count tables (job 1) and the disclosure check (job 2).

Job 1 codes every selected record over the declared levels or bins of the workload
(`safeaccess.client.synthetic`; a date column by its day number in calendar bins) and returns
the exact count of every cell of every table. The shapes come from the metadata only; nothing
returned depends on the data but the counts, which the server noises. Job 2 receives the
synthetic records (codes) the server sampled from the noisy tables, codes the real selection the
same way and runs every check of `safeaccess.rules.synthetic`; its numbers are facts for
checkers only.

A value outside the declared levels, or a missing value in a non-nullable column, is an error as
at registration: the metadata is wrong, and guessing a code would corrupt the tables.
"""

from __future__ import annotations

import base64
import math
from typing import Any

import numpy as np
import pandas as pd
from numpy.typing import NDArray

from safeaccess.client.analyses import SyntheticData
from safeaccess.client.metadata import DatasetMetadata
from safeaccess.client.synthetic import (
    EPOCH_ORDINAL,
    SynthColumn,
    SynthInvalid,
    SynthWorkload,
    synth_workload,
)
from safeaccess.rules.outputs import (
    SynthCheckFacts,
    SynthCheckOutput,
    SynthTablesFacts,
    SynthTablesOutput,
)
from safeaccess.sandbox.runner.compute._common import AnalysisError, require_columns, to_label
from safeaccess.sandbox.runner.compute.dp import limit_units
from safeaccess.sandbox.runner.date_parts import as_dates

IntArray = NDArray[np.int64]


def workload_of(analysis: SyntheticData, metadata: DatasetMetadata) -> SynthWorkload:
    try:
        return synth_workload(analysis, metadata, max_cells=2**62, max_model_cells=2**62)
    except SynthInvalid as exc:
        raise AnalysisError("bad_analysis", str(exc)) from exc


def _missing(values: pd.Series) -> NDArray[np.bool_]:
    return values.isna().to_numpy()


def numeric_values(values: pd.Series) -> NDArray[np.float64]:
    return pd.to_numeric(values, errors="coerce").to_numpy(dtype=np.float64)


def day_numbers(values: pd.Series) -> NDArray[np.float64]:
    """A date column's days as the workload codes them (proleptic ordinals), NaN where missing;
    read as the date parts read it (datetime64, Python dates or 'YYYY-MM-DD' text)."""
    dates = as_dates(values)
    days = dates.to_numpy().astype("datetime64[D]").astype(np.int64)
    return np.where(dates.isna().to_numpy(), np.nan, (days + EPOCH_ORDINAL).astype(np.float64))


def code_column(values: pd.Series, col: SynthColumn) -> IntArray:
    """Codes 0..size-1 of one column: level index or bin index, the null code for missing."""
    missing = _missing(values)
    codes = np.zeros(len(values), dtype=np.int64)
    if col.levels is not None:
        lookup: dict[Any, int] = {}
        for j, level in enumerate(col.levels):
            lookup.setdefault(level, j)
            lookup.setdefault(str(level), j)
        raw = values.astype(object).to_numpy()
        for i in np.flatnonzero(~missing):
            label = to_label(raw[i])
            found = lookup.get(label, lookup.get(str(label)))
            if found is None:
                raise AnalysisError(
                    "synth_undeclared_value",
                    f"column {col.name} holds a value outside its declared levels; the "
                    "controller must correct the metadata",
                )
            codes[i] = found
    else:
        assert col.edges is not None and col.bounds is not None
        x = day_numbers(values) if col.type == "date" else numeric_values(values)
        missing = missing | np.isnan(x)
        x = np.clip(np.nan_to_num(x, nan=col.bounds[0]), col.bounds[0], col.bounds[1])
        edges = np.asarray(col.edges)
        # bins [e_i, e_i+1), the last closed; values outside the edges go to the nearest bin
        codes = np.clip(np.searchsorted(edges, x, side="right") - 1, 0, len(edges) - 2)
    if missing.any():
        if col.null_code is None:
            raise AnalysisError(
                "synth_undeclared_value",
                f"column {col.name} holds missing values but is declared non-nullable; the "
                "controller must correct the metadata",
            )
        codes[missing] = col.null_code
    return codes.astype(np.int64)


def code_records(frame: pd.DataFrame, work: SynthWorkload) -> IntArray:
    """The records as codes, records x workload columns."""
    require_columns(frame, list(work.names))
    if not work.columns:
        return np.zeros((len(frame), 0), dtype=np.int64)
    return np.stack([code_column(frame[c.name], c) for c in work.columns], axis=1)


def count_tables(codes: IntArray, work: SynthWorkload) -> list[list[float]]:
    """Exact counts of every table of the workload, flat in C order over the clique's columns."""
    out = []
    for clique in work.tables:
        flat = np.zeros(codes.shape[0], dtype=np.int64)
        for i in clique:
            flat = flat * work.columns[i].size + codes[:, i]
        out.append(np.bincount(flat, minlength=work.cells(clique)).astype(np.float64).tolist())
    return out


def synthetic_tables(
    analysis: SyntheticData, frame: pd.DataFrame, metadata: DatasetMetadata, n_records: int
) -> SynthTablesOutput:
    """Job 1: the exact count tables of the workload over the selected records (at most
    `max_records_per_unit` per contributor unit). An empty selection answers zeros."""
    work = workload_of(analysis, metadata)
    frame = limit_units(frame, metadata)
    codes = code_records(frame, work)
    return SynthTablesOutput(
        columns=list(work.names), facts=SynthTablesFacts(tables=count_tables(codes, work))
    )


def encode_codes(codes: IntArray) -> str:
    """Synthetic codes for the check job's request (little-endian int32, base64)."""
    return base64.b64encode(np.ascontiguousarray(codes, dtype="<i4").tobytes()).decode("ascii")


def decode_codes(text: str, columns: int) -> IntArray:
    raw = np.frombuffer(base64.b64decode(text.encode("ascii"), validate=True), dtype="<i4")
    if columns < 1 or raw.size % columns:
        raise AnalysisError("bad_analysis", "the synthetic codes do not fill whole records")
    return raw.reshape(-1, columns).astype(np.int64)


def _feature_specs(work: SynthWorkload) -> list[tuple[float, float] | int]:
    specs: list[tuple[float, float] | int] = []
    for col in work.columns:
        if col.edges is not None and col.bounds is not None and col.bounds[1] > col.bounds[0]:
            specs.append((float(col.bounds[0]), float(col.bounds[1])))
        else:
            specs.append(col.size)
    return specs


def _feature_values(codes: IntArray, work: SynthWorkload) -> NDArray[np.float64]:
    """Numeric columns at their bin midpoints (null at the middle of the bounds); other
    columns keep their codes (one-hot in `distance_features`)."""
    out = codes.astype(np.float64)
    for i, col in enumerate(work.columns):
        if col.edges is None or col.bounds is None or col.bounds[1] <= col.bounds[0]:
            continue
        edges = np.asarray(col.edges)
        mids = np.append((edges[:-1] + edges[1:]) / 2, sum(col.bounds) / 2)
        out[:, i] = mids[codes[:, i]]
    return out


def _plain(value: Any) -> Any:
    """Dataclasses and numpy values as JSON-ready data (the check's facts)."""
    from dataclasses import asdict, is_dataclass

    if is_dataclass(value) and not isinstance(value, type):
        return _plain(asdict(value))
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, np.ndarray):
        return _plain(value.tolist())
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, float | np.floating):
        v = float(value)
        return v if math.isfinite(v) else None
    return value


def synthetic_check(
    request: dict[str, Any], frame: pd.DataFrame, metadata: DatasetMetadata
) -> SynthCheckOutput:
    """Job 2: every disclosure check of the synthetic codes in `request` against the real
    selection, and the verdict of the `synth_*` rules in `request["rules"]`."""
    from safeaccess.rules.synthetic import SynthRules, distance_features, run_checks, verdict

    analysis = SyntheticData.model_validate(request["analysis"])
    work = workload_of(analysis, metadata)
    rules = SynthRules.from_mapping(request.get("rules", {}))
    syn = decode_codes(str(request["synthetic"]), len(work.columns))
    if analysis.where is not None and analysis.where.strip():
        from safeaccess.sandbox.runner.filters import row_mask

        frame = frame.loc[row_mask(frame, analysis.where)]
    real = code_records(frame, work)
    if real.shape[0] < 2 or syn.shape[0] < 1:
        # Too few records to compare: the check cannot run, so the rules' error action applies.
        from safeaccess.rules.synthetic import decide

        out = decide(rules, check_error="too few records to run the disclosure checks")
        return SynthCheckOutput(
            facts=SynthCheckFacts(
                verdict=out.action,
                outcomes=[{k: str(v) for k, v in _plain(o).items()} for o in out.outcomes],
                checks={"n_real": int(real.shape[0]), "n_syn": int(syn.shape[0])},
                error="too few records",
            )
        )
    specs = _feature_specs(work)
    categorical = [c.levels is not None and c.type == "categorical" for c in work.columns]
    facts = run_checks(
        real,
        syn,
        [c.size for c in work.columns],
        list(work.keys),
        list(work.targets),
        real_features=distance_features(_feature_values(real, work), specs),
        syn_features=distance_features(_feature_values(syn, work), specs),
        rules=rules,
        categorical=categorical,
        seed=int(request.get("seed", 0)),
        # every column one-hot: DCR by the exact Hamming search instead of brute-force distances
        one_hot=all(isinstance(spec, int) for spec in specs),
    )
    result = verdict(facts, rules)
    checks = _plain(facts)
    checks["n_real"] = int(real.shape[0])
    checks["n_syn"] = int(syn.shape[0])
    return SynthCheckOutput(
        facts=SynthCheckFacts(
            verdict=result.action,
            outcomes=[{k: str(v) for k, v in _plain(o).items()} for o in result.outcomes],
            checks=checks,
        )
    )
