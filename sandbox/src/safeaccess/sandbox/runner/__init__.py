"""The analysis runner: `python -m safeaccess.sandbox.runner` inside a sandbox.

Protocol: one `RunnerRequest` as JSON on stdin, one reply on stdout framed by
`backend.encode_reply` (the `RunnerResponse` as JSON plus binary side arrays; never pickle), exit status 0 whenever a response was written. It depends only on stdin, stdout and the
dataset path in the request, so the process and Docker backends run it the same way.

`execute(analysis, frame, metadata)` is the pure core: filter, then compute one analysis.

Error messages go back to the researcher, so they name variables and settings, never data values;
unexpected exceptions are reported by type only (a library's message may quote a data value).

Privilege drop: when the process backend runs as root it starts the runner as root inside the
sandbox with only CAP_SETUID/CAP_SETGID and sets SAFEACCESS_SANDBOX_UID/GID. The runner reads the
request and opens the dataset (which may be readable by root only), then irrevocably switches to
that unprivileged id before parsing data or running anything the researcher wrote, so that
RLIMIT_NPROC (ignored for root) holds.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any, TypeAlias, cast

import pandas as pd
from pydantic import ValidationError

from safeaccess.client.analyses import DP_KINDS, SYNTH_KINDS, Analysis, parse_analysis
from safeaccess.client.metadata import HIDDEN_TYPES, DatasetMetadata
from safeaccess.rules.outputs import Output
from safeaccess.sandbox.backend import (
    RunnerError,
    RunnerRequest,
    RunnerResponse,
    encode_reply,
    reply_parts,
)
from safeaccess.sandbox.codes import CodeArrays
from safeaccess.sandbox.runner.compute._common import AnalysisError
from safeaccess.sandbox.runner.date_parts import with_date_parts
from safeaccess.sandbox.runner.kinds import KINDS
from safeaccess.sandbox.runner.stored_codes import using

ENV_UID = "SAFEACCESS_SANDBOX_UID"
ENV_GID = "SAFEACCESS_SANDBOX_GID"
ENV_PRELOAD = "SAFEACCESS_RUNNER_PRELOAD"
# Set to "1" by the process backend: install the seccomp filter right after the privilege drop.
ENV_SECCOMP = "SAFEACCESS_SANDBOX_SECCOMP"
MAX_REQUEST_BYTES = 16 * 1024 * 1024

# Runner error codes that report a resource limit rather than a problem with the analysis.
LIMIT_CODES = {"limit_memory": "memory", "limit_processes": "processes"}

ANALYSIS_KINDS = frozenset(KINDS)
#: The disclosure check of synthetic data: a job the server builds, never a researcher's kind.
SYNTH_CHECK = "synthetic_check"

Compute = Callable[[Any, pd.DataFrame, DatasetMetadata, int], Output]


def _compute_for(kind: str) -> Compute:
    entry = KINDS.get(kind)
    if entry is None:
        raise AnalysisError(
            "bad_analysis", f"analysis kind {kind!r} is not supported by this runner"
        )
    # Imported per kind (runner/kinds.py) so that a frequency table does not pay for statsmodels.
    return cast(Compute, entry.load())


def preload(kind: str) -> None:
    """Import the modules an analysis kind needs (ahead of the request, in a warm sandbox)."""
    entry = KINDS.get(kind)
    if entry is None:
        return
    for name in entry.modules():
        importlib.import_module(name)


def apply_filter(analysis: Analysis, frame: pd.DataFrame) -> pd.DataFrame:
    """The records selected by the analysis' `where` filter (index = stored record positions)."""
    if analysis.where is None or not analysis.where.strip():
        return frame
    from safeaccess.sandbox.runner.filters import row_mask

    mask = row_mask(frame, analysis.where)
    return frame.loc[mask]


