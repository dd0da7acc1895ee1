"""Issue 26, point 5: the command line's two-person rule rests on two authenticated people, not
two names. Each CLI decision asks the checker's password and a fresh TOTP code; a name that is
not an enrolled, active checker, or a wrong password or code, decides nothing."""

from __future__ import annotations

import getpass
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyotp
import pytest
from e2e_helpers import Centre, open_body, resigned_log, signed

from safeaccess.client.analyses import FrequencyTable, Script
from safeaccess.client.audit.verify import AuditFailure, ExportSource, verify_log
from safeaccess.server.admin.cli import main as server_cli
from safeaccess.server.http.embedded import EmbeddedServer
from safeaccess.server.review import rules as review_rules
from safeaccess.server.service import Service
from safeaccess.server.web import accounts

PASSWORD = "a long enough passphrase"


def _enrol(service: Service, name: str) -> pyotp.TOTP:
    store = service.store
    enrolment = accounts.add_checker(store, name)
    found = accounts.enrolment_for(store, enrolment.token)
    assert found is not None
    totp = pyotp.TOTP(found[1])
    accounts.enrol(store, enrolment.token, PASSWORD, PASSWORD, totp.at(time.time() - 30))
    return totp


def _answers(monkeypatch: pytest.MonkeyPatch, password: str, code: str) -> None:
    replies = iter([password, code])
    monkeypatch.setattr(getpass, "getpass", lambda prompt="": next(replies))


