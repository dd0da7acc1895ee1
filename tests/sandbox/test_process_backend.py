"""ProcessBackend behaviour in warm-sandbox mode: results, error mapping, warm sandboxes and
dataset versions."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NoReturn

import pandas as pd
import pytest
from abandoning import abandon_mid_run

from safeaccess.rules.outputs import TableOutput
from safeaccess.sandbox.backend import (
    AnalysisFailed,
    Backend,
    Job,
    Limits,
    SandboxError,
    SandboxUnavailable,
)
from safeaccess.sandbox.config import SandboxConfig
from safeaccess.sandbox.factory import make_backend
from safeaccess.sandbox.process import ProcessBackend

METADATA = {"name": "b", "columns": [{"name": "g", "type": "categorical"}]}


@pytest.fixture()
def backend(missing_isolation: Callable[[str], NoReturn]) -> Iterator[ProcessBackend]:
    """The warm-sandbox mode (the tests of the fork server are in test_fork_server.py)."""
    b = ProcessBackend(Limits(wall_seconds=60), mode="warm")
    try:
        b.check_available()
    except SandboxUnavailable as exc:
        missing_isolation(str(exc))
    yield b
    b.close()


def _write(path: Path, values: list[str]) -> None:
    tmp = path.with_suffix(".tmp")
    pd.DataFrame({"g": values}).to_parquet(tmp)
    os.replace(tmp, path)  # a new file version, as a dataset upload would do


def _wait_for_warm(backend: ProcessBackend) -> None:
    deadline = time.monotonic() + 10
    while not backend._warm and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(backend._warm) == 1


def _table(backend: ProcessBackend, path: Path) -> list[list[float | None]]:
    result = backend.run(
        Job(
            job_id="b",
            analysis={"kind": "frequency_table", "rows": ["g"]},
            metadata=METADATA,
            dataset=path,
        )
    )
    assert result.backend == "process" and result.wall_seconds > 0
    assert isinstance(result.output, TableOutput)
    return result.output.values


def test_factory_builds_the_process_backend(
    monkeypatch: pytest.MonkeyPatch, missing_isolation: Callable[[str], NoReturn]
) -> None:
    monkeypatch.setenv("SAFEACCESS_SANDBOX_BACKEND", "process")
    try:
        built = make_backend(SandboxConfig())
    except SandboxUnavailable as exc:
        missing_isolation(str(exc))
    assert isinstance(built, ProcessBackend) and isinstance(built, Backend)
    built.close()


def test_warm_sandbox_serves_the_next_job_and_sees_a_replaced_dataset(
    backend: ProcessBackend, tmp_path: Path
) -> None:
    path = tmp_path / "d.parquet"
    _write(path, ["a", "a", "b"])
    assert _table(backend, path) == [[2.0], [1.0]]
    _wait_for_warm(backend)  # a sandbox for the same dataset is waiting
    assert _table(backend, path) == [[2.0], [1.0]]
    _write(path, ["a", "b", "b", "b"])  # new version: the waiting sandbox has the old file bound
    assert _table(backend, path) == [[1.0], [3.0]]


def test_warm_sandbox_outlives_the_thread_that_ran_the_job(
    backend: ProcessBackend, tmp_path: Path
) -> None:
    # Linux's parent-death signal follows the thread that forked; warm sandboxes must not die
    # with a short-lived request thread.
    path = tmp_path / "d.parquet"
    _write(path, ["a", "b", "b"])
    thread = threading.Thread(target=_table, args=(backend, path))
    thread.start()
    thread.join()
    _wait_for_warm(backend)
    time.sleep(0.5)
    ((proc, _),) = next(iter(backend._warm.values()))
    assert proc.poll() is None
    assert _table(backend, path) == [[1.0], [2.0]]


def test_close_stops_warm_sandboxes(backend: ProcessBackend, tmp_path: Path) -> None:
    path = tmp_path / "d.parquet"
    _write(path, ["a"])
    _table(backend, path)
    _wait_for_warm(backend)
    waiting = [proc for procs in backend._warm.values() for proc, _ in procs]
    assert waiting
    backend.close()
    assert all(proc.poll() is not None for proc in waiting)
    assert backend._warm == {}


def test_analysis_errors_are_typed_with_the_runner_code(
    backend: ProcessBackend, tmp_path: Path
) -> None:
    path = tmp_path / "d.parquet"
    _write(path, ["a", "b"])
    job = Job(
        job_id="bad",
        analysis={"kind": "frequency_table", "rows": ["g"], "where": "g = = 'a'"},
        metadata=METADATA,
        dataset=path,
    )
    with pytest.raises(AnalysisFailed) as info:
        backend.run(job)
    assert info.value.runner_code == "bad_filter"


def test_missing_dataset_is_refused_before_starting(
    backend: ProcessBackend, tmp_path: Path
) -> None:
    job = Job(
        job_id="missing",
        analysis={"kind": "frequency_table", "rows": ["g"]},
        metadata=METADATA,
        dataset=tmp_path / "absent.parquet",
    )
    with pytest.raises(SandboxError, match="does not exist"):
        backend.run(job)


def test_warm_sandbox_preloads_the_libraries_of_the_last_kind(
    backend: ProcessBackend, tmp_path: Path
) -> None:
    path = tmp_path / "r.parquet"
    pd.DataFrame({"g": ["a", "b"] * 10, "x": [float(i) for i in range(20)]}).to_parquet(path)
    metadata = {
        "name": "r",
        "columns": [{"name": "g", "type": "categorical"}, {"name": "x", "type": "continuous"}],
    }
    probe = {"kind": "script", "code": "import sys\nresult = 'statsmodels' in sys.modules"}

    def run(analysis: dict) -> object:
        return backend.run(Job(job_id="p", analysis=analysis, metadata=metadata, dataset=path))

    run({"kind": "frequency_table", "rows": ["g"]})
    _wait_for_warm(backend)
    time.sleep(1.0)
    assert run(probe).output.result is False  # type: ignore[attr-defined]
    _wait_for_warm(backend)
    run({"kind": "regression", "formula": "x ~ g"})
    _wait_for_warm(backend)
    time.sleep(3.0)  # let it import statsmodels
    assert run(probe).output.result is True  # type: ignore[attr-defined]


def test_user_namespace_variant_runs_jobs(
    backend: ProcessBackend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The command line used by a non-root server (bubblewrap in a user namespace, no uid switch)
    # must build a working sandbox too; here it is exercised by pretending not to be root.
    monkeypatch.setattr(ProcessBackend, "as_root", property(lambda self: False))
    plain = ProcessBackend(Limits(wall_seconds=60), warm_per_dataset=False, mode="warm")
    args = plain.command(tmp_path / "d.parquet", plain.limits, None)
    assert "--unshare-user" in args and "CAP_SETUID" not in args
    path = tmp_path / "d.parquet"
    _write(path, ["a", "b", "b"])
    assert _table(plain, path) == [[1.0], [2.0]]


def test_abandon_stops_a_running_job_as_the_centres_failure(
    backend: ProcessBackend, tmp_path: Path
) -> None:
    # A stopping worker hands its jobs back (server/jobs/handback.py): the sandbox of a job
    # still running is killed, and the run reports the centre's failure, never the script's
    # own (a crash would be recorded for the checkers).
    path = tmp_path / "d.parquet"
    _write(path, ["a"] * 12)
    sleeper = Job(
        job_id="s",
        analysis={"kind": "script", "code": "import time\ntime.sleep(60)\nresult = 1"},
        metadata=METADATA,
        dataset=path,
    )
    abandon_mid_run(backend, sleeper, start_within=30, stop_within=10)
    with pytest.raises(SandboxUnavailable, match="hands its jobs back"):
        _table(backend, path)
