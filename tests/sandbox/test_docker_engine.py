"""The Docker backend against the real engine: results, hardening as applied, limits, the pool."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from abandoning import abandon_mid_run

from safeaccess.sandbox.backend import (
    AnalysisFailed,
    Job,
    LimitExceeded,
    Limits,
    SandboxUnavailable,
)
from safeaccess.sandbox.config import DockerOptions, SandboxConfig
from safeaccess.sandbox.docker import DockerBackend
from safeaccess.sandbox.docker.container import LABEL_OWNER, DatasetKey
from safeaccess.sandbox.factory import make_backend
from safeaccess.sandbox.seccomp import docker_profile

pytestmark = pytest.mark.docker

METADATA = {
    "name": "people",
    "columns": [
        {"name": "sex", "type": "categorical", "levels": ["F", "M"]},
        {"name": "region", "type": "categorical", "levels": ["N", "S", "E"]},
        {"name": "income", "type": "continuous"},
    ],
}
LIMITS = Limits(wall_seconds=60, memory_mb=512, max_processes=32, cpu_seconds=30)


@pytest.fixture(scope="module")
def frame() -> pd.DataFrame:
    rng = np.random.default_rng(7)
    return pd.DataFrame(
        {
            "sex": rng.choice(["F", "M"], 500),
            "region": rng.choice(["N", "S", "E"], 500),
            "income": rng.normal(30_000, 5_000, 500),
        }
    )


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory, frame: pd.DataFrame) -> Path:
    path = tmp_path_factory.mktemp("data") / "people.parquet"
    frame.to_parquet(path)
    path.chmod(0o440)  # as the server stores datasets
    return path


@pytest.fixture(scope="module")
def backend(sandbox_image: str) -> Iterator[DockerBackend]:
    b = DockerBackend(DockerOptions(image=sandbox_image), LIMITS)
    b.check_available()
    yield b
    b.close()


@pytest.fixture(scope="module")
def pooled(sandbox_image: str) -> Iterator[DockerBackend]:
    b = DockerBackend(DockerOptions(image=sandbox_image, pool_size=1), LIMITS)
    b.check_available()
    yield b
    b.close()


def _job(dataset: Path, analysis: dict[str, Any], limits: Limits = LIMITS) -> Job:
    return Job(job_id="t", analysis=analysis, metadata=METADATA, dataset=dataset, limits=limits)


def _script(dataset: Path, code: str, limits: Limits = LIMITS) -> Job:
    return _job(dataset, {"kind": "script", "code": code}, limits)


def _ours(client: Any, backend: DockerBackend) -> list[Any]:
    """The backend's containers, as the engine lists them (filtered by the engine and not
    inspected one by one: a container removed between the list and its inspection, by the
    backend's reaper or anyone sharing the engine, failed the test with a 404)."""
    label = f"{LABEL_OWNER}={backend._owner}"
    return list(client.containers.list(all=True, sparse=True, filters={"label": label}))


def test_frequency_table_matches_pandas(
    backend: DockerBackend, dataset: Path, frame: pd.DataFrame
) -> None:
    result = backend.run(_job(dataset, {"kind": "frequency_table", "rows": ["sex", "region"]}))
    assert result.backend == "docker"
    out = result.output
    assert out.type == "table"
    expected = frame.groupby(["sex", "region"]).size()
    got = {
        tuple(str(v) for v in label): row[0]
        for label, row in zip(out.row_labels, out.values, strict=True)  # type: ignore[union-attr]
    }
    assert got == {k: float(v) for k, v in expected.items()}


def test_make_backend_builds_a_checked_docker_backend(sandbox_image: str) -> None:
    backend = make_backend(
        SandboxConfig(backend="docker", docker=DockerOptions(image=sandbox_image))
    )
    try:
        assert isinstance(backend, DockerBackend)
    finally:
        backend.close()


def test_warm_pool_is_sized_from_the_servers_concurrency_by_default(sandbox_image: str) -> None:
    sized = make_backend(
        SandboxConfig(backend="docker", docker=DockerOptions(image=sandbox_image)), concurrency=3
    )
    explicit = make_backend(
        SandboxConfig(backend="docker", docker=DockerOptions(image=sandbox_image, pool_size=0)),
        concurrency=3,
    )
    try:
        assert isinstance(sized, DockerBackend) and isinstance(explicit, DockerBackend)
        assert sized._pool is not None and sized._pool.size == 3
        assert explicit._pool is None  # an explicit 0 still means no pool
    finally:
        sized.close()
        explicit.close()


def test_absent_image_is_unavailable() -> None:
    backend = DockerBackend(DockerOptions(image="sha256:" + "0" * 64))
    with pytest.raises(SandboxUnavailable, match="not on the Docker Engine"):
        backend.check_available()


