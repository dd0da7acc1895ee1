"""The analysis kinds the runner serves: one table from a kind to its computation and template.

For each kind, `KINDS` names the compute function (a module below `safeaccess.sandbox.runner.compute`
and a function in it), the further modules that computation imports when it runs, and the
fork server's template family that serves it. From this one table:

- the runner finds a kind's compute function, and imports its modules before it looks at the
  records (so that an empty selection does not answer sooner than a selection of one record);
- the process backend picks a kind's template family (`family_for`);
- a fork server template, and a Docker warm container, import `preload_modules(family)` before
  their job arrives.

Two families, because forking costs in proportion to the template's memory: the tables and
summaries that make up most steps fork from a template without statsmodels, SciPy, scikit-learn
and fairlearn. A kind always goes to the same family, so its latency never depends on another
kind's; an unknown kind goes to the full one (and the runner then refuses it).

This module is read on the host and inside the sandbox; it imports only the standard library.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal

COMPUTE = "safeaccess.sandbox.runner.compute"
Family = Literal["tables", "full", "duckdb"]
#: What every job imports, whatever its kind: the runner, the Parquet reader and the filter.
RUNTIME = ("safeaccess.sandbox.runner", "pyarrow.parquet", "safeaccess.sandbox.runner.filters")


@dataclass(frozen=True)
class Kind:
    """One analysis kind: `compute` is "module:function" below `COMPUTE`."""

    compute: str
    family: Family
    imports: tuple[str, ...] = ()

    @property
    def module(self) -> str:
        """The compute module's dotted name."""
        return f"{COMPUTE}.{self.compute.partition(':')[0]}"

    def modules(self) -> tuple[str, ...]:
        """Every module the computation of this kind imports (its own first)."""
        return (self.module, *self.imports)

    def load(self) -> Callable[..., Any]:
        """The compute function, imported on first use (a table need not pay for statsmodels)."""
        return getattr(importlib.import_module(self.module), self.compute.partition(":")[2])


_MODELS = (
    f"{COMPUTE}.model_export",
    f"{COMPUTE}.model_attacks",
    f"{COMPUTE}.roc",
    # scikit-learn and fairlearn add about 20 MB to a template, shared copy-on-write by every
    # job, and save each model job about 0.6 s of imports.
    "sklearn.tree",
    "sklearn.ensemble",
    "sklearn.linear_model",
    "sklearn.metrics",
    "sklearn.model_selection",
    "fairlearn.reductions",
    "fairlearn.postprocessing",
    "fairlearn.metrics",
)
_DP = Kind("dp:dp_statistic", "tables")

#: Every kind a researcher may ask for. The DP and synthetic kinds are listed by name (this
#: module imports nothing of ours); a test checks them against the client's DP_KINDS and
#: SYNTH_KINDS.
KINDS: Mapping[str, Kind] = MappingProxyType(
    {
        "frequency_table": Kind("tables:frequency_table", "tables"),
        "magnitude_table": Kind("tables:magnitude_table", "tables"),
        "histogram": Kind("tables:histogram", "tables"),
        "summary": Kind("summary:summary", "tables"),
        "survival": Kind("survival:survival", "tables"),
        "dp_count": _DP,
        "dp_sum": _DP,
        "dp_mean": _DP,
        "dp_histogram": _DP,
        "dp_mean_test": _DP,
        "synthetic_data": Kind("synthetic:synthetic_tables", "tables"),
        "script": Kind("script:script", "full"),
        "regression": Kind(
            "regression:regression",
            "full",
            ("safeaccess.sandbox.runner.design", "statsmodels.api"),
        ),
        "correlation": Kind("correlation:correlation", "full"),
        "test": Kind("tests:stat_test", "full", ("scipy.stats",)),
        "model_training": Kind("models:model_training", "full", _MODELS),
    }
)


# -- storage "duckdb" (larger than memory): its own family, whose template loads no data and
# whose jobs query the file with DuckDB (runner/duckdb_tables.py); whatever the kind, since the
# runner refuses the kinds that path does not compute.
DUCKDB_MODULES = ("duckdb", "safeaccess.sandbox.runner.duckdb_tables")


def family_for(kind: object, storage: object = "memory") -> Family:
    """The template family that serves analyses of `kind` on a dataset of `storage` (the full
    one for an unknown kind)."""
    if storage == "duckdb":
        return "duckdb"
    entry = KINDS.get(kind) if isinstance(kind, str) else None
    return entry.family if entry is not None else "full"


def preload_modules(family: Family) -> tuple[str, ...]:
    """What a sandbox of `family` imports before its job: the runtime and the modules of the
    kinds it serves (the full family serves every kind), in table order, each once."""
    if family == "duckdb":
        return (*RUNTIME, *DUCKDB_MODULES)
    served = [k for k in KINDS.values() if family == "full" or k.family == family]
    return tuple(dict.fromkeys([*RUNTIME, *(name for k in served for name in k.modules())]))
