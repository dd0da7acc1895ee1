"""Issue 26, point 8: the fork server's template holds no capability of the host.

Before it imports a library or parses the dataset, the root-started template opens the dataset,
becomes an unprivileged host uid (no groups), which empties its host capability sets, and
unshares a user namespace of its own, mapping only its uid and the jobs' uids; the template
proper keeps kill, setgid, setuid, setpcap and sys_admin in that namespace only, and the launcher
that waits for it keeps nothing. A process holding every capability of that namespace still
cannot read root's file, signal a host process, become root or mount. A job forked from the
template reads every capability set of its own as empty and cannot unshare, mount, become root,
raise a capability, remap its ids or reach the dataset's file.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn

import pandas as pd
import pytest

from safeaccess.sandbox.backend import Job, Limits, SandboxUnavailable
from safeaccess.sandbox.process import ProcessBackend
from safeaccess.sandbox.process.template_privileges import TEMPLATE_CAPS, TEMPLATE_UID

METADATA = {"name": "f", "columns": [{"name": "g", "type": "categorical"}]}
# ioctl(2) requests on a namespace descriptor (linux/nsfs.h).
NS_GET_PARENT = 0xB702
NS_GET_OWNER_UID = 0xB704
CAP_KEYS = ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")

PROBE = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
caps = {}
for line in open("/proc/self/status"):
    key, _, value = line.partition(":")
    if key in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        caps[key] = int(value.strip(), 16)
attempts = {}
def attempt(name, call):
    try:
        attempts[name] = "succeeded" if call() in (0, None) else "refused"
    except OSError as exc:
        attempts[name] = "refused"
def opened(path, flags):
    os.close(os.open(path, flags))
def capset_all():
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)
    data = (ctypes.c_uint32 * 6)(*([0xFFFFFFFF] * 6))
    return libc.capset(header, data)
def setns_own_user():
    fd = os.open("/proc/self/ns/user", os.O_RDONLY)
    return libc.setns(fd, 0x10000000)
def remap():
    with open("/proc/self/uid_map", "w") as fh:
        fh.write("0 0 1\\n")
attempt("setuid0", lambda: os.setuid(0))
attempt("unshare_user", lambda: libc.unshare(0x10000000))
attempt("unshare_mount", lambda: libc.unshare(0x00020000))
attempt("mount_tmpfs", lambda: libc.mount(b"none", b"/tmp", b"tmpfs", 0, None))
attempt("capset_all", capset_all)
attempt("setns_user", setns_own_user)
attempt("write_uid_map", remap)
attempt("read_dataset_file", lambda: opened("/data/dataset.parquet", os.O_RDONLY))
attempt("open_sysrq_trigger", lambda: opened("/proc/sysrq-trigger", os.O_WRONLY))
attempt("open_core_pattern", lambda: opened("/proc/sys/kernel/core_pattern", os.O_WRONLY))
attempt("ptrace_traceme", lambda: libc.ptrace(0, 0, None, None))
result = {"caps": caps, "attempts": attempts, "uid": os.getuid(),
          "userns": os.readlink("/proc/self/ns/user")}
"""

# Run by the test's own (root) interpreter: enter the template's user namespace, where setns
# grants every capability, become the template's uid there, and try what the host forbids.
ENTER = """
import ctypes, json, os, sys
libc = ctypes.CDLL(None, use_errno=True)
target, dataset, uid, where = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
fd = os.open(f"/proc/{target}/ns/user", os.O_RDONLY)
if libc.setns(fd, 0x10000000) != 0:
    raise SystemExit(f"setns: {os.strerror(ctypes.get_errno())}")
os.setgroups([])
os.setresgid(uid, uid, uid)
os.setresuid(uid, uid, uid)
caps = {}
for line in open("/proc/self/status"):
    key, _, value = line.partition(":")
    if key in ("CapPrm", "CapEff"):
        caps[key] = int(value.strip(), 16)
attempts = {}
def attempt(name, call):
    try:
        attempts[name] = "succeeded" if call() in (0, None) else "refused"
    except OSError:
        attempts[name] = "refused"
def opened(path, flags):
    os.close(os.open(path, flags))
attempt("read_root_file", lambda: opened(dataset, os.O_RDONLY))
attempt("signal_host_process", lambda: os.kill(os.getppid(), 0))
attempt("setuid0", lambda: os.setuid(0))
attempt("chown_to_root", lambda: os.chown(dataset, 0, 0))
attempt("mount_tmpfs", lambda: libc.mount(b"none", where.encode(), b"tmpfs", 0, None))
attempt("open_core_pattern", lambda: opened("/proc/sys/kernel/core_pattern", os.O_WRONLY))
print(json.dumps({"caps": caps, "attempts": attempts}))
"""