def test_two_names_do_not_make_two_checkers(
    centre: Centre,
    server: tuple[Service, EmbeddedServer],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    service, srv = server
    root = ["--data-dir", str(centre.root)]
    assert server_cli(["dataset", "checkers", "census", "2", *root]) == 0
    assert review_rules.checkers_required(service.store, "census") == 2
    sealed = centre.seal([Script(code="print(len(df))\n"), FrequencyTable(rows=["sex"])])
    opened = signed(srv.url, centre.keys["ada"], "ada", "POST", "/v1/sequences", open_body(sealed))
    assert opened.status_code == 201, opened.text
    seq = opened.json()["sequence_id"]
    assert service.scripts.wait_idle(120)
    approve = ["review", "approve", seq, "1", *root, "--note", "fine"]

    # The attack that worked: two made-up names released the step.
    for name in ("carol", "dave"):
        _answers(monkeypatch, "anything", "000000")
        capsys.readouterr()
        assert server_cli([*approve, "--reviewer", name]) == 2
        assert "not an enrolled, active checker" in capsys.readouterr().err
    step = service.store.get_step(seq, 1)
    assert step is not None and step.state == "review"
    assert review_rules.first_approvals(service.store, seq, 1) == []

    cyd, dot = _enrol(service, "cyd"), _enrol(service, "dot")
    # An enrolled checker with a wrong password, or a wrong or replayed code, decides nothing.
    _answers(monkeypatch, "not her password", cyd.now())
    assert server_cli([*approve, "--reviewer", "cyd"]) == 2
    _answers(monkeypatch, PASSWORD, "123456" if cyd.now() != "123456" else "654321")
    assert server_cli([*approve, "--reviewer", "cyd"]) == 2
    assert review_rules.first_approvals(service.store, seq, 1) == []

    _answers(monkeypatch, PASSWORD, cyd.now())
    assert server_cli([*approve, "--reviewer", "cyd"]) == 0
    assert "second, different checker" in capsys.readouterr().out
    # Her code cannot be replayed for a made-up second checker, nor her name used twice.
    _answers(monkeypatch, PASSWORD, cyd.now())
    assert server_cli([*approve, "--reviewer", "cyd"]) == 2
    _answers(monkeypatch, PASSWORD, dot.now())
    assert server_cli([*approve, "--reviewer", "dot"]) == 0
    step = service.store.get_step(seq, 1)
    assert step is not None and step.state == "released"


def _piped(text: str) -> int:
    """The read end of a pipe holding `text` (the writer closed)."""
    read, write = os.pipe()
    os.write(write, text.encode())
    os.close(write)
    return read


def _review_cli(
    args: list[str], env: dict[str, str], pass_fds: tuple[int, ...] = ()
) -> subprocess.CompletedProcess[str]:
    """`safeaccess-server ARGS` as a script or CI job runs it: no terminal (a session of its
    own, so no controlling terminal; standard input empty)."""
    return subprocess.run(
        [sys.executable, "-m", "safeaccess.server.admin.cli", *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        env=env,
        pass_fds=pass_fds,
        start_new_session=True,
        timeout=300,
        check=False,
    )


def test_without_a_terminal_checkers_decide_by_environment_or_descriptor(
    centre: Centre,
    server: tuple[Service, EmbeddedServer],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 44: `review approve` in a script crashed with a traceback. Without a terminal the
    password and the code come from the environment or a file descriptor (never an argument),
    and with neither the command says so in one line and decides nothing.

    Issue 41, point 4: the step's sequence pins the dataset's version (`census@1`), and the
    verifier must still apply the dataset's two-checker rule: a log whose first approval was
    taken out, re-signed by the centre, fails."""
    service, srv = server
    root = ["--data-dir", str(centre.root)]
    assert server_cli(["dataset", "checkers", "census", "2", *root]) == 0
    sealed = centre.seal([Script(code="print(len(df))\n")], dataset="census@1")
    opened = signed(srv.url, centre.keys["ada"], "ada", "POST", "/v1/sequences", open_body(sealed))
    assert opened.status_code == 201, opened.text
    seq = opened.json()["sequence_id"]
    assert service.scripts.wait_idle(120)
    eli, fay = _enrol(service, "eli"), _enrol(service, "fay")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAFEACCESS_CHECKER_")}
    approve = ["review", "approve", seq, "1", *root, "--note", "fine"]

    # Neither, in a real process without a terminal: one line on stderr, exit 2, nothing
    # decided (was: termios.error, then EOFError, in a traceback).
    run = _review_cli([*approve, "--reviewer", "eli"], env)
    assert run.returncode == 2, run.stderr
    assert len(run.stderr.strip().splitlines()) == 1 and "Traceback" not in run.stderr
    assert "no terminal to ask the password on" in run.stderr
    assert "SAFEACCESS_CHECKER_PASSWORD" in run.stderr and "--credentials-fd" in run.stderr
    assert review_rules.first_approvals(service.store, seq, 1) == []

    # The environment (the code: of the next time step, still valid when checked).
    monkeypatch.setenv("SAFEACCESS_CHECKER_PASSWORD", PASSWORD)
    monkeypatch.setenv("SAFEACCESS_CHECKER_CODE", eli.at(time.time() + 30))
    assert server_cli([*approve, "--reviewer", "eli"]) == 0
    assert [a.checker for a in review_rules.first_approvals(service.store, seq, 1)] == ["eli"]
    monkeypatch.delenv("SAFEACCESS_CHECKER_PASSWORD")
    monkeypatch.delenv("SAFEACCESS_CHECKER_CODE")
    # A descriptor: the password, then the code, one per line. A wrong password read this way
    # decides nothing, as on the terminal ...
    read = _piped(f"not her password\n{fay.at(time.time() + 30)}\n")
    try:
        assert server_cli([*approve, "--reviewer", "fay", "--credentials-fd", str(read)]) == 2
    finally:
        os.close(read)
    assert len(review_rules.first_approvals(service.store, seq, 1)) == 1
    # ... the right one releases the step, in a real process without a terminal.
    read = _piped(f"{PASSWORD}\n{fay.at(time.time() + 30)}\n")
    try:
        run = _review_cli(
            [*approve, "--reviewer", "fay", "--credentials-fd", str(read)], env, (read,)
        )
    finally:
        os.close(read)
    assert run.returncode == 0, run.stderr
    step = service.store.get_step(seq, 1)
    assert step is not None and step.state == "released"

    # The honest log verifies; without the first approval it must not.
    export = tmp_path / "two.export"
    export.write_bytes(b"".join(service.audit.export()))
    assert verify_log(ExportSource(export)).steps_released >= 1

    def one_checker(parsed: list[dict[str, Any]]) -> None:
        parsed[:] = [
            p for p in parsed if not (p["kind"] == "review_first_approval" and p["sequence"] == seq)
        ]

    with pytest.raises(AuditFailure) as info:
        verify_log(resigned_log(service, tmp_path / "one.export", one_checker))
    assert "released by 1 checker(s); dataset census needs 2 different checkers" in str(info.value)
