"""The sandbox backend interface. CONTRACT shared by the process and docker backends and the server.

A backend runs one job — one analysis against one dataset — in isolation and returns the typed
output. The runner inside the sandbox is `python -m safeaccess.sandbox.runner`: it reads a
`RunnerRequest` as JSON on stdin and writes one `RunnerResponse` as JSON on stdout.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from safeaccess.rules.outputs import Output, extra_query_sets_of, query_set_of

#: Where every backend mounts the job's dataset inside the sandbox (read-only).
DATASET_PATH = "/data/dataset.parquet"
#: Where a fork server template finds its dataset version's code arrays (read-only; absent when
#: the version has none): `safeaccess.sandbox.codes`.
CODES_PATH = "/data/codes"
#: How much of a job's stderr the host keeps (its tail), for the controller's log only.
STDERR_KEEP = 64 * 1024
#: Largest message on a fork server template's control socket (one small JSON object).
MAX_MESSAGE = 4096


class Limits(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    cpu_seconds: int = Field(default=60, ge=1)
    memory_mb: int = Field(default=2048, ge=64)
    wall_seconds: float = Field(default=120.0, gt=0)
    max_processes: int = Field(default=64, ge=1)
    max_output_bytes: int = Field(default=64 * 1024 * 1024, ge=1024)
    tmp_mb: int = Field(default=256, ge=1)


class Job(BaseModel):
    """One analysis to run. `dataset` is the Parquet file on the host; backends mount it read-only."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    job_id: str
    analysis: dict[str, Any] = Field(description="The analysis body as parsed JSON.")
    metadata: dict[str, Any] = Field(description="DatasetMetadata as JSON.")
    dataset: Path
    limits: Limits = Field(default_factory=Limits)


class RunnerRequest(BaseModel):
    """What the runner reads on stdin inside the sandbox."""

    model_config = ConfigDict(extra="forbid")

    analysis: dict[str, Any]
    metadata: dict[str, Any]
    dataset_path: str = Field(description="Path of the Parquet file as seen inside the sandbox.")


class RunnerError(BaseModel):
    model_config = ConfigDict(extra="forbid")

    code: str = Field(description="e.g. 'bad_filter', 'bad_formula', 'analysis_failed'.")
    message: str


class RunnerResponse(BaseModel):
    model_config = ConfigDict(extra="forbid")

    ok: bool
    output: Output | None = None
    error: RunnerError | None = None


# The runner's reply on stdout: one frame holding the JSON response, then zero or more binary
# arrays (per-record query sets) that must not travel as JSON. Each array goes in the narrowest
# signed integer type its query set's cells need (`outputs.cell_dtype`: int8 up to 127 cells), so
# a 10 M-record table's array is 10 MB, not 40 MB of int32; the type follows from the number of
# cells alone, never from the records. Only `encode_reply` / `decode_reply` know this layout:
# magic, u32 JSON length, JSON, u32 array count, then per array u8 item size (1, 2 or 4 bytes,
# little-endian signed), u64 byte length and the raw values.
REPLY_MAGIC = b"SAR2"
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_ITEM = struct.Struct(">B")
#: The array types a reply may carry, by item size.
_ARRAY_TYPES: dict[int, np.dtype[Any]] = {1: np.dtype("i1"), 2: np.dtype("<i2"), 4: np.dtype("<i4")}


@dataclass
class RunnerReply:
    """A decoded runner reply: the JSON response plus its side-channel arrays, in order."""

    response: RunnerResponse
    arrays: list[np.ndarray] = field(default_factory=list)


def _wire(array: np.ndarray) -> np.ndarray:
    """`array` in a reply type: its own when it is one, else int32 (values are not narrowed
    here: `QuerySet.attach` chose the type from the query set's cell count)."""
    for dtype in _ARRAY_TYPES.values():
        if array.dtype == dtype:
            return np.ascontiguousarray(array)
    return np.ascontiguousarray(array, dtype="<i4")


def encode_reply(response: RunnerResponse, arrays: list[np.ndarray] | tuple[()] = ()) -> bytes:
    """The bytes the runner writes on stdout for `response` and its binary arrays.

    Without explicit `arrays`, the output's per-record query set (if any) becomes side array 0 and
    its JSON carries only the labels and that index."""
    return b"".join(reply_parts(response, arrays))


def reply_parts(
    response: RunnerResponse, arrays: list[np.ndarray] | tuple[()] = ()
) -> list[bytes | memoryview]:
    """`encode_reply`'s bytes as consecutive parts, the arrays' own buffers among them: a job
    writes them with one gathering write and never copies a 10 MB query set into a joined
    reply (fresh memory is what a job pays most for: every page of it faults in once)."""
    if not arrays and response.output is not None:
        qs = query_set_of(response.output)
        if qs is not None and qs.attached:
            qs.array = 0
            arrays = [qs.to_array()]
            # A forest's further trees partition the same records again: arrays 1, 2, ...
            for extra in extra_query_sets_of(response.output):
                if extra.attached:
                    extra.array = len(arrays)
                    arrays.append(extra.to_array())
    body = response.model_dump_json().encode("utf-8")
    parts: list[bytes | memoryview] = [REPLY_MAGIC, _U32.pack(len(body)), body]
    parts.append(_U32.pack(len(arrays)))
    for array in arrays:
        wire = _wire(array)
        parts.append(_ITEM.pack(wire.dtype.itemsize))
        parts.append(_U64.pack(wire.nbytes))
        parts.append(wire.data.cast("B") if wire.size else b"")
    return parts