def test_engine_applies_the_hardening(
    backend: DockerBackend, dataset: Path, docker_client: Any
) -> None:
    job = backend._start_container((DatasetKey.of(dataset), LIMITS), 120)
    try:
        attrs = docker_client.api.inspect_container(job.container.id)
    finally:
        backend._discard(job)
    host = attrs["HostConfig"]
    assert host["NetworkMode"] == "none"
    assert host["ReadonlyRootfs"] is True
    assert host["CapDrop"] == ["ALL"] and not host["CapAdd"]
    # no-new-privileges, and our own seccomp allow-list instead of the engine's default profile.
    assert host["SecurityOpt"][0] == "no-new-privileges" and len(host["SecurityOpt"]) == 2
    kind, _, profile = host["SecurityOpt"][1].partition("=")
    assert kind == "seccomp"
    assert json.loads(profile) == docker_profile()
    assert json.loads(profile)["defaultAction"] == "SCMP_ACT_ERRNO"
    assert host["Privileged"] is False
    assert host["Init"] is True
    assert host["IpcMode"] == "none"
    assert host["PidsLimit"] == LIMITS.max_processes + 1
    assert host["Memory"] == host["MemorySwap"] == 512 * 1024 * 1024
    assert host["NanoCpus"] == 1_000_000_000
    assert host["LogConfig"]["Type"] == "json-file" and host["LogConfig"]["Config"]["max-size"]
    assert "noexec" in host["Tmpfs"]["/tmp"]
    assert attrs["Config"]["User"] == "10001:10001"
    assert attrs["Config"]["Env"] is not None
    mounts = attrs["Mounts"]
    assert [(m["Type"], m["Source"], m["Destination"], m["RW"]) for m in mounts] == [
        ("bind", str(dataset.resolve()), "/data/dataset.parquet", False)
    ]


def test_job_sees_a_locked_down_container(backend: DockerBackend, dataset: Path) -> None:
    code = """
import os
status = open('/proc/self/status').read()
caps = [l.split()[1] for l in status.splitlines() if l.startswith(('CapEff', 'CapPrm', 'CapBnd'))]
nnp = [l.split()[1] for l in status.splitlines() if l.startswith('NoNewPrivs')]
result = {'uid': os.getuid(), 'gid': os.getgid(), 'caps': caps, 'nnp': nnp,
          'data': sorted(os.listdir('/data')), 'nrows': len(df)}
"""
    out = backend.run(_script(dataset, code)).output
    r = out.result  # type: ignore[union-attr]
    assert r["uid"] == 10001 and r["gid"] == 10001
    assert r["caps"] == ["0000000000000000"] * 3
    assert r["nnp"] == ["1"]
    assert r["data"] == ["dataset.parquet"]
    assert r["nrows"] == 500


def test_analysis_error_is_reported(backend: DockerBackend, dataset: Path) -> None:
    with pytest.raises(AnalysisFailed) as info:
        backend.run(_job(dataset, {"kind": "frequency_table", "rows": ["nope"]}))
    assert info.value.runner_code


def test_wall_clock_limit_kills_and_removes(
    backend: DockerBackend, dataset: Path, docker_client: Any
) -> None:
    limits = Limits(wall_seconds=4, cpu_seconds=60, memory_mb=512)
    start = time.monotonic()
    with pytest.raises(LimitExceeded) as info:
        backend.run(_script(dataset, "import time\nwhile True: time.sleep(1)", limits))
    assert info.value.limit == "wall"
    assert time.monotonic() - start < 4 + 10
    backend._reaper.submit(lambda: None).result()  # removals queued before this are done
    deadline = time.monotonic() + 10
    while _ours(docker_client, backend) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _ours(docker_client, backend) == []


def test_cpu_limit(backend: DockerBackend, dataset: Path) -> None:
    limits = Limits(wall_seconds=60, cpu_seconds=3, memory_mb=512)
    with pytest.raises(LimitExceeded) as info:
        backend.run(_script(dataset, "while True:\n    pass", limits))
    assert info.value.limit == "cpu"


def test_memory_limit(backend: DockerBackend, dataset: Path) -> None:
    limits = Limits(wall_seconds=60, memory_mb=256)
    code = "blocks = []\nwhile True:\n    blocks.append(bytearray(32 * 2**20))"
    with pytest.raises(LimitExceeded) as info:
        backend.run(_script(dataset, code, limits))
    assert info.value.limit == "memory"


def test_output_limit_is_an_error_not_a_truncation(backend: DockerBackend, dataset: Path) -> None:
    limits = Limits(wall_seconds=60, max_output_bytes=64 * 1024)
    code = "result = 'x' * 500_000"  # a legal result, larger than this job's output limit
    with pytest.raises(LimitExceeded) as info:
        backend.run(_script(dataset, code, limits))
    assert info.value.limit == "output"


