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

import os
import sys
from collections.abc import Callable
from typing import IO, Any

import pandas as pd
from pydantic import ValidationError

from safeaccess.client.analyses import Analysis, parse_analysis
from safeaccess.client.metadata import DatasetMetadata
from safeaccess.rules.outputs import Output
from safeaccess.sandbox.backend import RunnerError, RunnerRequest, RunnerResponse, encode_reply
from safeaccess.sandbox.compute._common import AnalysisError

ENV_UID = "SAFEACCESS_SANDBOX_UID"
ENV_GID = "SAFEACCESS_SANDBOX_GID"
ENV_PRELOAD = "SAFEACCESS_RUNNER_PRELOAD"
MAX_REQUEST_BYTES = 16 * 1024 * 1024

# Runner error codes that report a resource limit rather than a problem with the analysis.
LIMIT_CODES = {"limit_memory": "memory", "limit_processes": "processes"}

ANALYSIS_KINDS = frozenset(
    {
        "frequency_table",
        "magnitude_table",
        "histogram",
        "summary",
        "regression",
        "correlation",
        "test",
        "script",
    }
)

Compute = Callable[[Any, pd.DataFrame, DatasetMetadata, int], Output]


def _compute_for(kind: str) -> Compute:
    # Imported per kind so that a frequency table does not pay for statsmodels or scipy.
    if kind in ("frequency_table", "magnitude_table", "histogram"):
        from safeaccess.sandbox.compute import tables

        return {  # type: ignore[return-value]
            "frequency_table": tables.frequency_table,
            "magnitude_table": tables.magnitude_table,
            "histogram": tables.histogram,
        }[kind]
    if kind == "summary":
        from safeaccess.sandbox.compute.summary import summary

        return summary
    if kind == "regression":
        from safeaccess.sandbox.compute.regression import regression

        return regression
    if kind == "correlation":
        from safeaccess.sandbox.compute.correlation import correlation

        return correlation
    if kind == "test":
        from safeaccess.sandbox.compute.tests import stat_test

        return stat_test
    if kind == "script":
        from safeaccess.sandbox.compute.script import script

        return script
    raise AnalysisError("bad_analysis", f"analysis kind {kind!r} is not supported by this runner")


def preload(kind: str) -> None:
    """Import the libraries an analysis kind needs (ahead of the request, in a warm sandbox)."""
    if kind not in ANALYSIS_KINDS:
        return
    _compute_for(kind)
    if kind == "regression":
        import statsmodels.api  # noqa: F401
    elif kind == "test":
        import scipy.stats  # noqa: F401


def apply_filter(analysis: Analysis, frame: pd.DataFrame) -> pd.DataFrame:
    """The records selected by the analysis' `where` filter (index = stored record positions)."""
    if analysis.where is None or not analysis.where.strip():
        return frame
    from safeaccess.sandbox.filters import row_mask

    mask = row_mask(frame, analysis.where)
    return frame.loc[mask]


def execute(analysis: Analysis, frame: pd.DataFrame, metadata: DatasetMetadata) -> Output:
    """Filter the stored dataset `frame` and compute `analysis` on it.

    `frame` must be the dataset in stored order; its positions are the record ids in query sets.
    Raises AnalysisError (and the filter's / design's own errors) for analyses that cannot be
    computed.
    """
    frame = frame.reset_index(drop=True)
    n_records = len(frame)
    # Import what the kind needs before looking at the records: otherwise an empty selection
    # (which fails before the import) answers seconds sooner than a selection of one record,
    # and the reveal's latency tells 0 from 1 (the failure itself looks like a withhold).
    preload(analysis.kind)
    compute = _compute_for(analysis.kind)
    selected = apply_filter(analysis, frame)
    if len(selected) == 0 and analysis.kind != "script":
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


def _read_dataset(
    dataset: IO[bytes] | str, analysis: Analysis, metadata: DatasetMetadata
) -> pd.DataFrame:
    """The dataset's columns the analysis needs (those the sandbox copy holds), in stored order."""
    import pyarrow.parquet as pq

    from safeaccess.sandbox.columns import needed_columns

    wanted = needed_columns(analysis, metadata)
    if wanted is None:
        return pd.read_parquet(dataset, engine="pyarrow")
    present = set(pq.read_schema(dataset).names)
    if not isinstance(dataset, str):
        dataset.seek(0)
    columns = [c for c in wanted if c in present]
    if not columns:
        return pd.read_parquet(dataset, engine="pyarrow")
    return pd.read_parquet(dataset, engine="pyarrow", columns=columns)


def run_request(request: RunnerRequest, dataset: IO[bytes] | str) -> RunnerResponse:
    """Run one request against an open dataset file (or path) and build the response."""
    try:
        analysis = parse_analysis(request.analysis)
        metadata = DatasetMetadata.model_validate(request.metadata)
    except ValidationError as exc:
        fields = sorted({".".join(str(p) for p in e["loc"]) for e in exc.errors()})
        return _error("bad_analysis", f"invalid analysis or metadata at: {', '.join(fields)}")
    try:
        frame = _read_dataset(dataset, analysis, metadata)
    except MemoryError:
        return _error("limit_memory", "the dataset does not fit in the sandbox's memory limit")
    except Exception:
        return _error("dataset_unreadable", "the dataset could not be read as Parquet")
    try:
        output = execute(analysis, frame, metadata)
    except AnalysisError as exc:
        return _error(exc.code, exc.message)
    except MemoryError:
        return _error("limit_memory", "the analysis ran out of memory in the sandbox")
    except Exception as exc:
        if type(exc).__name__ == "ProcessLimitReached":
            return _error("limit_processes", "the script hit the sandbox's process limit")
        known = _known_error(exc)
        if known is not None:
            return known
        return _error(
            "analysis_failed",
            f"the analysis failed ({type(exc).__name__}); check the variables and settings",
        )
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


def _serve(raw: bytes) -> RunnerResponse:
    try:
        request = RunnerRequest.model_validate_json(raw)
    except ValidationError:
        return _error("bad_request", "the runner request is not valid")
    try:
        dataset = open(request.dataset_path, "rb")  # noqa: SIM115 - closed below
    except OSError:
        return _error("dataset_unreadable", "the dataset file could not be opened")
    with dataset:
        try:
            drop_privileges()
        except (OSError, ValueError):
            return _error("sandbox_setup", "the sandbox could not switch to its unprivileged user")
        return run_request(request, dataset)


def main() -> int:
    """Entry point: stdin request -> stdout response."""
    # Import what every job needs *before* waiting for the request, so that a sandbox started
    # ahead of time (the process backend's warm sandbox) has done this work when the job comes.
    import pyarrow.dataset
    import pyarrow.parquet  # noqa: F401

    from safeaccess.sandbox.compute import _common, tables  # noqa: F401

    preload(os.environ.pop(ENV_PRELOAD, ""))
    raw = sys.stdin.buffer.read(MAX_REQUEST_BYTES + 1)
    # Keep our own handle on stdout and point fd 1 at /dev/null, so that nothing else the process
    # prints (a library, or a script writing to fd 1 directly) can mix into the response.
    response_fd = os.dup(1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)
    if len(raw) > MAX_REQUEST_BYTES:
        response = _error("bad_request", "the request is too large")
    else:
        response = _serve(raw)
    with os.fdopen(response_fd, "wb") as out:
        out.write(encode_reply(response))
    return 0


if __name__ == "__main__":
    status = main()
    # The response is written and flushed; skip interpreter teardown (finalising pandas and
    # friends takes longer than many analyses) so the sandbox is gone as soon as possible.
    os._exit(status)
