"""Issue 26, point 5: the command line's two-person rule rests on two authenticated people, not
two names. Each CLI decision asks the checker's password and a fresh TOTP code; a name that is
not an enrolled, active checker, or a wrong password or code, decides nothing."""

from __future__ import annotations

import getpass
import time

import pyotp
import pytest
from e2e_helpers import Centre, open_body, signed

from safeaccess.client.analyses import FrequencyTable, Script
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
