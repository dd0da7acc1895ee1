"""Issue 44: a checker's password and one-time code for the review CLI without a terminal
(`safeaccess.server.admin.checker_credentials`); the real CLI without a terminal is exercised in
tests/e2e/test_review_cli_auth.py."""

from __future__ import annotations

import getpass
import os
import warnings

import pytest

from safeaccess.server.admin.checker_credentials import checker_credentials
from safeaccess.server.errors import ConfigError


def _no_terminal(prompt: str = "") -> str:
    """getpass where it cannot control a terminal: it warns, then reads (empty) stdin."""
    warnings.warn("Can not control echo on the terminal.", getpass.GetPassWarning, stacklevel=2)
    raise EOFError


def _piped(text: bytes) -> int:
    read, write = os.pipe()
    os.write(write, text)
    os.close(write)
    return read


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SAFEACCESS_CHECKER_PASSWORD", raising=False)
    monkeypatch.delenv("SAFEACCESS_CHECKER_CODE", raising=False)
    monkeypatch.setattr(getpass, "getpass", _no_terminal)


def test_without_a_terminal_the_missing_value_is_named_in_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(ConfigError) as neither:
        checker_credentials("eli", "review approve")
    assert "no terminal to ask the password on" in str(neither.value)
    monkeypatch.setenv("SAFEACCESS_CHECKER_PASSWORD", "a long enough passphrase")
    with pytest.raises(ConfigError) as no_code:
        checker_credentials("eli", "review approve")
    message = str(no_code.value)
    assert "`review approve`" in message and "no terminal to ask the one-time code on" in message
    assert "\n" not in message and "passphrase" not in message


def test_a_descriptor_comes_before_the_environment_and_needs_two_lines(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SAFEACCESS_CHECKER_PASSWORD", "from the environment")
    monkeypatch.setenv("SAFEACCESS_CHECKER_CODE", "111111")
    read = _piped(b"from the descriptor\r\n 222222\n")
    try:
        given = checker_credentials("eli", "review approve", read)
    finally:
        os.close(read)
    assert (given.password, given.code) == ("from the descriptor", "222222")
    assert checker_credentials("eli", "review approve").code == "111111"
    read = _piped(b"only a password\n")
    try:
        with pytest.raises(ConfigError, match="first line and her current one-time code"):
            checker_credentials("eli", "review approve", read)
    finally:
        os.close(read)
    with pytest.raises(ConfigError, match="--credentials-fd 999: cannot read it"):
        checker_credentials("eli", "review approve", 999)


def test_a_terminal_as_the_descriptor_is_refused_rather_than_echoing() -> None:
    controller, terminal = os.openpty()
    try:
        with pytest.raises(ConfigError, match="is a terminal, where the password would show"):
            checker_credentials("eli", "review approve", terminal)
    finally:
        os.close(controller)
        os.close(terminal)
