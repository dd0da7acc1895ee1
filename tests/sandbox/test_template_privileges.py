"""Issue 26, point 8: a job forked from the fork server's template cannot regain anything the
template held: it reads every capability set of its own (bounding and inheritable included) as
empty and cannot unshare, mount or become root. The template itself should hold its
capabilities only in a user namespace of its own, as an unprivileged host uid (expected to fail
until it does)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn

import pandas as pd
import pytest

from safeaccess.sandbox.backend import Job, Limits, SandboxUnavailable
from safeaccess.sandbox.process import ProcessBackend

METADATA = {"name": "f", "columns": [{"name": "g", "type": "categorical"}]}

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
attempt("setuid0", lambda: os.setuid(0))
attempt("unshare_user", lambda: libc.unshare(0x10000000))
attempt("unshare_mount", lambda: libc.unshare(0x00020000))
attempt("mount_tmpfs", lambda: libc.mount(b"none", b"/tmp", b"tmpfs", 0, None))
result = {"caps": caps, "attempts": attempts, "uid": os.getuid()}
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


@pytest.mark.xfail(
    strict=True,
    reason="issue 26 point 8, open: the template still runs as host root; started in a user "
    "namespace of its own, bubblewrap could not reach an interpreter below a root-only "
    "directory, by path or by descriptor",
)
def test_the_template_is_not_root_and_holds_capabilities_only_in_its_own_namespace(
    backend: ProcessBackend, tmp_path: Path
) -> None:
    path = _dataset(tmp_path)
    assert _run(backend, path, {"kind": "frequency_table", "rows": ["g"]}).values
    templates = backend.templates()
    assert templates
    host_userns = os.readlink("/proc/self/ns/user")
    for template in templates:
        pids = [template.proc.pid, *_descendants(template.proc.pid)]
        for pid in pids:
            status = _status(pid)
            real, effective, saved, fs = (int(u) for u in status["Uid"].split())
            # Every process of the sandbox, bubblewrap included, is an unprivileged host uid.
            assert 0 not in (real, effective, saved, fs), (pid, status["Uid"])
            # Whatever capabilities it holds are in a user namespace of its own.
            assert os.readlink(f"/proc/{pid}/ns/user") != host_userns, pid


def test_a_job_cannot_regain_what_the_template_held(
    backend: ProcessBackend, tmp_path: Path
) -> None:
    path = _dataset(tmp_path)
    output = _run(backend, path, {"kind": "script", "code": PROBE})
    probe = output.result
    assert probe is not None, output.stdout
    assert probe["caps"] == {
        "CapInh": 0,
        "CapPrm": 0,
        "CapEff": 0,
        "CapBnd": 0,
        "CapAmb": 0,
    }, probe
    assert probe["uid"] != 0
    assert set(probe["attempts"].values()) == {"refused"}, probe["attempts"]
