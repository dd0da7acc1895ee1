"""The Parquet file of a storage "duckdb" dataset as DuckDB reads it inside a job.

The job never reopens the dataset by path: it may be readable by root only, and the job runs
under a fresh unprivileged uid (a fork server job inherits the template's descriptor; the
one-shot runner opened the file before dropping its privileges). So DuckDB scans the file
through Arrow record batch readers over that descriptor, read with `pread` (each job keeps its
own offset: a template's jobs share one open file description), one batch at a time: only the
columns a query needs are decoded, and never the whole dataset at once.

DuckDB's memory limit, threads and spill directory come from the job's own limits: the rlimits
(process backend) or the cgroup (Docker) the job runs under, read here, inside the job.
"""

from __future__ import annotations

import io
import os
import resource
import tempfile
from collections.abc import Iterator
from typing import IO, TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq

if TYPE_CHECKING:
    import duckdb

#: Rows per Arrow batch handed to DuckDB: large enough to amortise the per-batch overhead,
#: small enough (a few columns of 1 M rows: tens of MB) to stay far below any job's memory.
BATCH_ROWS = 1 << 20
#: Below the job's private scratch space: TMPDIR, a fresh, size-capped tmpfs in both backends.
SCRATCH_NAME = "duckdb"
#: Share of the job's memory allowance that DuckDB's own buffers may take: the rest is for
#: Python, the Arrow batch in flight and the per-record query set (4 bytes per stored record).
DUCKDB_SHARE = 4
DEFAULT_MEMORY = 1024 * 1024 * 1024
CGROUP_MEMORY = "/sys/fs/cgroup/memory.max"


class PreadFile(io.RawIOBase):
    """A read-only file over a descriptor, read with `os.pread` at its own offset."""

    def __init__(self, fd: int) -> None:
        super().__init__()
        self._fd = fd
        self._pos = 0
        self._size = os.fstat(fd).st_size

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        view = memoryview(buffer).cast("B")
        data = os.pread(self._fd, len(view), self._pos)
        view[: len(data)] = data
        self._pos += len(data)
        return len(data)

    def close(self) -> None:
        # The descriptor belongs to whoever opened the dataset (the template serves every job).
        super().close()


DatasetFile = IO[bytes] | str | int


class ParquetSource:
    """One stored Parquet file: its schema, size and fresh batch readers over its columns."""

    def __init__(self, dataset: DatasetFile) -> None:
        if isinstance(dataset, str):
            self._fd = os.open(dataset, os.O_RDONLY | os.O_CLOEXEC)
        elif isinstance(dataset, int):
            self._fd = dataset
        else:
            self._fd = dataset.fileno()
        meta = pq.ParquetFile(PreadFile(self._fd), pre_buffer=False)
        self.schema = meta.schema_arrow
        self.num_rows = meta.metadata.num_rows

    def types(self) -> dict[str, pa.DataType]:
        """Column name -> Arrow type."""
        return {f.name: f.type for f in self.schema}

    def reader(self, columns: list[str]) -> pa.RecordBatchReader:
        """The file's `columns` as a stream of record batches, in stored order."""
        wanted = list(dict.fromkeys(columns))
        schema = pa.schema([self.schema.field(c) for c in wanted])
        handle = pq.ParquetFile(PreadFile(self._fd), pre_buffer=False)

        def batches() -> Iterator[pa.RecordBatch]:
            # With no column at all (a count), Arrow still yields batches of the right length.
            yield from handle.iter_batches(batch_size=BATCH_ROWS, columns=wanted, use_threads=False)

        return pa.RecordBatchReader.from_batches(schema, batches())


def job_memory() -> int:
    """The memory this job may use: its RLIMIT_DATA or its cgroup's limit, the smaller."""
    found = []
    soft, _ = resource.getrlimit(resource.RLIMIT_DATA)
    if soft != resource.RLIM_INFINITY:
        found.append(soft)
    try:
        with open(CGROUP_MEMORY) as fh:
            text = fh.read().strip()
        if text.isdigit():
            found.append(int(text))
    except OSError:
        pass
    return min(found) if found else DEFAULT_MEMORY


def job_threads() -> int:
    """DuckDB threads: the cores this job may run on, within its process limit (threads count
    against RLIMIT_NPROC; half of it is left for Python's and Arrow's own)."""
    cores = len(os.sched_getaffinity(0))
    soft, _ = resource.getrlimit(resource.RLIMIT_NPROC)
    if soft != resource.RLIM_INFINITY:
        cores = min(cores, max(1, int(soft) // 2))
    return max(1, cores)


def connect(threads: int | None = None) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection sized by the job's limits, spilling into its scratch dir.

    External access (files, network, extensions) is off: DuckDB sees only the Arrow streams
    handed to it, and the configuration is locked so no query can change that."""
    import duckdb

    scratch = os.path.join(tempfile.gettempdir(), SCRATCH_NAME)
    os.makedirs(scratch, exist_ok=True)
    memory = max(64 * 1024 * 1024, job_memory() // DUCKDB_SHARE)
    con = duckdb.connect(
        ":memory:",
        config={
            "memory_limit": f"{memory // (1024 * 1024)}MB",
            "threads": threads or job_threads(),
            "temp_directory": scratch,
            "autoinstall_known_extensions": False,
            "autoload_known_extensions": False,
            "preserve_insertion_order": True,
        },
    )
    # Set after the temp directory: with external access off, DuckDB refuses to set one.
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")
    return con
