"""The abuse suite: hostile `script` jobs against both sandbox backends.

Every case runs a hostile job next to a benign frequency table on the same backend and checks
that (1) the hostile job is contained — a typed error, or a result proving its attempts failed
inside the sandbox, (2) the benign job is still served correctly, and (3) the host is unaffected:
the data directory (dataset, decoy dataset, database, key) is byte-for-byte unchanged.

The backends run with their normal hardening; nothing here weakens them.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from safeaccess.sandbox.backend import (
    Backend,
    Job,
    LimitExceeded,
    Limits,
    RunResult,
    SandboxError,
    SandboxUnavailable,
)

SECRET = "abuse-" + secrets.token_hex(12)
ENV_SECRET = "SAFEACCESS_ABUSE_SECRET"
# Set at import, before any backend starts, so every sandbox process could inherit it if leaky.
os.environ[ENV_SECRET] = SECRET

METADATA = {
    "name": "abuse",
    "columns": [
        {"name": "sex", "type": "categorical", "levels": ["F", "M"]},
        {"name": "income", "type": "continuous"},
    ],
}
LIMITS = Limits(
    wall_seconds=30, cpu_seconds=20, memory_mb=512, max_processes=32, max_output_bytes=4 << 20
)
BENIGN = {"kind": "frequency_table", "rows": ["sex"]}

# Runs first in every hostile script: try something, record "ok:..." or "fail:ExceptionName".
PRELUDE = """
import os, socket, errno
def attempt(fn):
    try:
        value = fn()
        return "ok:" + repr(value)[:80]
    except BaseException as exc:
        return "fail:" + type(exc).__name__
"""


@pytest.fixture(scope="module")
def frame() -> pd.DataFrame:
    rng = np.random.default_rng(11)
    return pd.DataFrame(
        {"sex": rng.choice(["F", "M"], 300), "income": rng.normal(30_000, 4_000, 300)}
    )


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory, frame: pd.DataFrame) -> Path:
    """A server-like data directory: the job's dataset and decoys it must never reach."""
    root = tmp_path_factory.mktemp("server-data")
    root.chmod(0o700)
    frame.to_parquet(root / "dataset.parquet")
    pd.DataFrame({"secret": [SECRET] * 3}).to_parquet(root / "other.parquet")
    with sqlite3.connect(root / "safeaccess.db") as db:
        db.execute("create table s (v text)")
        db.execute("insert into s values (?)", (SECRET,))
    (root / "server_key.pem").write_text(f"-----BEGIN PRIVATE KEY-----\n{SECRET}\n")
    for name in ("dataset.parquet", "other.parquet"):
        (root / name).chmod(0o440)
    for name in ("safeaccess.db", "server_key.pem"):
        (root / name).chmod(0o600)
    return root