def execute(analysis: Analysis, frame: pd.DataFrame, metadata: DatasetMetadata) -> Output:
    """Filter the stored dataset `frame` and compute `analysis` on it.

    `frame` must be the dataset in stored order; its positions are the record ids in query sets.
    Raises AnalysisError (and the filter's / design's own errors) for analyses that cannot be
    computed.
    """
    index = frame.index
    if not (isinstance(index, pd.RangeIndex) and index.start == 0 and index.step == 1):
        frame = frame.reset_index(drop=True)  # a copy of every column: only when needed
    n_records = len(frame)
    # Import what the kind needs before looking at the records: otherwise an empty selection
    # (which fails before the import) answers seconds sooner than a selection of one record,
    # and the reveal's latency tells 0 from 1 (the failure itself looks like a withhold).
    preload(analysis.kind)
    compute = _compute_for(analysis.kind)
    selected = with_date_parts(apply_filter(analysis, frame), analysis)
    # A DP answer's shape and success never depend on the data: no rows answer zeros, noised.
    if (
        len(selected) == 0
        and analysis.kind != "script"
        and analysis.kind not in DP_KINDS
        and analysis.kind not in SYNTH_KINDS
    ):
        raise AnalysisError("no_rows", "no records satisfy the filter; widen the 'where' condition")
    return compute(analysis, selected, metadata, n_records)


def _error(code: str, message: str) -> RunnerResponse:
    return RunnerResponse(ok=False, error=RunnerError(code=code, message=message))


def _known_error(exc: Exception) -> RunnerResponse | None:
    """Map the filter's and design's typed errors (their messages are written for researchers)."""
    name = type(exc).__name__
    if name == "FilterError":
        return _error("bad_filter", str(exc))
    if name == "DesignError":
        return _error("bad_formula", str(exc))
    return None


@dataclass(frozen=True)
class LoadedDataset:
    """A dataset a fork server template loaded once and shares, copy-on-write, with its jobs:
    the decoded frame and, when the version has them, its memory-mapped code arrays."""

    frame: pd.DataFrame
    codes: CodeArrays | None = None


# Where the runner finds the dataset: an open Parquet file or its path (one-shot runner), or
# what the fork server's template loaded (a bare frame, or a frame with its code arrays).
# A storage "duckdb" dataset's template hands its jobs the open descriptor instead (an int).
DatasetSource: TypeAlias = IO[bytes] | str | int | pd.DataFrame | LoadedDataset


def _read_dataset(
    dataset: DatasetSource,
    analysis: Analysis,
    metadata: DatasetMetadata,
    *,
    never_whole: bool = False,
) -> pd.DataFrame:
    """The dataset's columns the analysis needs (those the sandbox copy holds), in stored order.

    A frame a fork server template loaded is used as it is, or narrowed to those columns
    (`execute` never modifies its input). With `never_whole` (a dataset larger than memory), an
    analysis whose columns are not known before it runs (a filter or formula that does not
    parse: it reports its own error first) gets the first declared column only, so that the
    error is the in-memory path's without reading the whole file."""
    import pyarrow.parquet as pq

    from safeaccess.sandbox.runner.columns import needed_columns

    wanted = needed_columns(analysis, metadata)
    if wanted is None and never_whole:
        # The first column the sandbox's copy holds (identifiers and free text are left out).
        wanted = [
            next(
                (c.name for c in metadata.columns if c.type not in HIDDEN_TYPES or c.contributor),
                metadata.columns[0].name,
            )
        ]
    if isinstance(dataset, int):  # a descriptor shared with other jobs: read at our own offset
        from safeaccess.sandbox.runner.duckdb_source import PreadFile

        dataset = cast(IO[bytes], PreadFile(dataset))
    if isinstance(dataset, LoadedDataset):
        dataset = dataset.frame
    if isinstance(dataset, pd.DataFrame):
        columns = [c for c in wanted or () if c in dataset.columns]
        if wanted is None or not columns:
            return dataset
        # A view of the shared columns, not a copy: the job never writes to its input.
        return pd.DataFrame({c: dataset[c] for c in columns}, copy=False)
    if wanted is None:
        return pd.read_parquet(dataset, engine="pyarrow")
    present = set(pq.read_schema(dataset).names)
    if not isinstance(dataset, str):
        dataset.seek(0)
    columns = [c for c in wanted if c in present]
    if not columns:
        return pd.read_parquet(dataset, engine="pyarrow")
    return pd.read_parquet(dataset, engine="pyarrow", columns=columns)


