"""The process backend really isolates jobs: network, host files, dataset, memory, time, processes.

These run real bubblewrap sandboxes. Every job is a `script` analysis (arbitrary Python in the
sandbox), the strongest thing a researcher can send.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

import numpy as np
import pandas as pd
import pytest

from safeaccess.sandbox.backend import Job, LimitExceeded, Limits, SandboxError, SandboxUnavailable
from safeaccess.sandbox.process import ProcessBackend

METADATA = {
    "name": "iso",
    "columns": [
        {"name": "sex", "type": "categorical", "levels": ["F", "M"]},
        {"name": "income", "type": "continuous"},
    ],
}


@pytest.fixture(scope="module")
def backend(missing_isolation: Callable[[str], NoReturn]) -> ProcessBackend:
    b = ProcessBackend(Limits(wall_seconds=60))
    try:
        b.check_available()
    except SandboxUnavailable as exc:
        missing_isolation(str(exc))
    return b


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("data") / "iso.parquet"
    pd.DataFrame({"sex": ["F", "M"] * 20, "income": np.arange(40, dtype=float)}).to_parquet(path)
    path.chmod(0o600)  # readable by the server's user only, like a real data directory
    return path


def _script(code: str, dataset: Path, **limits: float) -> Job:
    return Job(
        job_id="iso",
        analysis={"kind": "script", "code": code},
        metadata=METADATA,
        dataset=dataset,
        limits=Limits(**limits),
    )


def _run_script(backend: ProcessBackend, code: str, dataset: Path, **limits: float) -> dict:
    result = backend.run(_script(code, dataset, **limits))
    assert result.output.type == "script"
    return {"stdout": result.output.stdout, "result": result.output.result}


def test_script_sees_the_dataset_and_runs_unprivileged(
    backend: ProcessBackend, dataset: Path
) -> None:
    out = _run_script(
        backend,
        "import os\nresult = {'rows': len(df), 'uid': os.getuid(), 'sum': float(df.income.sum())}",
        dataset,
    )
    assert out["result"]["rows"] == 40
    assert out["result"]["sum"] == sum(range(40))
    if os.geteuid() == 0:
        assert out["result"]["uid"] != 0


def test_no_network_connection_reaches_a_host_listener(
    backend: ProcessBackend, dataset: Path
) -> None:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(5)
    listener.settimeout(0.2)
    port = listener.getsockname()[1]
    accepted: list[object] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            accepted.append(conn)

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    code = (
        "import socket\n"
        "try:\n"
        f"    socket.create_connection(('127.0.0.1', {port}), timeout=3)\n"
        "    result = 'connected'\n"
        "except OSError as exc:\n"
        "    result = 'refused: ' + type(exc).__name__\n"
        "try:\n"
        "    socket.getaddrinfo('example.org', 80)\n"
        "    result += ' dns-ok'\n"
        "except OSError:\n"
        "    result += ' dns-failed'\n"
    )
    try:
        out = _run_script(backend, code, dataset)
    finally:
        time.sleep(0.3)
        stop.set()
        thread.join()
        listener.close()
    assert accepted == []
    assert out["result"].startswith("refused")
    assert out["result"].endswith("dns-failed")


def test_server_database_keys_and_environment_are_invisible(
    backend: ProcessBackend, dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data_dir = tmp_path / "datadir"
    data_dir.mkdir()
    db = data_dir / "state.sqlite"
    db.write_bytes(b"SQLite format 3\x00 secret-db-content")
    key = data_dir / "signing.key"
    key.write_bytes(b"secret-key-material")
    key.chmod(0o600)
    # Even a world-readable file must be out of reach: isolation is by mounts, not permissions.
    public = data_dir / "public.txt"
    public.write_bytes(b"secret-public-file")
    public.chmod(0o644)
    monkeypatch.setenv("SAFEACCESS_TEST_SECRET", "secret-env-value")
    paths = [str(db), str(key), str(public), str(Path(__file__).resolve())]
    code = (
        "import os\n"
        "seen = {}\n"
        f"for p in {paths!r}:\n"
        "    try:\n"
        "        seen[p] = open(p, 'rb').read().decode('latin-1')\n"
        "    except OSError as exc:\n"
        "        seen[p] = 'error: ' + type(exc).__name__\n"
        "seen['env'] = dict(os.environ)\n"
        "result = seen\n"
    )
    out = _run_script(backend, code, dataset)
    text = json.dumps(out)
    assert "secret" not in text
    for p in paths:
        assert out["result"][p].startswith("error")
    assert "SAFEACCESS_TEST_SECRET" not in out["result"]["env"]


def test_dataset_cannot_be_modified(backend: ProcessBackend, dataset: Path) -> None:
    before = hashlib.sha256(dataset.read_bytes()).hexdigest()
    code = (
        "import os\n"
        "outcomes = []\n"
        "for action in ('append', 'remove', 'chmod'):\n"
        "    try:\n"
        "        if action == 'append':\n"
        "            open('/data/dataset.parquet', 'ab').write(b'x')\n"
        "        elif action == 'remove':\n"
        "            os.remove('/data/dataset.parquet')\n"
        "        else:\n"
        "            os.chmod('/data/dataset.parquet', 0o777)\n"
        "        outcomes.append(action + ': done')\n"
        "    except OSError as exc:\n"
        "        outcomes.append(action + ': ' + type(exc).__name__)\n"
        "result = outcomes\n"
    )
    out = _run_script(backend, code, dataset)
    assert all(": done" not in o for o in out["result"])
    assert hashlib.sha256(dataset.read_bytes()).hexdigest() == before


def test_memory_limit(backend: ProcessBackend, dataset: Path) -> None:
    code = "block = bytearray(3 * 1024 * 1024 * 1024)\nresult = len(block)\n"
    with pytest.raises(LimitExceeded) as info:
        backend.run(_script(code, dataset, memory_mb=768))
    assert info.value.limit == "memory"


def test_cpu_limit(backend: ProcessBackend, dataset: Path) -> None:
    started = time.monotonic()
    with pytest.raises(LimitExceeded) as info:
        backend.run(_script("while True:\n    pass\n", dataset, cpu_seconds=1, wall_seconds=60))
    assert info.value.limit == "cpu"
    assert time.monotonic() - started < 30


def test_wall_clock_limit_kills_a_sleeping_job(backend: ProcessBackend, dataset: Path) -> None:
    started = time.monotonic()
    with pytest.raises(LimitExceeded) as info:
        backend.run(_script("import time\ntime.sleep(120)\n", dataset, wall_seconds=2))
    assert info.value.limit == "wall"
    assert time.monotonic() - started < 20


def test_output_cap(backend: ProcessBackend, dataset: Path) -> None:
    with pytest.raises(LimitExceeded) as info:
        backend.run(_script("print('x' * 200000)\n", dataset, max_output_bytes=4096))
    assert info.value.limit == "output"


def test_fork_bomb_is_contained_while_another_job_is_served(
    backend: ProcessBackend, dataset: Path
) -> None:
    bomb = "import os\nwhile True:\n    os.fork()\n"
    outcome: list[object] = []

    def run_bomb() -> None:
        try:
            outcome.append(backend.run(_script(bomb, dataset, max_processes=16, wall_seconds=20)))
        except SandboxError as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run_bomb)
    thread.start()
    served: list[object] = []
    try:
        deadline = time.monotonic() + 60
        while thread.is_alive() and time.monotonic() < deadline and len(served) < 3:
            result = backend.run(
                Job(
                    job_id="parallel",
                    analysis={"kind": "frequency_table", "rows": ["sex"]},
                    metadata=METADATA,
                    dataset=dataset,
                )
            )
            served.append(result.output.values)  # type: ignore[union-attr]
    finally:
        thread.join(timeout=90)
    assert not thread.is_alive()
    assert served and served[0] == [[20.0], [20.0]]
    # The bomb hit the process limit (or, at worst, the wall clock), and the host can still fork.
    assert isinstance(outcome[0], LimitExceeded)
    assert outcome[0].limit in ("processes", "wall")
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    assert os.waitpid(pid, 0)[1] == 0


def test_missing_bwrap_is_unavailable_not_unisolated(tmp_path: Path) -> None:
    backend = ProcessBackend(Limits(), bwrap=str(tmp_path / "no-such-bwrap"))
    with pytest.raises(SandboxUnavailable):
        backend.check_available()
