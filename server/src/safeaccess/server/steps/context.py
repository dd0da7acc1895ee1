"""What one step runs against (`StepContext`): built by the flow, read by the pipeline and by
the releases it hands a step to (`synth/step.py`), below the pipeline so they need not import it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from safeaccess.client.metadata import DatasetMetadata
from safeaccess.rules.decision import Decision
from safeaccess.rules.outputs import Output
from safeaccess.rules.ruleset import RuleSet
from safeaccess.sandbox.backend import Backend, Limits
from safeaccess.server.dp import DPContext

# The query-set audit: given the checked output and its decision, the final decision (withhold
# when the auditor refuses). The caller binds it to the scope's state.
Audit = Callable[[Output, Decision], Decision]


@dataclass(frozen=True)
class StepContext:
    """What one step runs against.

    `n_records` (the version's row count) raises the output limit by the size of the
    per-record query-set array, which is not output. `dp` is the dataset's DP configuration and
    the step's ledger when the dataset has DP: DP kinds are then answered with noise
    (`dp_release`), never by the rules or the query-set audit. `synth_files` is the directory
    for released synthetic-data files."""

    job_id: str
    metadata: DatasetMetadata
    dataset_path: Path
    backend: Backend
    limits: Limits
    ruleset: RuleSet
    audit: Audit | None = None
    n_records: int | None = None
    dp: DPContext | None = None
    synth_files: Path | None = None