def _snapshot(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(
    scope="module", params=["process", pytest.param("docker", marks=pytest.mark.docker)]
)
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    b: Backend
    if request.param == "process":
        from safeaccess.sandbox.process import ProcessBackend

        b = ProcessBackend(limits=LIMITS)
        try:
            b.check_available()
        except SandboxUnavailable as exc:
            request.getfixturevalue("missing_isolation")(str(exc))
    else:
        from safeaccess.sandbox.docker import DockerBackend
        from safeaccess.sandbox.factory import DockerOptions

        image = request.getfixturevalue("sandbox_image")
        b = DockerBackend(options=DockerOptions(image=image), limits=LIMITS)
        b.check_available()
    yield b
    b.close()


@pytest.fixture(autouse=True)
def host_unaffected(data_dir: Path) -> Iterator[None]:
    before = _snapshot(data_dir)
    yield
    assert _snapshot(data_dir) == before, "a job changed the host's data directory"
    # The host can still start processes (a fork bomb did not exhaust them).
    assert subprocess.run(["true"], check=False).returncode == 0


def _job(data_dir: Path, code: str, limits: Limits = LIMITS) -> Job:
    return Job(
        job_id="hostile",
        analysis={"kind": "script", "code": PRELUDE + code},
        metadata=METADATA,
        dataset=data_dir / "dataset.parquet",
        limits=limits,
    )


def _hostile(backend: Backend, data_dir: Path, frame: pd.DataFrame, job: Job) -> Any:
    """Run `job` with a benign job alongside; return its RunResult or its SandboxError."""
    benign = Job(
        job_id="benign",
        analysis=BENIGN,
        metadata=METADATA,
        dataset=data_dir / "dataset.parquet",
        limits=LIMITS,
    )
    with ThreadPoolExecutor(max_workers=2) as pool:
        hostile_future = pool.submit(backend.run, job)
        time.sleep(0.3)  # let the hostile job get going first
        benign_result = pool.submit(backend.run, benign).result(timeout=300)
        try:
            outcome: Any = hostile_future.result(timeout=300)
        except SandboxError as exc:
            outcome = exc
    expected = frame["sex"].value_counts()
    table = benign_result.output
    got = {str(label[0]): row[0] for label, row in zip(table.row_labels, table.values, strict=True)}  # type: ignore[union-attr]
    assert got == {k: float(v) for k, v in expected.items()}, "the benign job was not served"
    if isinstance(outcome, RunResult):
        assert SECRET not in outcome.output.model_dump_json(), "a secret leaked into the output"
    return outcome


def _result(outcome: Any) -> dict[str, str]:
    assert isinstance(outcome, RunResult), f"expected a result, got {outcome!r}"
    result = outcome.output.result  # type: ignore[union-attr]
    assert isinstance(result, dict), outcome.output
    return result


def _all_failed(result: dict[str, str]) -> None:
    succeeded = {k: v for k, v in result.items() if not v.startswith("fail:")}
    assert not succeeded, f"these hostile attempts succeeded: {succeeded}"


def test_network_is_unreachable(backend: Backend, data_dir: Path, frame: pd.DataFrame) -> None:
    code = """
def tcp():
    s = socket.create_connection(("1.1.1.1", 53), timeout=2)
    s.close()
def udp():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(2)
    s.sendto(b"x", ("8.8.8.8", 53))
    return s.recvfrom(10)
def tcp6():
    socket.create_connection(("2606:4700:4700::1111", 53), timeout=2)
def engine():
    s = socket.socket(socket.AF_UNIX)
    s.connect("/var/run/docker.sock")
result = {
    "tcp": attempt(tcp),
    "udp": attempt(udp),
    "tcp6": attempt(tcp6),
    "dns": attempt(lambda: socket.getaddrinfo("example.com", 80)),
    "docker_socket": attempt(engine),
}
"""
    _all_failed(_result(_hostile(backend, data_dir, frame, _job(data_dir, code))))


def test_host_files_are_out_of_reach(backend: Backend, data_dir: Path, frame: pd.DataFrame) -> None:
    targets = {
        "shadow": "/etc/shadow",
        "other_dataset": str(data_dir / "other.parquet"),
        "database": str(data_dir / "safeaccess.db"),
        "key": str(data_dir / "server_key.pem"),
        "this_test": str(Path(__file__).resolve()),
        "root_home": "/root/.bash_history",
    }
    code = (
        f"targets = {targets!r}\n"
        + """
result = {name: attempt(lambda p=p: open(p, "rb").read(64)) for name, p in targets.items()}
result["list_data_dir"] = attempt(lambda: os.listdir(os.path.dirname(targets["key"])))
"""
    )
    _all_failed(_result(_hostile(backend, data_dir, frame, _job(data_dir, code))))


def test_dataset_and_root_are_read_only(
    backend: Backend, data_dir: Path, frame: pd.DataFrame
) -> None:
    dataset = str(data_dir / "dataset.parquet")
    code = (
        f"host_dataset = {dataset!r}\n"
        + """
import glob
def write(path):
    with open(path, "ab") as fh:
        fh.write(b"tampered")
mounted = [p for p in glob.glob("/data/*") + glob.glob("/*/*.parquet") if p.endswith(".parquet")]
result = {"write_" + p: attempt(lambda p=p: write(p)) for p in mounted}
result.update({
    "write_host_dataset": attempt(lambda: write(host_dataset)),
    "write_etc": attempt(lambda: write("/etc/evil")),
    "write_usr": attempt(lambda: write("/usr/evil")),
    "write_root": attempt(lambda: write("/evil")),
    "chmod_dataset": attempt(lambda: [os.chmod(p, 0o666) for p in mounted] or 1/0),
})
control = attempt(lambda: write("/tmp/allowed") or open("/tmp/allowed", "rb").read())
result["control_tmp"] = control
"""
    )
    outcome = _hostile(backend, data_dir, frame, _job(data_dir, code))
    result = _result(outcome)
    assert result.pop("control_tmp") == "ok:b'tampered'"  # the private tmp is writable
    assert any(k.startswith("write_/") for k in result), "the job found no mounted dataset"
    _all_failed(result)


def test_fork_bomb_is_bounded(backend: Backend, data_dir: Path, frame: pd.DataFrame) -> None:
    code = """
import time
children = 0
try:
    while True:
        if os.fork() == 0:
            time.sleep(30)
            os._exit(0)
        children += 1
except OSError as exc:
    result = {"children": str(children), "stopped_by": "fail:" + type(exc).__name__}
"""
    result = _result(_hostile(backend, data_dir, frame, _job(data_dir, code)))
    assert result["stopped_by"].startswith("fail:")
    assert int(result["children"]) < LIMITS.max_processes


def test_exponential_fork_bomb_is_contained(
    backend: Backend, data_dir: Path, frame: pd.DataFrame
) -> None:
    code = """
while True:
    try:
        os.fork()
    except OSError:
        pass
"""
    limits = LIMITS.model_copy(update={"wall_seconds": 6.0})
    start = time.monotonic()
    outcome = _hostile(backend, data_dir, frame, _job(data_dir, code, limits))
    assert isinstance(outcome, SandboxError), outcome
    assert time.monotonic() - start < 6 + 30


def test_unbounded_memory_is_stopped(backend: Backend, data_dir: Path, frame: pd.DataFrame) -> None:
    code = "blocks = []\nwhile True:\n    blocks.append(bytearray(32 << 20))\n"
    limits = LIMITS.model_copy(update={"memory_mb": 256})
    outcome = _hostile(backend, data_dir, frame, _job(data_dir, code, limits))
    assert isinstance(outcome, LimitExceeded) and outcome.limit == "memory", outcome


def test_spinning_past_the_time_limit_is_stopped(
    backend: Backend, data_dir: Path, frame: pd.DataFrame
) -> None:
    limits = LIMITS.model_copy(update={"wall_seconds": 4.0, "cpu_seconds": 60})
    start = time.monotonic()
    outcome = _hostile(backend, data_dir, frame, _job(data_dir, "while True:\n    pass\n", limits))
    assert isinstance(outcome, LimitExceeded) and outcome.limit == "wall", outcome
    assert time.monotonic() - start < 4 + 30


def test_printing_gigabytes_is_capped(
    backend: Backend, data_dir: Path, frame: pd.DataFrame
) -> None:
    code = "chunk = 'x' * (1 << 20)\nfor _ in range(4096):\n    print(chunk)\nresult = {}\n"
    outcome = _hostile(backend, data_dir, frame, _job(data_dir, code))
    if isinstance(outcome, RunResult):  # captured up to the runner's cap, and says so
        stdout = outcome.output.stdout  # type: ignore[union-attr]
        assert len(stdout) < LIMITS.max_output_bytes
        assert "truncated" in stdout
    else:
        assert isinstance(outcome, LimitExceeded) and outcome.limit == "output", outcome


def test_writing_gigabytes_to_raw_descriptors_hits_the_output_limit(
    backend: Backend, data_dir: Path, frame: pd.DataFrame
) -> None:
    code = """
chunk = b"x" * (1 << 20)
for _ in range(4096):
    for fd in range(1, 16):
        try:
            os.write(fd, chunk)
        except OSError:
            pass
"""
    outcome = _hostile(backend, data_dir, frame, _job(data_dir, code))
    assert isinstance(outcome, LimitExceeded) and outcome.limit == "output", outcome


def test_host_environment_and_processes_are_invisible(
    backend: Backend, data_dir: Path, frame: pd.DataFrame
) -> None:
    code = (
        f"secret = {SECRET!r}\n"
        + """
found = []
pids = [p for p in os.listdir("/proc") if p.isdigit()]
for pid in pids:
    for part in ("environ", "cmdline"):
        try:
            if secret.encode() in open(f"/proc/{pid}/{part}", "rb").read():
                found.append(f"{pid}/{part}")
        except OSError:
            pass
if any(secret in v for v in os.environ.values()):
    found.append("os.environ")
result = {"found": "ok:" + ",".join(found) if found else "fail:none",
          "many_processes": "ok" if len(pids) > 20 else "fail:few"}
"""
    )
    _all_failed(_result(_hostile(backend, data_dir, frame, _job(data_dir, code))))


def test_ptrace_cannot_reach_host_processes(
    backend: Backend, data_dir: Path, frame: pd.DataFrame
) -> None:
    code = (
        f"host_pid = {os.getpid()}\n"
        + """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
PTRACE_ATTACH = 16
def attach(pid):
    if libc.ptrace(PTRACE_ATTACH, pid, None, None) == -1:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    return pid
def vm_read(pid):
    return open(f"/proc/{pid}/mem", "rb").read(1)
result = {"attach_host": attempt(lambda: attach(host_pid)),
          "mem_host": attempt(lambda: vm_read(host_pid))}
"""
    )
    _all_failed(_result(_hostile(backend, data_dir, frame, _job(data_dir, code))))


def test_symlinks_in_tmp_do_not_escape(
    backend: Backend, data_dir: Path, frame: pd.DataFrame
) -> None:
    targets = {
        "key": str(data_dir / "server_key.pem"),
        "database": str(data_dir / "safeaccess.db"),
        "other_dataset": str(data_dir / "other.parquet"),
        "shadow": "/etc/shadow",
        "host_root": "/proc/1/root/etc/shadow",
    }
    code = (
        f"targets = {targets!r}\nhost_dataset = {str(data_dir / 'dataset.parquet')!r}\n"
        + """
import glob
result = {}
for name, target in targets.items():
    link = "/tmp/link-" + name
    os.symlink(target, link)
    result["read_" + name] = attempt(lambda link=link: open(link, "rb").read(64))
for i, mounted in enumerate(glob.glob("/data/*.parquet") + [host_dataset]):
    link = f"/tmp/write-{i}"
    os.symlink(mounted, link)
    result[f"write_through_{i}"] = attempt(lambda link=link: open(link, "ab").write(b"x"))
    result[f"hardlink_{i}"] = attempt(lambda m=mounted, i=i: os.link(m, f"/tmp/hard-{i}"))
"""
    )
    _all_failed(_result(_hostile(backend, data_dir, frame, _job(data_dir, code))))


def test_forged_runner_response_is_refused(
    backend: Backend, data_dir: Path, frame: pd.DataFrame, forged_table_script: str
) -> None:
    code = forged_table_script
    outcome = _hostile(backend, data_dir, frame, _job(data_dir, code))
    assert isinstance(outcome, SandboxError), f"a forged table was accepted: {outcome!r}"