@pytest.fixture()
def backend(missing_isolation: Callable[[str], NoReturn]) -> Iterator[ProcessBackend]:
    b = ProcessBackend(Limits(wall_seconds=120))
    if b.mode != "forkserver":
        missing_isolation("the fork server needs a root server")
    try:
        b.check_available()
    except SandboxUnavailable as exc:
        missing_isolation(str(exc))
    yield b
    b.close()


def _dataset(tmp_path: Path) -> Path:
    path = tmp_path / "d.parquet"
    pd.DataFrame({"g": ["a", "b"]}).to_parquet(path)
    path.chmod(0o600)  # as the centre keeps its microdata: readable by root only
    return path


def _run(backend: ProcessBackend, path: Path, analysis: dict[str, Any]) -> Any:
    job = Job(job_id="p", analysis=analysis, metadata=METADATA, dataset=path)
    return backend.run(job).output


def _descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        for task in os.listdir(f"/proc/{current}/task"):
            with open(f"/proc/{current}/task/{task}/children") as fh:
                children = [int(c) for c in fh.read().split()]
            found += children
            todo += children
    return found


def _status(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/status") as fh:
        return {k: v.strip() for k, _, v in (line.partition(":") for line in fh)}


def _template_pids(template: Any) -> list[int]:
    pids = []
    for pid in _descendants(template.proc.pid):
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            argv = fh.read().split(b"\0")
        # bubblewrap's own processes carry the template's command line as arguments.
        if not argv[0].endswith(b"bwrap") and b"safeaccess.sandbox.process.template" in argv:
            pids.append(pid)
    return pids


def _serving_and_launcher(template: Any) -> tuple[int, int]:
    """(the template proper, the launcher waiting for it): the one is the other's child."""
    pids = _template_pids(template)
    assert len(pids) == 2, pids
    serving = [p for p in pids if int(_status(p)["PPid"]) in pids]
    assert len(serving) == 1, pids
    (launcher,) = set(pids) - set(serving)
    return serving[0], launcher


def _userns(path: str) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino


def _namespace_facts(pid: int) -> tuple[tuple[int, int], tuple[int, int], int]:
    """(its user namespace, that namespace's parent, that namespace's owner uid)."""
    fd = os.open(f"/proc/{pid}/ns/user", os.O_RDONLY)
    try:
        own = os.fstat(fd)
        parent = fcntl.ioctl(fd, NS_GET_PARENT)
        try:
            parent_st = os.fstat(parent)
        finally:
            os.close(parent)
        owner = bytearray(4)
        fcntl.ioctl(fd, NS_GET_OWNER_UID, owner)
    finally:
        os.close(fd)
    return (
        (own.st_dev, own.st_ino),
        (parent_st.st_dev, parent_st.st_ino),
        int.from_bytes(owner, sys.byteorder),
    )


def _mapped_outside(pid: int, name: str) -> list[tuple[int, int]]:
    """The host id ranges [first, last] a process's uid_map/gid_map maps."""
    ranges = []
    with open(f"/proc/{pid}/{name}") as fh:
        for line in fh:
            _inside, outside, count = (int(v) for v in line.split())
            ranges.append((outside, outside + count - 1))
    return ranges


def test_the_template_holds_capabilities_only_in_its_own_user_namespace(
    backend: ProcessBackend, tmp_path: Path
) -> None:
    path = _dataset(tmp_path)  # readable by root only: the template opens it before it drops
    assert _run(backend, path, {"kind": "frequency_table", "rows": ["g"]}).values
    host = _userns("/proc/self/ns/user")
    templates = backend.templates()
    assert templates
    for template in templates:
        serving, launcher = _serving_and_launcher(template)
        for pid in (serving, launcher):
            status = _status(pid)
            # The host sees both as the unprivileged template uid, with no group.
            assert [int(u) for u in status["Uid"].split()] == [TEMPLATE_UID] * 4, status["Uid"]
            assert [int(g) for g in status["Gid"].split()] == [TEMPLATE_UID] * 4, status["Gid"]
            assert status["Groups"] == ""
            # A user namespace of its own, a child of the host's, owned by that uid: the
            # kernel gives its capabilities no power in the host's namespace.
            own, parent, owner = _namespace_facts(pid)
            assert own != host and parent == host, (pid, own, parent, host)
            assert owner == TEMPLATE_UID
            # Host root is not mapped into it, neither as a uid nor as a gid.
            for name in ("uid_map", "gid_map"):
                ranges = _mapped_outside(pid, name)
                assert ranges and all(first > 0 for first, _ in ranges), (name, ranges)
        caps = {k: int(_status(serving)[k], 16) for k in CAP_KEYS}
        # Exactly kill, setgid, setuid, setpcap and sys_admin there; nothing inheritable/ambient.
        assert caps == {
            "CapInh": 0,
            "CapPrm": TEMPLATE_CAPS,
            "CapEff": TEMPLATE_CAPS,
            "CapBnd": TEMPLATE_CAPS,
            "CapAmb": 0,
        }, caps
        # The launcher keeps nothing, not even in the template's namespace, and holds neither
        # the control socket nor the dataset.
        assert {k: int(_status(launcher)[k], 16) for k in CAP_KEYS} == dict.fromkeys(CAP_KEYS, 0)
        assert sorted(int(fd) for fd in os.listdir(f"/proc/{launcher}/fd")) == [0, 1, 2]


@pytest.fixture()
def open_dir() -> Iterator[Path]:
    """A directory anyone may enter (a test's own tmp_path is below one only root may), so
    that a refusal below comes from the file's owner and mode alone."""
    where = Path(tempfile.mkdtemp())
    where.chmod(0o755)
    yield where
    shutil.rmtree(where)


def test_every_capability_of_the_templates_namespace_reaches_nothing_of_the_host(
    backend: ProcessBackend, open_dir: Path
) -> None:
    path = _dataset(open_dir)
    assert _run(backend, path, {"kind": "frequency_table", "rows": ["g"]}).values
    mount_point = open_dir / "mnt"
    mount_point.mkdir(mode=0o777)
    mount_point.chmod(0o777)
    serving, _ = _serving_and_launcher(backend.templates()[0])
    done = subprocess.run(  # fixed argv: the test's interpreter, a literal script
        [
            sys.executable,
            "-I",
            "-c",
            ENTER,
            str(serving),
            str(path),
            str(TEMPLATE_UID),
            str(mount_point),
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    # setns gave it the whole set in the template's namespace: more than the template keeps.
    assert found["caps"]["CapEff"] & TEMPLATE_CAPS == TEMPLATE_CAPS, found
    assert set(found["attempts"].values()) == {"refused"}, found["attempts"]
    assert os.stat(path).st_uid == 0


def test_a_job_cannot_regain_what_the_template_held(
    backend: ProcessBackend, tmp_path: Path
) -> None:
    path = _dataset(tmp_path)
    output = _run(backend, path, {"kind": "script", "code": PROBE})
    probe = output.result
    assert probe is not None, output.stdout
    assert probe["caps"] == dict.fromkeys(CAP_KEYS, 0), probe
    assert probe["uid"] != 0
    assert set(probe["attempts"].values()) == {"refused"}, probe["attempts"]
    # The job is in the template's namespace, not the host's: nothing it could enter holds
    # more than the template did.
    serving, _ = _serving_and_launcher(backend.templates()[0])
    assert probe["userns"] == os.readlink(f"/proc/{serving}/ns/user")
    assert probe["userns"] != os.readlink("/proc/self/ns/user")
