"""An output's query set over stable record ids (qss/gate.stable_query_set), in its cell type."""

from __future__ import annotations

import numpy as np
import pytest

from safeaccess.rules.outputs import CellFacts, QuerySet, TableFacts, TableOutput
from safeaccess.server.qss.gate import stable_query_set


def _table(cells: np.ndarray, suppressed: list[list[bool]] | None) -> TableOutput:
    """A 2 x 2 table (no margins) whose query set is `cells` over the version's positions."""
    labels = ["a, x", "a, y", "b, x", "b, y"]
    return TableOutput(
        source="frequency_table",
        statistic="count",
        row_vars=["r"],
        col_vars=["c"],
        row_labels=[["a"], ["b"]],
        col_labels=[["x"], ["y"]],
        values=[[1.0, 1.0], [1.0, 1.0]],
        suppressed=suppressed,
        facts=TableFacts(
            cells=CellFacts(counts=[[1, 1], [1, 1]]),
            n_total=6,
            query_set=QuerySet.from_array(labels, cells),
        ),
    )


CELLS = np.array([0, 1, 2, 3, -1, 3, 1], dtype=np.int64)


def _expected(ids: np.ndarray, n_records: int, hidden: set[int]) -> list[int]:
    out = np.full(n_records, -1)
    out[ids] = [-1 if c in hidden else c for c in CELLS]
    return out.tolist()


@pytest.mark.parametrize(
    ("ids", "n_records"),
    [
        (np.arange(7, dtype=np.int32), 7),  # version 1: ids are the positions
        (np.arange(7, dtype=np.int32), 10),  # a later version added ids 7..9
        (np.array([9, 0, 4, 2, 8, 1, 3], dtype=np.int32), 10),  # a later version's own ids
    ],
)
@pytest.mark.parametrize(
    ("suppressed", "hidden"),
    [
        (None, set()),
        ([[False, True], [False, False]], {1}),
        ([[True, False], [False, True]], {0, 3}),
    ],
)
def test_the_stable_query_set_maps_positions_to_ids_and_drops_suppressed_cells(
    ids: np.ndarray, n_records: int, suppressed: list[list[bool]] | None, hidden: set[int]
) -> None:
    output = _table(CELLS, suppressed)
    stable = stable_query_set(output, ids, n_records)
    assert stable is not None
    assert stable.dtype == np.int8  # four cells: the compact type, kept
    assert stable.tolist() == _expected(ids, n_records, hidden)
    # the output's own array is never changed (a suppressed cell is masked in a copy)
    assert output.facts.query_set is not None
    assert output.facts.query_set.to_array().tolist() == CELLS.tolist()