def _out_of_memory(
    analysis: Analysis, dataset: DatasetSource, metadata: DatasetMetadata
) -> Callable[[], Output] | RunnerResponse:
    """The computation of `analysis` on a storage "duckdb" dataset (never a loaded frame), or
    the response that refuses it.

    Tables DuckDB computes itself over the file (`duckdb_tables`). Every other kind but scripts
    reads only the columns it uses (a summary of one variable by one group: two columns of the
    file) and runs the in-memory code on them, so its output is the loaded dataset's, exactly;
    it needs those columns and its working memory within the job's limit (`limit_memory`
    otherwise, which the server withholds as any limit). A script may read any
    column: it is refused."""
    from safeaccess.sandbox.runner.duckdb_tables import (
        STORAGE_UNSUPPORTED,
        execute_out_of_memory,
        refusal,
    )

    assert not isinstance(dataset, pd.DataFrame | LoadedDataset)
    if refusal(analysis, metadata) is None:
        return lambda: execute_out_of_memory(analysis, dataset, metadata)
    if analysis.kind == "script":
        return _error(
            STORAGE_UNSUPPORTED,
            f"scripts are not available on dataset {metadata.name}: it is queried out of memory "
            "(storage 'duckdb') and a script may read every column; use the analysis kinds",
        )
    try:
        frame = _read_dataset(dataset, analysis, metadata, never_whole=True)
    except MemoryError:
        return _error(
            "limit_memory",
            "the columns this analysis uses do not fit in the sandbox's memory limit",
        )
    except Exception:
        return _error("dataset_unreadable", "the dataset could not be read as Parquet")
    return lambda: execute(analysis, frame, metadata)


def run_request(request: RunnerRequest, dataset: DatasetSource) -> RunnerResponse:
    """Run one request against the dataset (open file, path or loaded frame); build the response."""
    if request.analysis.get("kind") == SYNTH_CHECK:
        return _run_synth_check(request, dataset)
    try:
        analysis = parse_analysis(request.analysis)
        metadata = DatasetMetadata.model_validate(request.metadata)
    except ValidationError as exc:
        fields = sorted({".".join(str(p) for p in e["loc"]) for e in exc.errors()})
        return _error("bad_analysis", f"invalid analysis or metadata at: {', '.join(fields)}")
    # -- storage "duckdb" (larger than memory): DuckDB queries the file in this job, which
    # never loads it (runner/duckdb_tables.py). The only branch of the runner for it. A frame
    # handed in (the server's QSS grid: a few records in memory) takes the in-memory path, whose
    # outputs are the same.
    if metadata.storage == "duckdb" and not isinstance(dataset, pd.DataFrame | LoadedDataset):
        planned = _out_of_memory(analysis, dataset, metadata)
        if isinstance(planned, RunnerResponse):
            return planned
        compute = planned
    else:
        try:
            frame = _read_dataset(dataset, analysis, metadata)
        except MemoryError:
            return _error("limit_memory", "the dataset does not fit in the sandbox's memory limit")
        except Exception:
            return _error("dataset_unreadable", "the dataset could not be read as Parquet")
        codes = dataset.codes if isinstance(dataset, LoadedDataset) else None
        if codes is not None and codes.rows != len(frame):
            codes = None  # not this dataset's arrays: code the values afresh

        def compute() -> Output:
            with using(codes):
                return execute(analysis, frame, metadata)

    try:
        output = compute()
    except AnalysisError as exc:
        return _error(exc.code, exc.message)
    except MemoryError:
        return _error("limit_memory", "the analysis ran out of memory in the sandbox")
    except Exception as exc:
        if type(exc).__name__ == "ProcessLimitReached":
            return _error("limit_processes", "the script hit the sandbox's process limit")
        if type(exc).__name__ == "ScriptRaised":
            return _error("script_raised", f"the script raised {exc}")
        known = _known_error(exc)
        if known is not None:
            return known
        return _error(
            "analysis_failed",
            f"the analysis failed ({type(exc).__name__}); check the variables and settings",
        )
    return RunnerResponse(ok=True, output=output)


