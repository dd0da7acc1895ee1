"""Storage "duckdb" through the real process sandbox (bubblewrap, rlimits, seccomp).

DuckDB starts threads and maps memory inside a job that has dropped every privilege and runs
under the seccomp allow-list; its template loads no data; the dataset file is readable by root
only, as the server stores it. Both modes of the backend: forked from a template (root server)
and one-shot sandboxes ("warm").
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
import pandas as pd
import pytest

from safeaccess.rules.outputs import TableOutput, query_set_of
from safeaccess.sandbox.backend import AnalysisFailed, Job, Limits, SandboxUnavailable
from safeaccess.sandbox.process import ProcessBackend

pytest.importorskip("duckdb")

COLUMNS = [
    {"name": "region", "type": "categorical", "levels": [1, 2, 3]},
    {"name": "sex", "type": "categorical", "levels": ["f", "m"]},
    {"name": "income", "type": "continuous"},
]
ANALYSES: list[dict[str, Any]] = [
    {"kind": "frequency_table", "rows": ["region"], "cols": ["sex"], "margins": True},
    {
        "kind": "magnitude_table",
        "rows": ["region"],
        "value": "income",
        "agg": "mean",
        "where": "sex = 'f' or income > 10",
    },
    {"kind": "histogram", "variable": "income", "by": ["sex"], "bins": 5},
]


def _metadata(storage: str) -> dict[str, Any]:
    return {"name": "people", "storage": storage, "columns": COLUMNS}


@pytest.fixture(params=["forkserver", "warm"])
def backend(
    request: pytest.FixtureRequest, missing_isolation: Callable[[str], NoReturn]
) -> Iterator[ProcessBackend]:
    b = ProcessBackend(Limits(wall_seconds=120), mode=request.param)
    if b.mode != request.param:
        missing_isolation("the fork server needs a root server")
    try:
        b.check_available()
    except SandboxUnavailable as exc:
        missing_isolation(str(exc))
    yield b
    b.close()


@pytest.fixture()
def dataset(tmp_path: Path) -> Path:
    rng = np.random.default_rng(3)
    n = 5000
    income = rng.gamma(2.0, 7.0, n)
    income[rng.random(n) < 0.05] = np.nan
    sex = rng.choice(np.array(["f", "m"], dtype=object), n)
    sex[rng.random(n) < 0.02] = None
    frame = pd.DataFrame({"region": rng.integers(1, 5, n), "sex": sex, "income": income})
    path = tmp_path / "people.parquet"
    frame.to_parquet(path, index=False, row_group_size=700)
    os.chmod(path, 0o440)  # as the server stores datasets: the job's uid cannot open it
    return path


def _run(backend: ProcessBackend, path: Path, analysis: dict[str, Any], storage: str) -> Any:
    job = Job(job_id="d", analysis=analysis, metadata=_metadata(storage), dataset=path)
    return backend.run(job)


def test_duckdb_jobs_in_the_sandbox_equal_the_in_memory_jobs(
    backend: ProcessBackend, dataset: Path
) -> None:
    for analysis in ANALYSES:
        memory = _run(backend, dataset, analysis, "memory")
        duck = _run(backend, dataset, analysis, "duckdb")
        assert isinstance(duck.output, TableOutput)
        assert duck.output.model_dump_json() == memory.output.model_dump_json(), analysis
        ours, theirs = query_set_of(duck.output), query_set_of(memory.output)
        assert ours is not None and theirs is not None
        assert np.array_equal(ours.to_array(), theirs.to_array())
    if backend.mode == "forkserver":
        # The duckdb jobs went to a template of their own (which loads no data: template.py).
        families = {key[-1] for key in backend._forks._templates}
        assert families == {"tables", "duckdb"}


def test_other_kinds_read_their_columns_in_the_sandbox_and_scripts_are_refused(
    backend: ProcessBackend, dataset: Path
) -> None:
    summary = {
        "kind": "summary",
        "variables": ["income"],
        "by": ["sex"],
        "statistics": ["count", "mean", "sd", "median"],
        "where": "region != 2",
    }
    memory = _run(backend, dataset, summary, "memory")
    duck = _run(backend, dataset, summary, "duckdb")
    assert duck.output.model_dump_json() == memory.output.model_dump_json()
    with pytest.raises(AnalysisFailed) as raised:
        _run(backend, dataset, {"kind": "script", "code": "result = 1"}, "duckdb")
    assert raised.value.runner_code == "storage_unsupported"


def test_duckdb_is_in_the_docker_image_closure() -> None:
    """The Docker image holds the sandbox distribution's dependency closure: DuckDB with it."""
    from packaging.utils import canonicalize_name

    from safeaccess.sandbox.docker.image import ROOT_DISTRIBUTION, _closure

    names = {canonicalize_name(d.metadata["Name"]) for d in _closure(ROOT_DISTRIBUTION)}
    assert "duckdb" in names


def test_duckdb_jobs_in_docker_equal_the_in_memory_jobs(sandbox_image: str, dataset: Path) -> None:
    """The same jobs in the Docker backend (its own seccomp profile, cgroup memory limit)."""
    from safeaccess.sandbox.config import DockerOptions
    from safeaccess.sandbox.docker import DockerBackend

    docker = DockerBackend(DockerOptions(image=sandbox_image), Limits(wall_seconds=120))
    docker.check_available()
    try:
        for analysis in ANALYSES[:2]:
            memory = docker.run(
                Job(job_id="m", analysis=analysis, metadata=_metadata("memory"), dataset=dataset)
            )
            duck = docker.run(
                Job(job_id="d", analysis=analysis, metadata=_metadata("duckdb"), dataset=dataset)
            )
            assert duck.output.model_dump_json() == memory.output.model_dump_json(), analysis
            ours, theirs = query_set_of(duck.output), query_set_of(memory.output)
            assert ours is not None and theirs is not None
            assert np.array_equal(ours.to_array(), theirs.to_array())
    finally:
        docker.close()