def decode_reply(data: bytes | bytearray | memoryview) -> RunnerReply | None:
    """Parse a runner's stdout; None when it is not one complete, valid reply (a crash or a
    forgery: the caller decides which). The arrays are views of `data`, not copies."""
    view = memoryview(data)
    try:
        if bytes(view[:4]) != REPLY_MAGIC:
            return None
        (size,) = _U32.unpack_from(view, 4)
        offset = 8 + size
        if offset + 4 > len(view):
            return None
        response = RunnerResponse.model_validate_json(bytes(view[8:offset]))
        (count,) = _U32.unpack_from(view, offset)
        offset += 4
        arrays = []
        for _ in range(count):
            (item,) = _ITEM.unpack_from(view, offset)
            (nbytes,) = _U64.unpack_from(view, offset + 1)
            offset += 9
            dtype = _ARRAY_TYPES.get(item)
            if dtype is None or nbytes % item or offset + nbytes > len(view):
                return None
            arrays.append(np.frombuffer(view[offset : offset + nbytes], dtype=dtype))
            offset += nbytes
        if offset != len(view):
            return None
    except (struct.error, ValueError):
        return None
    if response.output is not None:
        # Put the query set's array back where the output says it is; a reference to an array
        # that is not there, or one of another shape, makes the whole reply invalid.
        qs = query_set_of(response.output)
        found = [] if qs is None else [qs, *extra_query_sets_of(response.output)]
        for one in found:
            if one.array >= len(arrays) or arrays[one.array].ndim != 1:
                return None
            values = arrays[one.array]
            if len(values) and (int(values.min()) < -1 or int(values.max()) >= len(one.labels)):
                return None
            one.attach(values)
    return RunnerReply(response=response, arrays=arrays)


class RunResult(BaseModel):
    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    output: Output
    wall_seconds: float
    backend: str
    query_sets: list[np.ndarray] = Field(
        default_factory=list,
        exclude=True,
        description="The output's per-record query-set arrays, as the reply carried them "
        "(also attached to the output's query set); never serialised.",
    )
    peak_rss_bytes: int | None = Field(
        default=None,
        exclude=True,
        description="The job's peak resident memory where the backend measures it (the fork "
        "server: the job's own rusage); for benchmarks and logs, never serialised.",
    )


def side_arrays(output: Output) -> list[np.ndarray]:
    """The per-record arrays attached to an output, for `RunResult.query_sets`."""
    qs = query_set_of(output)
    if qs is None or not qs.attached:
        return []
    return [qs.to_array()] + [q.to_array() for q in extra_query_sets_of(output) if q.attached]


class SandboxError(Exception):
    """Base of every sandbox failure; the message says what happened in words a user can act on."""

    code = "sandbox_error"


#: Why a run ends once its backend has been abandoned (`Backend.abandon`).
STOPPING = "the sandbox was stopped: this worker is stopping and hands its jobs back to the queue"


class SandboxUnavailable(SandboxError):
    """The backend's isolation cannot be had on this machine; it refuses rather than run unisolated."""

    code = "sandbox_unavailable"


class LimitExceeded(SandboxError):
    code = "limit_exceeded"

    def __init__(
        self, limit: Literal["cpu", "memory", "wall", "processes", "output"], message: str
    ):
        super().__init__(message)
        self.limit = limit


class JobCrashed(SandboxError):
    """The job's own process ended without a valid response, or answered with an output its
    analysis kind cannot produce. A `script` controls that process, so for a script this is the
    script's failure (recorded like any other), not an outage of the centre to be retried."""

    code = "job_crashed"


class AnalysisFailed(SandboxError):
    """The runner reported an error in the analysis itself (bad filter, singular model ...)."""

    code = "analysis_failed"

    def __init__(self, runner_code: str, message: str):
        super().__init__(message)
        self.runner_code = runner_code


# The output type each analysis kind must produce; anything else is a forged or broken response
# (a `script` job controls the runner process and could print a fake "table").
EXPECTED_TYPE = {
    "frequency_table": "table",
    "magnitude_table": "table",
    "histogram": "table",
    "summary": "summary",
    "regression": "regression",
    "correlation": "correlation",
    "test": "test",
    "survival": "survival",
    "script": "script",
    "dp_count": "dp_statistic",
    "dp_sum": "dp_statistic",
    "dp_mean": "dp_statistic",
    "dp_histogram": "dp_statistic",
    "dp_mean_test": "dp_statistic",
    "model_training": "model",
    "synthetic_data": "synth_tables",
    "synthetic_check": "synth_check",
}


def expected_output(job: Job, output: Output | None) -> Output:
    """The runner's output if its type is the one the job's analysis kind produces, else refuse."""
    kind = str(job.analysis.get("kind", ""))
    if output is None or EXPECTED_TYPE.get(kind) != output.type:
        raise JobCrashed(
            f"job {job.job_id}: the sandbox returned a {getattr(output, 'type', 'missing')} "
            f"output for a {kind} analysis; refusing it"
        )
    return output


@runtime_checkable
class Backend(Protocol):
    name: str

    def check_available(self) -> None:
        """Raise SandboxUnavailable with the reason if this backend cannot isolate jobs here."""

    def run(self, job: Job) -> RunResult:
        """Run the job in isolation; raise a SandboxError subclass on any failure."""
        ...

    def abandon(self) -> None:
        """Stop every job running now and refuse new ones (a worker handing its jobs back to
        the queue as it stops): a job so cut short raises SandboxUnavailable, the centre's
        failure, never an outcome of the analysis."""

    def close(self) -> None:
        """Release resources (e.g. a warm pool)."""