def test_pool_serves_warm_one_job_per_container(
    pooled: DockerBackend, dataset: Path, docker_client: Any
) -> None:
    assert pooled.wait_warm(dataset, timeout=120)
    warm_ids = {c.id for c in _ours(docker_client, pooled)}
    assert len(warm_ids) == 1
    first = pooled.run(_script(dataset, "open('/tmp/mark', 'w').write('x')\nresult = 1"))
    assert first.output.result == 1  # type: ignore[union-attr]
    assert pooled.wait_warm(dataset, timeout=120)
    # The second job must not see the first one's file: a fresh container, not a reused one.
    second = pooled.run(_script(dataset, "import os\nresult = os.path.exists('/tmp/mark')"))
    assert second.output.result is False  # type: ignore[union-attr]
    pooled._reaper.submit(lambda: None).result()
    assert not warm_ids & {c.id for c in _ours(docker_client, pooled)}


def test_close_removes_warm_containers(
    sandbox_image: str, dataset: Path, docker_client: Any
) -> None:
    b = DockerBackend(DockerOptions(image=sandbox_image, pool_size=1), LIMITS)
    assert b.wait_warm(dataset, timeout=120)
    assert len(_ours(docker_client, b)) == 1
    b.close()
    assert _ours(docker_client, b) == []
    with pytest.raises(SandboxUnavailable):
        b.run(_job(dataset, {"kind": "frequency_table", "rows": ["sex"]}))


def test_cli_builds_and_records_the_image(
    sandbox_image: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from safeaccess.server.admin.sandbox import main

    config = tmp_path / "config.yaml"
    config.write_text("server_id: centre-1\nsandbox:\n  backend: docker\n")
    assert main(["build-image", "--config", str(config)]) == 0
    assert capsys.readouterr().out.strip() == sandbox_image  # unchanged inputs: same image
    assert sandbox_image in config.read_text()
    assert main(["check", "--config", str(config)]) == 0


def test_orphans_of_a_dead_process_are_reaped(
    backend: DockerBackend, sandbox_image: str, docker_client: Any
) -> None:
    import socket
    import subprocess
    import sys

    from safeaccess.sandbox.docker.container import LABEL_ROLE

    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    owner = f"{socket.gethostname()}/{int(dead.stdout)}/crashed"
    orphan = docker_client.containers.create(
        sandbox_image, labels={LABEL_ROLE: "job", LABEL_OWNER: owner}, network_mode="none"
    )
    try:
        assert backend.reap_orphans() >= 1
        remaining = docker_client.containers.list(all=True, filters={"id": orphan.id})
        assert remaining == []
    finally:
        with __import__("contextlib").suppress(Exception):
            orphan.remove(force=True)


def test_image_carries_no_server_code_or_host_tools(backend: DockerBackend, dataset: Path) -> None:
    code = """
import importlib, os
def importable(name):
    try:
        importlib.import_module(name)
        return True
    except ImportError:
        return False
result = {name: importable(name) for name in
          ("safeaccess.server", "docker", "fastapi", "sqlalchemy", "pip", "safeaccess.sandbox.runner")}
result["shells"] = [p for p in ("/bin/sh", "/bin/bash", "/usr/bin/sh") if os.path.exists(p)]
"""
    r = backend.run(_script(dataset, code)).output.result  # type: ignore[union-attr]
    assert r == {
        "safeaccess.server": False,
        "docker": False,
        "fastapi": False,
        "sqlalchemy": False,
        "pip": False,
        "safeaccess.sandbox.runner": True,
        "shells": [],
    }


def test_a_model_trains_in_the_image_and_its_leaf_query_sets_arrive(
    backend: DockerBackend, dataset: Path, frame: pd.DataFrame
) -> None:
    analysis = {
        "kind": "model_training",
        "family": "random_forest",
        "target": "sex",
        "features": ["region", "income"],
        "params": {"n_estimators": 2, "max_depth": 2, "min_samples_leaf": 30},
    }
    result = backend.run(_job(dataset, analysis))
    out = result.output
    assert out.type == "model"
    assert len(out.model.trees) == 2
    # one array per tree (tree 0's leaves and the test cell, then tree 1's leaves), then the
    # records a missing value left out
    assert len(result.query_sets) == 3
    assert (result.query_sets[0] >= 0).sum() == len(frame)
    assert (result.query_sets[1] >= 0).sum() == out.n_train
    incomplete = frame[["region", "income", "sex"]].isna().any(axis=1).sum()
    assert (result.query_sets[2] >= 0).sum() == incomplete


def test_abandon_stops_a_running_container_as_the_centres_failure(
    sandbox_image: str, dataset: Path, docker_client: Any
) -> None:
    # A stopping worker hands its jobs back (server/jobs/handback.py): the container of a job
    # still running is stopped and removed, and the run reports the centre's failure, never the
    # script's own.
    b = DockerBackend(DockerOptions(image=sandbox_image), LIMITS)
    sleeper = _script(dataset, "import time\ntime.sleep(60)\nresult = 1")
    abandon_mid_run(b, sleeper, start_within=60, stop_within=15)
    assert _ours(docker_client, b) == []  # abandon closes: the stopped container is removed
    with pytest.raises(SandboxUnavailable):
        b.run(_job(dataset, {"kind": "frequency_table", "rows": ["sex"]}))