def _run_synth_check(request: RunnerRequest, dataset: DatasetSource) -> RunnerResponse:
    """The synthetic-data disclosure check: the synthetic codes travel in the request."""
    from safeaccess.client.analyses import SyntheticData
    from safeaccess.sandbox.runner.compute.synthetic import synthetic_check

    try:
        inner = SyntheticData.model_validate(request.analysis.get("analysis"))
        metadata = DatasetMetadata.model_validate(request.metadata)
    except ValidationError:
        return _error("bad_analysis", "invalid synthetic-data check request")
    try:
        frame = _read_dataset(dataset, inner, metadata)
    except Exception:
        return _error("dataset_unreadable", "the dataset could not be read as Parquet")
    try:
        output = synthetic_check(request.analysis, frame, metadata)
    except AnalysisError as exc:
        return _error(exc.code, exc.message)
    except MemoryError:
        return _error("limit_memory", "the check ran out of memory in the sandbox")
    except Exception as exc:
        known = _known_error(exc)
        if known is not None:
            return known
        return _error("analysis_failed", f"the check failed ({type(exc).__name__})")
    return RunnerResponse(ok=True, output=output)


def drop_privileges() -> None:
    """Switch to the unprivileged uid/gid named in the environment, if running as root."""
    uid_text = os.environ.pop(ENV_UID, None)
    gid_text = os.environ.pop(ENV_GID, None)
    if uid_text is None:
        return
    uid = int(uid_text)
    gid = int(gid_text) if gid_text is not None else uid
    if os.getuid() == 0 or os.geteuid() == 0:
        os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)
    if os.getuid() != uid or os.geteuid() != uid or os.getgid() != gid:
        raise PermissionError("could not switch to the sandbox user")


def reply_for(request: RunnerRequest, dataset: DatasetSource) -> list[bytes | memoryview]:
    """The framed reply for `request` on `dataset`, in parts to write one after the other:
    what every kind of job writes back.

    The one-shot runner (`main`) and the fork server's jobs (`safeaccess.sandbox.process.template`) both
    answer through this function, so the reply is built in one place.
    """
    return reply_parts(run_request(request, dataset))


def parse_request(raw: bytes) -> RunnerRequest | bytes:
    """The request in `raw`, or the framed error reply when it is too large or invalid."""
    if len(raw) > MAX_REQUEST_BYTES:
        return encode_reply(_error("bad_request", "the request is too large"))
    try:
        return RunnerRequest.model_validate_json(raw)
    except ValidationError:
        return encode_reply(_error("bad_request", "the runner request is not valid"))


def _serve(raw: bytes) -> list[bytes | memoryview]:
    request = parse_request(raw)
    if isinstance(request, bytes):
        return [request]
    try:
        dataset = open(request.dataset_path, "rb")  # noqa: SIM115 - closed below
    except OSError:
        return [encode_reply(_error("dataset_unreadable", "the dataset file could not be opened"))]
    with dataset:
        try:
            drop_privileges()
            if os.environ.pop(ENV_SECCOMP, "") == "1":
                from safeaccess.sandbox import seccomp

                seccomp.install()
        except (OSError, ValueError, RuntimeError):
            return [
                encode_reply(_error("sandbox_setup", "the sandbox could not drop its privileges"))
            ]
        return reply_for(request, dataset)


def main() -> int:
    """Entry point: stdin request -> stdout response."""
    # Import what every job needs *before* waiting for the request, so that a sandbox started
    # ahead of time (the process backend's warm sandbox) has done this work when the job comes.
    import pyarrow.dataset
    import pyarrow.parquet  # noqa: F401

    from safeaccess.sandbox.runner.compute import _common, tables  # noqa: F401

    preload(os.environ.pop(ENV_PRELOAD, ""))
    raw = sys.stdin.buffer.read(MAX_REQUEST_BYTES + 1)
    # Keep our own handle on stdout and point fd 1 at /dev/null, so that nothing else the process
    # prints (a library, or a script writing to fd 1 directly) can mix into the response.
    response_fd = os.dup(1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)
    reply = _serve(raw)
    with os.fdopen(response_fd, "wb") as out:
        for part in reply:
            out.write(part)
    return 0
