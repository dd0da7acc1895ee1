"""The process backend's fork server: templates per dataset version, their restarts, and jobs.

Isolation of one job from another and from the template is in the abuse suite
(tests/sandbox/test_abuse.py, which runs every case on the fork server too).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn

import pandas as pd
import pytest

from safeaccess.rules.outputs import TableOutput
from safeaccess.sandbox.backend import (
    AnalysisFailed,
    Job,
    LimitExceeded,
    Limits,
    SandboxUnavailable,
)
from safeaccess.sandbox.config import SandboxConfig
from safeaccess.sandbox.factory import make_backend
from safeaccess.sandbox.process import ProcessBackend
from safeaccess.sandbox.process import backend as process

METADATA = {"name": "f", "columns": [{"name": "g", "type": "categorical"}]}


@pytest.fixture()
def backend(missing_isolation: Callable[[str], NoReturn]) -> Iterator[ProcessBackend]:
    b = ProcessBackend(Limits(wall_seconds=120))
    if b.mode != "forkserver":
        missing_isolation("the fork server needs a root server")
    try:
        b.check_available()
    except SandboxUnavailable as exc:
        missing_isolation(str(exc))
    if b.mode != "forkserver":  # the start-up probe fell back to warm sandboxes
        missing_isolation(b.mode_reason)
    yield b
    b.close()


def _write(path: Path, values: list[str]) -> None:
    tmp = path.with_suffix(".tmp")
    pd.DataFrame({"g": values}).to_parquet(tmp)
    os.replace(tmp, path)  # a new file version, as a dataset upload would do


def _job(path: Path, analysis: dict[str, Any] | None = None, **limits: Any) -> Job:
    extra: dict[str, Any] = {"limits": Limits(wall_seconds=120, **limits)} if limits else {}
    return Job(
        job_id="f",
        analysis=analysis or {"kind": "frequency_table", "rows": ["g"]},
        metadata=METADATA,
        dataset=path,
        **extra,
    )


def _table(backend: ProcessBackend, path: Path) -> list[list[float | None]]:
    result = backend.run(_job(path))
    assert result.backend == "process"
    assert isinstance(result.output, TableOutput)
    return result.output.values


def test_the_fork_server_is_the_default(
    monkeypatch: pytest.MonkeyPatch, missing_isolation: Callable[[str], NoReturn], tmp_path: Path
) -> None:
    monkeypatch.setenv("SAFEACCESS_SANDBOX_BACKEND", "process")
    try:
        built = make_backend(SandboxConfig())
    except SandboxUnavailable as exc:
        missing_isolation(str(exc))
    assert isinstance(built, ProcessBackend)
    try:
        if os.geteuid() != 0:
            assert built.mode == "warm"
            return
        assert built.mode == "forkserver"
        path = tmp_path / "d.parquet"
        _write(path, ["a", "b", "b"])
        assert _table(built, path) == [[1.0], [2.0]]
        (template,) = built.templates()
        assert template.usable
    finally:
        built.close()


def test_one_template_serves_many_jobs(backend: ProcessBackend, tmp_path: Path) -> None:
    path = tmp_path / "d.parquet"
    _write(path, ["a", "a", "b"])
    assert _table(backend, path) == [[2.0], [1.0]]
    (template,) = backend.templates()
    for _ in range(3):
        assert _table(backend, path) == [[2.0], [1.0]]
    assert backend.templates() == [template] and template.proc.poll() is None


def test_a_replaced_dataset_gets_a_new_template(backend: ProcessBackend, tmp_path: Path) -> None:
    path = tmp_path / "d.parquet"
    _write(path, ["a", "a", "b"])
    assert _table(backend, path) == [[2.0], [1.0]]
    (old,) = backend.templates()
    _write(path, ["a", "b", "b", "b"])
    assert _table(backend, path) == [[1.0], [3.0]]
    (new,) = backend.templates()
    assert new is not old
    old.proc.wait(timeout=10)  # the retired template has stopped


def test_jobs_with_other_limits_share_the_template_under_their_own_limits(
    backend: ProcessBackend, tmp_path: Path
) -> None:
    path = tmp_path / "d.parquet"
    _write(path, ["a", "b"])
    probe = {
        "kind": "script",
        "code": "import resource\nresult = resource.getrlimit(resource.RLIMIT_NPROC)[0]",
    }
    assert backend.run(_job(path, probe)).output.result == 64  # type: ignore[union-attr]
    assert backend.run(_job(path, probe, max_processes=9)).output.result == 9  # type: ignore[union-attr]
    with pytest.raises(LimitExceeded) as info:
        backend.run(
            _job(path, {"kind": "script", "code": "print('x' * 9000)"}, max_output_bytes=4096)
        )
    assert info.value.limit == "output"
    assert len(backend.templates()) == 1


def test_a_changed_runner_restarts_the_template(
    backend: ProcessBackend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "d.parquet"
    _write(path, ["a", "b"])
    _table(backend, path)
    (old,) = backend.templates()
    checked, (newest, count) = backend._runner_version
    monkeypatch.setattr(process, "_runner_version", lambda: (newest + 1, count))
    backend._runner_version = (checked - 60, (newest, count))  # due for a check
    assert _table(backend, path) == [[1.0], [1.0]]
    (new,) = backend.templates()
    assert new is not old


def test_a_damaged_template_is_replaced(backend: ProcessBackend, tmp_path: Path) -> None:
    path = tmp_path / "d.parquet"
    _write(path, ["a", "b", "b"])
    _table(backend, path)
    (old,) = backend.templates()
    os.killpg(old.proc.pid, signal.SIGKILL)
    old.proc.wait(timeout=10)
    deadline = time.monotonic() + 10
    while old.usable and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _table(backend, path) == [[1.0], [2.0]]
    (new,) = backend.templates()
    assert new is not old and new.usable


def test_jobs_run_under_fresh_uids_as_pid_one(backend: ProcessBackend, tmp_path: Path) -> None:
    path = tmp_path / "d.parquet"
    _write(path, ["a"])
    probe = {
        "kind": "script",
        "code": "import os\nresult = [os.getpid(), os.getuid(), os.getgid(), os.getgroups()]",
    }
    first = backend.run(_job(path, probe)).output.result  # type: ignore[union-attr]
    second = backend.run(_job(path, probe)).output.result  # type: ignore[union-attr]
    assert first[0] == second[0] == 1  # pid 1 of its own pid namespace
    if os.geteuid() == 0:
        assert first[1] != 0 and second[1] != 0 and first[1] != second[1]
        assert first[3] == [] and first[1] == first[2]


def test_cpu_limit_applies_to_a_forked_job(backend: ProcessBackend, tmp_path: Path) -> None:
    path = tmp_path / "d.parquet"
    _write(path, ["a"])
    with pytest.raises(LimitExceeded) as info:
        backend.run(
            _job(path, {"kind": "script", "code": "while True:\n    pass\n"}, cpu_seconds=1)
        )
    assert info.value.limit == "cpu"


def test_close_stops_the_templates(backend: ProcessBackend, tmp_path: Path) -> None:
    path = tmp_path / "d.parquet"
    _write(path, ["a"])
    _table(backend, path)
    templates = backend.templates()
    assert templates
    backend.close()
    assert all(t.proc.poll() is not None for t in templates)
    assert backend.templates() == []


def test_the_template_maps_the_code_arrays(backend: ProcessBackend, tmp_path: Path) -> None:
    """A version with code arrays is counted on them: arrays written for a declared level no
    record has ("z") make it a row of the table, where coding the values afresh (the same data
    without arrays) would not. The job's metadata never differs from the registered one in
    production; here it does, so that the output shows which path ran."""
    from safeaccess.client.metadata import DatasetMetadata
    from safeaccess.sandbox.codes import write_codes

    declared = DatasetMetadata.model_validate(
        {"name": "f", "columns": [{"name": "g", "type": "categorical", "levels": list("abz")}]}
    )
    coded, plain = tmp_path / "c" / "v1.parquet", tmp_path / "p" / "v1.parquet"
    for path in (coded, plain):
        path.parent.mkdir()
        _write(path, ["a", "b", "a", None])  # type: ignore[list-item]
    write_codes(coded, declared)
    rows = {}
    for path in (coded, plain):
        result = backend.run(_job(path))
        assert isinstance(result.output, TableOutput)
        rows[path] = result.output.row_labels
    assert rows[coded] == [["a"], ["b"], ["z"]]
    assert rows[plain] == [["a"], ["b"]]


def _script(path: Path, code: str, wall_seconds: float) -> Job:
    return Job(
        job_id="f",
        analysis={"kind": "script", "code": code},
        metadata=METADATA,
        dataset=path,
        limits=Limits(wall_seconds=wall_seconds),
    )


def test_a_job_that_floods_its_stderr_is_served_and_its_tail_kept(
    backend: ProcessBackend, tmp_path: Path
) -> None:
    # 1 MB to stderr before the reply: a pipe holds 64 KB, so the host must read it while it
    # waits for the reply, or the job blocks until its wall clock runs out. What the job wrote
    # last (a memory error's marker, after the flood) must be in the tail the host keeps.
    path = tmp_path / "d.parquet"
    _write(path, ["a"])
    code = "import os\nos.write(2, b'x' * 1_000_000)\nos.write(2, b'MemoryError')\nos._exit(1)\n"
    started = time.monotonic()
    with pytest.raises(LimitExceeded) as info:
        backend.run(_script(path, code, wall_seconds=20))
    assert info.value.limit == "memory"
    assert time.monotonic() - started < 10


def test_a_request_larger_than_the_sockets_buffer_reaches_the_job_whole(
    backend: ProcessBackend, tmp_path: Path
) -> None:
    # The host writes the request as the job takes it, between reads of the reply: 4 MB is
    # many times a socket's buffer. The job answers only once it has parsed the request
    # whole: here, that its script is over the size cap, which only the whole request shows.
    path = tmp_path / "d.parquet"
    _write(path, ["a"])
    started = time.monotonic()
    with pytest.raises(AnalysisFailed) as info:
        backend.run(_script(path, "result = 1\n" + "#" * 4_000_000 + "\n", wall_seconds=20))
    assert "script.code" in str(info.value)
    assert time.monotonic() - started < 10
