"""The abuse suite: hostile `script` jobs against every sandbox backend and mode.

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
# Jobs that scan their whole memory need more time than the others.
SCAN_LIMITS = LIMITS.model_copy(update={"wall_seconds": 120})

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
    scope="module",
    params=["forkserver", "warm", pytest.param("docker", marks=pytest.mark.docker)],
)
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    """The process backend in both its modes (fork server, the default, and warm sandboxes),
    and the Docker backend."""
    b: Backend
    if request.param in ("forkserver", "warm"):
        from safeaccess.sandbox.process import ProcessBackend

        b = ProcessBackend(limits=LIMITS, mode=request.param)
        if request.param == "forkserver" and b.mode != "forkserver":
            request.getfixturevalue("missing_isolation")("the fork server needs a root server")
        try:
            b.check_available()
        except SandboxUnavailable as exc:
            request.getfixturevalue("missing_isolation")(str(exc))
        if request.param == "forkserver" and b.mode != "forkserver":  # fell back at the probe
            request.getfixturevalue("missing_isolation")(b.mode_reason)
    else:
        from safeaccess.sandbox.config import DockerOptions
        from safeaccess.sandbox.docker import DockerBackend

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


def _fork_server(backend: Backend) -> bool:
    from safeaccess.sandbox.process import ProcessBackend

    return isinstance(backend, ProcessBackend) and backend.mode == "forkserver"


def _template_pids(backend: Backend) -> list[int]:
    from safeaccess.sandbox.process import ProcessBackend

    if not isinstance(backend, ProcessBackend):
        return []
    return [t.proc.pid for t in backend.templates()]


def test_forbidden_system_calls_are_refused(
    backend: Backend, data_dir: Path, frame: pd.DataFrame
) -> None:
    # keyctl, unshare(CLONE_NEWUSER) and socket need no privilege: only the seccomp filter
    # refuses them. ptrace, mount and bpf would fail for an unprivileged user anyway, and are
    # on the filter's deny side too.
    code = """
import ctypes, platform
libc = ctypes.CDLL(None, use_errno=True)
NR = {"x86_64": {"bpf": 321, "keyctl": 250}, "aarch64": {"bpf": 280, "keyctl": 219}}[platform.machine()]
def call(fn):
    def run():
        ctypes.set_errno(0)
        if fn() == -1:
            raise OSError(ctypes.get_errno(), "refused")
        return "allowed"
    return run
def errno_of(fn):
    try:
        fn()
        return "ok:allowed"
    except OSError as exc:
        return "fail:errno" + str(exc.errno)
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
result = {
    "ptrace_traceme": errno_of(call(lambda: libc.ptrace(0, 0, None, None))),
    "mount_tmpfs": errno_of(call(lambda: libc.mount(b"none", b"/tmp", b"tmpfs", 0, None))),
    "bpf": errno_of(call(lambda: libc.syscall(NR["bpf"], 0, None, 0))),
    "keyctl": errno_of(call(lambda: libc.syscall(NR["keyctl"], 0, -3, 0))),
    "unshare_user": errno_of(call(lambda: libc.unshare(0x10000000))),
    "socket": errno_of(lambda: socket.socket(socket.AF_UNIX)),
}
pid = os.fork()
if pid == 0:
    os._exit(7)
