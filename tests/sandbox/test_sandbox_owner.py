"""The process sandbox under its owner: the fork server as an unprivileged service user, and no
sandbox process outliving the process that started it (issue 43).

Each test starts a real owner process (as a worker or `serve` would hold the backend) that runs
a table through the fork server, then leaves a job running a script that double-forks and
sleeps; the test SIGKILLs the owner and checks /proc. As root (CI), one test runs the owner as
an unprivileged user the test creates (docs/deploy.md's service user) and asserts the fork
server, not the warm fallback, served it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NoReturn

import pandas as pd
import pytest

from service_user import as_user, system_user

USER = "safeaccess-sbtest"

# The owner: build the backend as make_backend does, run a table, then start a job that
# double-forks (the grandchild sleeps) and report; then wait to be killed.
OWNER = r"""
import json, logging, sys, threading, time
from pathlib import Path
from safeaccess.sandbox.backend import Job, Limits
from safeaccess.sandbox.process import ProcessBackend

logging.basicConfig(level=logging.INFO, stream=sys.stderr)
dataset, report = Path(sys.argv[1]), Path(sys.argv[2])
backend = ProcessBackend(Limits(wall_seconds=120))
backend.check_available()
metadata = {"name": "o", "columns": [{"name": "g", "type": "categorical"}]}
table = backend.run(Job(job_id="t", analysis={"kind": "frequency_table", "rows": ["g"]},
                        metadata=metadata, dataset=dataset))
sleeper = "import os, time\nif os.fork() == 0:\n    if os.fork() == 0:\n        time.sleep(300)\n    os._exit(0)\ntime.sleep(300)\n"
job = Job(job_id="s", analysis={"kind": "script", "code": sleeper}, metadata=metadata,
          dataset=dataset)
threading.Thread(target=lambda: backend.run(job), daemon=True).start()
time.sleep(1.0)  # the script's processes are up (they sleep for minutes)
report.write_text(json.dumps({"mode": backend.mode, "reason": backend.mode_reason,
                              "values": table.output.values,
                              "templates": len(backend.templates())}))
time.sleep(600)
"""


def _tree(pid: int) -> set[tuple[int, str]]:
    """`pid`'s descendants, each as (pid, start time) so that a reused pid is not mistaken."""
    found: set[tuple[int, str]] = set()
    todo = [pid]
    while todo:
        for task in Path(f"/proc/{todo.pop()}/task").glob("*/children"):
            with contextlib.suppress(OSError):
                for child in task.read_text().split():
                    found.add((int(child), _start(int(child))))
                    todo.append(int(child))
    return found


def _start(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def _alive(processes: set[tuple[int, str]]) -> set[tuple[int, str]]:
    return {(pid, start) for pid, start in processes if start and _start(pid) == start}


def _uid_processes(uid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if entry.stat().st_uid == uid:
                    found.append(int(entry.name))
    return found


@pytest.fixture(scope="module")
def service_user(missing_isolation: Callable[[str], NoReturn]) -> Iterator[pwd.struct_passwd]:
    """An unprivileged system user, as docs/deploy.md creates one (removed afterwards)."""
    if os.geteuid() != 0:
        missing_isolation("creating an unprivileged user needs root")
    if shutil.which("useradd") is None:
        missing_isolation("useradd is not installed")
    entry, created = system_user(USER)
    yield entry
    if created:
        subprocess.run(["userdel", USER], check=False)


def _run_owner(
    argv_for: Callable[[list[str]], list[str]], owner: int | None
) -> tuple[subprocess.Popen[bytes], dict[str, object], Path]:
    """Start the owner; return it and its report once it has a job running."""
    work = Path(tempfile.mkdtemp(prefix="sb-owner-"))
    work.chmod(0o755)
    dataset = work / "d.parquet"
    pd.DataFrame({"g": ["a"] * 12 + ["b"] * 15}).to_parquet(dataset)
    dataset.chmod(0o644)
    if owner is not None:
        os.chown(work, owner, -1)
    report = work / "report.json"
    proc = subprocess.Popen(
        argv_for([sys.executable, "-I", "-c", OWNER, str(dataset), str(report)]),
        cwd=work,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 120
    while not report.exists() or not report.read_text():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            _, err = proc.communicate()
            pytest.fail(f"the owner did not start: {err.decode(errors='replace')[-2000:]}")
        time.sleep(0.05)
    return proc, json.loads(report.read_text()), work


def _kill_and_check(proc: subprocess.Popen[bytes], work: Path) -> set[tuple[int, str]]:
    """SIGKILL the owner; return its sandbox processes still alive 10 s later (none expected)."""
    tree = _tree(proc.pid)
    # bubblewrap, its pid 1, the template's launcher, the template, the job and its two forks.
    assert len(tree) >= 5, tree
    stderr = proc.stderr
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    log = ""
    if stderr is not None:  # the owner is dead: read what it logged without waiting
        os.set_blocking(stderr.fileno(), False)
        log = (stderr.read() or b"").decode(errors="replace")
    deadline = time.monotonic() + 10
    while _alive(tree) and time.monotonic() < deadline:
        time.sleep(0.05)
    shutil.rmtree(work, ignore_errors=True)
    assert "fork-server mode" in log, log[-2000:]
    return _alive(tree)


def test_sigkill_of_a_root_owner_leaves_no_sandbox_process(
    missing_isolation: Callable[[str], NoReturn],
) -> None:
    if os.geteuid() != 0:
        missing_isolation("the root owner's test runs as root")
    proc, report, work = _run_owner(lambda argv: argv, None)
    assert report["mode"] == "forkserver", report
    assert report["values"] in ([[12.0], [15.0]], [[12], [15]])
    assert _kill_and_check(proc, work) == set()


def test_an_unprivileged_service_user_gets_the_fork_server_and_leaves_no_orphans(
    service_user: pwd.struct_passwd,
) -> None:
    proc, report, work = _run_owner(
        lambda argv: as_user(service_user.pw_name, argv), service_user.pw_uid
    )
    # The fast path, not the warm fallback, and the right table.
    assert report["mode"] == "forkserver", report
    assert "unprivileged" in str(report["reason"]), report
    assert report["templates"] == 1
    assert report["values"] in ([[12.0], [15.0]], [[12], [15]])
    assert _kill_and_check(proc, work) == set()
    # Nothing of the service user's is left anywhere (a double fork escaping the tree included).
    deadline = time.monotonic() + 5
    while _uid_processes(service_user.pw_uid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _uid_processes(service_user.pw_uid) == []


def test_a_fallback_to_warm_mode_is_a_loud_warning(
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    missing_isolation: Callable[[str], NoReturn],
) -> None:
    # The probe failing as a kernel refusing user namespaces would: the backend still serves,
    # in warm mode, and says so at WARNING with the reason.
    from safeaccess.sandbox.backend import SandboxUnavailable
    from safeaccess.sandbox.process import ProcessBackend
    from safeaccess.sandbox.process import backend as process_backend

    monkeypatch.setattr(
        process_backend, "_PROBE", "import sys; sys.exit('unshare: Operation not permitted')"
    )
    backend = ProcessBackend()
    caplog.set_level(logging.INFO, logger="safeaccess.sandbox.process.backend")
    try:
        backend.check_available()
    except SandboxUnavailable as exc:
        missing_isolation(str(exc))
    finally:
        backend.close()
    assert backend.mode == "warm"
    assert "unshare: Operation not permitted" in backend.mode_reason
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("SANDBOX FALLBACK" in w and "Operation not permitted" in w for w in warnings)
