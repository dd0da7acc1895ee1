"""An output checker's password and one-time code for the review CLI's decisions, with or
without a terminal.

Every decision by `safeaccess-server review approve|reject|approve-opening|reject-opening` needs
the checker's password and a current code from her authenticator app: the two-person rule rests
on two authenticated people, not two names. Each of the two values is taken from, in this order:

1. a file descriptor given by `--credentials-fd N`: the password on its first line, the code on
   its second (a pipe from a password manager, a secrets file of a CI job: `3<secrets`);
2. the environment: `SAFEACCESS_CHECKER_PASSWORD`, `SAFEACCESS_CHECKER_CODE`;
3. the terminal, asked without echo.

Never from a command-line argument: the arguments of every process are visible to every user of
the machine (`ps`) and kept in shell histories. Without a terminal (a script, a CI job, a pipe)
and with a value given by neither of the first two, the command stops with one line saying how
to give it, and decides nothing.
"""

from __future__ import annotations

import getpass
import os
import warnings
from dataclasses import dataclass

from safeaccess.server.errors import ConfigError

PASSWORD_VARIABLE = "SAFEACCESS_CHECKER_PASSWORD"  # noqa: S105 (a variable name, no secret)
CODE_VARIABLE = "SAFEACCESS_CHECKER_CODE"
#: A password line longer than this is no password (a wrong descriptor, a binary file).
MAX_LINE = 4096


@dataclass(frozen=True)
class CheckerCredentials:
    password: str
    code: str


def _from_descriptor(fd: int) -> CheckerCredentials:
    """The password and the code, on the first two lines read from descriptor `fd`."""
    if os.isatty(fd):
        # Read from a terminal, the password would be echoed.
        raise ConfigError(
            f"--credentials-fd {fd} is a terminal, where the password would show as typed; "
            "leave the option out to be asked without echo; nothing was decided"
        )
    try:
        with os.fdopen(fd, "rb", closefd=False) as stream:
            lines = [stream.readline(MAX_LINE + 1) for _ in range(2)]
    except OSError as exc:
        raise ConfigError(
            f"--credentials-fd {fd}: cannot read it ({exc.strerror}); open it for the command, "
            f"e.g. `--credentials-fd 3 3<secrets`; nothing was decided"
        ) from exc
    try:
        password, code = (line.decode("utf-8").rstrip("\r\n") for line in lines)
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"--credentials-fd {fd}: the password and the code must be UTF-8 text; nothing was "
            "decided"
        ) from exc
    if not password or not code or any(len(line) > MAX_LINE for line in lines):
        raise ConfigError(
            f"--credentials-fd {fd} must give the checker's password on its first line and her "
            "current one-time code on its second; nothing was decided"
        )
    return CheckerCredentials(password, code.strip())


class _NoTerminal(Exception):
    pass


def _asked(prompt: str) -> str:
    """`prompt` answered on the terminal, without echo; _NoTerminal when there is none.

    getpass falls back to reading standard input, echoing, with a warning, when it cannot
    control a terminal: that warning is taken as "no terminal", so a secret is never read
    from a stream that was not meant to give it."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", getpass.GetPassWarning)
        try:
            return getpass.getpass(prompt)
        except (getpass.GetPassWarning, EOFError, OSError) as exc:
            raise _NoTerminal from exc


def _missing(what: str, action: str) -> ConfigError:
    return ConfigError(
        f"`{action}` needs the checker's password and current one-time code, and there is no "
        f"terminal to ask {what} on: set {PASSWORD_VARIABLE} and {CODE_VARIABLE}, or give them "
        "on two lines of a file descriptor with --credentials-fd N (never as arguments); "
        "nothing was decided"
    )


def checker_credentials(name: str, action: str, fd: int | None = None) -> CheckerCredentials:
    """Checker `name`'s password and code for `action` (the command, for the message): from
    descriptor `fd`, else the environment, else the terminal; ConfigError when none gives
    them."""
    if fd is not None:
        return _from_descriptor(fd)
    password = os.environ.get(PASSWORD_VARIABLE) or None
    code = os.environ.get(CODE_VARIABLE) or None
    try:
        if password is None:
            password = _asked(f"password of checker {name}: ")
        if code is None:
            code = _asked(f"current code from {name}'s authenticator app: ")
    except _NoTerminal:
        raise _missing(
            "the password" if password is None else "the one-time code", action
        ) from None
    return CheckerCredentials(password, code.strip())