result["control_fork"] = "ok:" + str(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
"""
    result = _result(_hostile(backend, data_dir, frame, _job(data_dir, code)))
    assert result.pop("control_fork") == "ok:7"  # an ordinary call still works
    assert result == {name: "fail:errno1" for name in result}, result  # EPERM from the filter
    assert len(result) == 6


def test_jobs_cannot_signal_trace_or_see_each_other(
    backend: Backend, data_dir: Path, frame: pd.DataFrame
) -> None:
    victim_code = """
import time
with open("/tmp/victim-note", "w") as fh:
    fh.write("victim")
time.sleep(4)
result = {"survived": "yes", "note": open("/tmp/victim-note").read()}
"""
    attacker_code = """
import ctypes, signal
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
me = os.getpid()
ancestors = set()
pid = me
while pid > 1:
    try:
        pid = int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
    except OSError:
        break
    ancestors.add(pid)
listed = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
probed = []
for pid in range(1, 4096):
    try:
        os.kill(pid, 0)
        probed.append(pid)
    except ProcessLookupError:
        pass
    except PermissionError:
        probed.append(pid)
others = [p for p in sorted(set(listed) | set(probed)) if p != me and p not in ancestors]
killed, traced = [], []
for pid in others:
    try:
        os.kill(pid, signal.SIGKILL)
        killed.append(pid)
    except OSError:
        pass
    if libc.ptrace(16, pid, None, None) == 0:
        traced.append(pid)
result = {"me": str(me), "others": repr(others), "killed": repr(killed),
          "traced": repr(traced), "tmp": repr(sorted(os.listdir("/tmp"))),
          "victim_note": attempt(lambda: open("/tmp/victim-note").read())}
"""
    templates = _template_pids(backend)
    with ThreadPoolExecutor(max_workers=2) as pool:
        victim = pool.submit(backend.run, _job(data_dir, victim_code))
        time.sleep(1.0)
        attacker = _hostile(backend, data_dir, frame, _job(data_dir, attacker_code))
        survived = victim.result(timeout=120)
    assert _result(survived) == {"survived": "yes", "note": "victim"}
    if isinstance(attacker, RunResult):
        found = _result(attacker)
        assert found["victim_note"].startswith("fail:")
        assert "victim-note" not in found["tmp"]
        assert found["traced"] == "[]"
        if _fork_server(backend):
            assert found["me"] == "1" and found["others"] == "[]", found
    if templates:  # the fork server's templates were not hurt: the same processes still serve
        assert _template_pids(backend) == templates
        assert all(t.usable for t in backend.templates())  # type: ignore[attr-defined]


def test_nothing_is_left_from_an_earlier_job(
    backend: Backend, data_dir: Path, frame: pd.DataFrame
) -> None:
    marker = secrets.token_hex(16)
    digest = hashlib.sha256(marker.encode()).hexdigest()
    # A control marker the scanning job builds in its own memory at run time: the scan must
    # find it, or it proves nothing.
    control = secrets.token_hex(16)
    control_digest = hashlib.sha256(control.encode()).hexdigest()
    first = f"""
note = "leftover:" + {marker!r}
open("/tmp/leftover-file", "w").write(note)
os.environ["LEFTOVER"] = note
kept = [note * 1000]
result = {{"wrote": "yes"}}
"""
    second = f"""
import hashlib
wanted = {digest!r}
control = "leftover:" + "".join(reversed({control[::-1]!r}))
wanted_control = {control_digest!r}
found = []
if os.path.exists("/tmp/leftover-file"):
    found.append("tmp file")
if any("leftover:" in v for v in os.environ.values()):
    found.append("environment")
import ctypes
ctypes.CDLL(None).prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE: reopen our own /proc/self/mem
scanned = 0
with open("/proc/self/maps") as maps, open("/proc/self/mem", "rb", 0) as mem:
    for line in maps:
        fields = line.split()
        start, end = (int(x, 16) for x in fields[0].split("-"))
        if "r" not in fields[1] or (len(fields) > 5 and fields[5].startswith("/")):
            continue  # unreadable, or a file mapping (code, the read-only root)
        # 8 MB at a time (a whole mapping could exceed the job's memory limit), overlapping
        # so that nothing straddling two pieces is missed.
        for piece in range(start, end, 8 << 20):
          try:
            mem.seek(piece)
            chunk = mem.read(min(end - piece, (8 << 20) + 64))
          except (OSError, OverflowError, ValueError):
            break
          scanned += len(chunk)
          at = chunk.find(b"leftover:")
          while at >= 0:
            seen = hashlib.sha256(chunk[at + 9 : at + 41]).hexdigest()
            if seen == wanted:
                found.append("memory")
            elif seen == wanted_control:
                found.append("control")
            at = chunk.find(b"leftover:", at + 1)
result = {{"found": repr(sorted(set(found))), "scanned_mb": scanned >> 20}}
"""
    assert _result(backend.run(_job(data_dir, first))) == {"wrote": "yes"}
    result = _result(_hostile(backend, data_dir, frame, _job(data_dir, second, SCAN_LIMITS)))
    assert result["found"] == "['control']", result  # the scan works, and finds no leftover


def test_host_secrets_are_not_in_a_jobs_memory(
    backend: Backend, data_dir: Path, frame: pd.DataFrame
) -> None:
    # The fork server's template (whose memory every job inherits) holds the libraries and the
    # dataset, nothing of the host: not its environment, not another dataset. Scan for both.
    digest = hashlib.sha256(SECRET.encode()).hexdigest()
    code = f"""
import hashlib
wanted = {digest!r}
prefix = {SECRET[:6]!r}.encode()
size = {len(SECRET)}
hits = 0
import ctypes
ctypes.CDLL(None).prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE: reopen our own /proc/self/mem
with open("/proc/self/maps") as maps, open("/proc/self/mem", "rb", 0) as mem:
    for line in maps:
        fields = line.split()
        start, end = (int(x, 16) for x in fields[0].split("-"))
        if "r" not in fields[1] or (len(fields) > 5 and fields[5].startswith("/")):
            continue  # unreadable, or a file mapping (code, the read-only root)
        for piece in range(start, end, 8 << 20):  # 8 MB at a time, overlapping
          try:
            mem.seek(piece)
            chunk = mem.read(min(end - piece, (8 << 20) + 64))
          except (OSError, OverflowError, ValueError):
            break
          at = chunk.find(prefix)
          while at >= 0:
            if hashlib.sha256(chunk[at : at + size]).hexdigest() == wanted:
                hits += 1
            at = chunk.find(prefix, at + 1)
result = {{"hits": str(hits)}}
"""
    result = _result(_hostile(backend, data_dir, frame, _job(data_dir, code, SCAN_LIMITS)))
    assert result == {"hits": "0"}


def test_only_the_job_channel_is_inherited(
    backend: Backend, data_dir: Path, frame: pd.DataFrame
) -> None:
    code = """
fds = {}
listing = os.open("/proc/self/fd", os.O_RDONLY | os.O_DIRECTORY)
for name in os.listdir(listing):
    fd = int(name)
    if fd == listing:
        continue
    try:
        fds[str(fd)] = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        pass
os.close(listing)
result = fds
"""
    fds = _result(_hostile(backend, data_dir, frame, _job(data_dir, code)))
    sockets = [t for t in fds.values() if t.startswith("socket:")]
    assert len(sockets) <= 1, fds  # at most the job channel: never a template's control socket
    for target in fds.values():
        assert target == "/dev/null" or target.startswith(("pipe:", "socket:", "/data/")), fds
    if _fork_server(backend):
        assert sorted(fds) == ["0", "1", "2", "3"] and fds["3"].startswith("socket:"), fds
