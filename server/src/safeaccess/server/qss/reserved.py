"""The standard tables a scope reserves before any output: one for each declared categorical
column and one for each pair of them.

Without them, the first release in a scope decides what every later one may be: one
researcher's count of "everyone but the 10 women of an 18-person cell" is released (the 10
women are k), and a colleague's ordinary region x ethnicity table is then the refused release
(its cell minus those women leaves 8 men), withheld on her own budget. So each scope admits,
right after a version's population and before any output, the one- and two-way frequency tables
of the version's declared categorical columns, as a researcher can be released them (a
one-way table with cells below k as suppression releases it, a two-way one only without such
cells: `universe._reserved_set`). A later release that conflicts with them is the refused one,
whoever makes it; the same tables asked again by anyone are repeats by definition and stay
released. Reserving a table only makes the auditor stricter (it is treated as released), never
more lenient.

Bounds: the first `RESERVED_COLUMNS` declared categorical (and ordinal) columns with at most
`MAX_LEVELS` declared levels, so at most 8 + 28 = 36 tables per version; they are computed
once per version and process with the runner's own code (`run_request`), from the version's
Parquet file (its categorical columns only).
"""

from __future__ import annotations

from itertools import combinations
from pathlib import Path

import numpy as np
import pandas as pd

from safeaccess.client.analyses import FrequencyTable
from safeaccess.client.metadata import DatasetMetadata
from safeaccess.rules.outputs import Output, TableOutput, query_set_of
from safeaccess.sandbox.backend import RunnerRequest
from safeaccess.sandbox.runner import run_request
from safeaccess.server.qss.grid import output_labels
from safeaccess.server.qss.universe import Reserved

#: Most declared categorical columns whose tables are reserved (in declaration order).
RESERVED_COLUMNS = 8
#: A column with more declared levels than this is not reserved (its cells are mostly small).
MAX_LEVELS = 50


def reserved_columns(metadata: DatasetMetadata) -> list[str]:
    """The columns whose one- and two-way tables a scope reserves."""
    names = [
        c.name
        for c in metadata.columns
        if c.type in ("categorical", "ordinal")
        and c.levels
        and len(c.levels) <= MAX_LEVELS
        and not c.contributor
    ]
    return names[:RESERVED_COLUMNS]


def _specs(metadata: DatasetMetadata) -> list[FrequencyTable]:
    """The standard tables' analyses: one-way tables first, then every pair in declaration
    order."""
    names = reserved_columns(metadata)
    specs = [FrequencyTable(rows=[n]) for n in names]
    return specs + [FrequencyTable(rows=[a], cols=[b]) for a, b in combinations(names, 2)]


def _name(spec: FrequencyTable) -> str:
    return "*".join([*spec.rows, *spec.cols])


def reserved_names(metadata: DatasetMetadata) -> list[str]:
    """The names of the standard tables a shared scope of this metadata considers reserving
    (`region`, `region*sex`, ...): published in the catalogue, as they follow from the
    metadata alone. Which of them are reserved also depends on their cells (`_reserved_set`
    in `universe.py`: a two-way table with a cell below k is not)."""
    return [_name(spec) for spec in _specs(metadata)]


def reserved_tables(frame: pd.DataFrame, metadata: DatasetMetadata) -> list[Reserved]:
    """The reserved tables of one version (`frame`: its rows in stored order, at least the
    `reserved_columns`), one-way tables first, then every pair in declaration order."""
    specs = _specs(metadata)
    dumped = metadata.model_dump(mode="json")
    out = []
    for spec in specs:
        analysis = spec.model_dump(mode="json")
        request = RunnerRequest(analysis=analysis, metadata=dumped, dataset_path="reserved")
        response = run_request(request, frame)
        output = response.output if response.ok else None
        qs = None if output is None else query_set_of(output)
        if output is None or qs is None or not qs.attached:
            continue  # nothing the auditor could reserve (the runner refused the table)
        name = _name(spec)
        cells = np.asarray(qs.to_array(), dtype=np.int32)
        out.append(Reserved(name, analysis, output_labels(output), cells, _width(output)))
    return out


def _width(output: Output) -> int:
    """The number of body columns of a table's query-set cells (as `qss/gate.py` reads a
    suppressed table: cell i is row i // width, column i % width)."""
    if not isinstance(output, TableOutput):
        return 1
    return max(len(output.col_labels) - (1 if output.margins and output.col_vars else 0), 1)


def read_reserved(parquet: Path, metadata: DatasetMetadata) -> list[Reserved]:
    """`reserved_tables` of the version stored at `parquet` (only its reserved columns read)."""
    names = reserved_columns(metadata)
    if not names:
        return []
    return reserved_tables(pd.read_parquet(parquet, columns=names), metadata)
