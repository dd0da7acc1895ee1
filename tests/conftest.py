"""Shared fixtures: a reachable Docker Engine and the sandbox image, built once per session.

Tests that need Docker take the `docker_client` or `sandbox_image` fixture and carry
`@pytest.mark.docker`. Without an engine they are skipped, unless SAFEACCESS_REQUIRE_DOCKER=1
(as in CI), in which case they fail: a missing engine must not pass silently there. Likewise
tests of the process sandbox take `missing_isolation`: they skip where bubblewrap cannot isolate,
unless SAFEACCESS_REQUIRE_SANDBOX=1 (as in CI); PostgreSQL store tests take `missing_postgres`
(SAFEACCESS_REQUIRE_POSTGRES=1 in CI).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

import pytest

REQUIRE_DOCKER = "SAFEACCESS_REQUIRE_DOCKER"
REQUIRE_SANDBOX = "SAFEACCESS_REQUIRE_SANDBOX"
REQUIRE_POSTGRES = "SAFEACCESS_REQUIRE_POSTGRES"


@pytest.fixture(scope="session", autouse=True)
def safeaccess_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The researcher's safeaccess directory (journal of sealed sequences, catalogue cache) in a
    temporary folder, so that no test writes into the home directory of whoever runs it."""
    before = os.environ.get("SAFEACCESS_HOME")
    home = str(tmp_path_factory.mktemp("safeaccess-home"))
    os.environ["SAFEACCESS_HOME"] = home
    yield home
    if before is None:
        os.environ.pop("SAFEACCESS_HOME", None)
    else:
        os.environ["SAFEACCESS_HOME"] = before


#: The loggers `safeaccess.server.logs.configure` takes over (`serve`, `worker`, the demo).
_CONFIGURED_LOGGERS = ("safeaccess", "procrastinate", "uvicorn", "uvicorn.error", "uvicorn.access")


@pytest.fixture(autouse=True)
def _logging_as_it_was() -> Iterator[None]:
    """Put back the loggers a test's in-process `serve` or demo configured: a process runs one
    command, but a test worker runs many, and a later test's captured standard error must not
    receive the server's log lines through a handler an earlier test installed."""
    saved = {}
    for name in _CONFIGURED_LOGGERS:
        logger = logging.getLogger(name)
        saved[name] = (list(logger.handlers), logger.propagate, logger.level)
    yield
    for name, (handlers, propagate, level) in saved.items():
        logger = logging.getLogger(name)
        logger.handlers[:] = handlers
        logger.propagate = propagate
        logger.setLevel(level)


#: Slow test files whose tests share nothing costly (no module-scoped centre): under
#: `scripts/test` each of their tests may run on whichever xdist worker is free, instead of the
#: whole file on one worker (five minutes of `test_qss_kept.py` on one worker set the wall time).
SPREAD_FILES = frozenset(
    {
        "tests/rules/test_qss_kept.py",
        "tests/rules/test_qss_oracle_compare.py",
        "tests/server/test_synthetic_calibration_100k.py",
        # Five Private-PGM fits of about a minute each on one module centre that costs seconds
        # (the CMC data set, 1 473 rows): on one worker they ended minutes after the other's.
        "tests/e2e/test_synthetic_calibration.py",
    }
)

def _unit(nodeid: str) -> str:
    """The unit of work a test belongs to on the xdist workers: itself in a spread file, else
    its file (so that a module's shared centre is built once). The balanced cluster's two
    deployments stay one unit, built in turn: built at once on the two workers, their restarts
    and kills missed their timeouts in a full run."""
    path = nodeid.split("::")[0]
    return nodeid if path in SPREAD_FILES else path


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`--dist loadscope` (`scripts/test`) with this suite's units (`_unit`) for scopes."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class Units(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _unit(nodeid)

    return Units(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On an xdist worker, the longest units first: those holding a test marked `slow`, then
    the larger files (so that no long unit starts when the other worker is almost done: the
    wall time is the busier worker's). With `--no-loadscope-reorder` (`scripts/test`) the
    scheduler hands the units out in this order."""
    if not hasattr(config, "workerinput"):
        return
    size: dict[str, int] = {}
    slow: set[str] = set()
    first: dict[str, int] = {}
    for index, item in enumerate(items):
        unit = _unit(item.nodeid)
        size[unit] = size.get(unit, 0) + 1
        first.setdefault(unit, index)
        if item.get_closest_marker("slow") is not None:
            slow.add(unit)

    def order(item: pytest.Item) -> tuple[bool, int, int]:
        unit = _unit(item.nodeid)
        return unit not in slow, -size[unit], first[unit]

    items.sort(key=order)


def _skip_unless_required(variable: str, reason: str) -> NoReturn:
    if os.environ.get(variable) == "1":
        pytest.fail(f"{variable}=1 but {reason}", pytrace=False)
    pytest.skip(reason)


def _no_docker(reason: str) -> NoReturn:
    _skip_unless_required(REQUIRE_DOCKER, reason)


@pytest.fixture(scope="session")
def missing_isolation() -> Callable[[str], NoReturn]:
    """Call with the reason when the process sandbox cannot isolate here: skips, or fails in CI."""

    def missing(reason: str) -> NoReturn:
        _skip_unless_required(REQUIRE_SANDBOX, f"process sandbox unavailable here: {reason}")

    return missing


@pytest.fixture(scope="session")
def missing_postgres() -> Callable[[str], NoReturn]:
    """Call with the reason when no PostgreSQL can be had here: skips, or fails in CI."""

    def missing(reason: str) -> NoReturn:
        _skip_unless_required(REQUIRE_POSTGRES, reason)

    return missing


@pytest.fixture(scope="session")
def docker_client() -> Iterator[Any]:
    """A client for the engine the Docker backend would use (DOCKER_HOST, else the local socket)."""
    try:
        from safeaccess.sandbox.config import DockerOptions
        from safeaccess.sandbox.docker import connect, engine_address
    except ImportError as exc:
        _no_docker(f"the Docker backend cannot be imported: {exc}")
    host = engine_address(DockerOptions())
    try:
        client = connect(host)
        client.ping()
    except Exception as exc:
        _no_docker(f"no Docker Engine answers at {host}: {exc}")
    yield client
    client.close()


@pytest.fixture(scope="session")
def sandbox_image(docker_client: Any) -> str:
    """Id of the sandbox image built from this installation (reused when nothing changed)."""
    from safeaccess.sandbox.docker import build_image

    return build_image(docker_client).image_id


@pytest.fixture(scope="session")
def forged_table_script() -> str:
    """Code of a hostile `script` that writes a fake "released table" runner response to every
    file descriptor past stderr (the runner's response channel among them), then exits without the
    runner's own response: a backend must refuse the forged output (a table for a script) and the
    server must fail the step, not release it."""
    import json

    from safeaccess.sandbox.backend import REPLY_MAGIC

    fake = {
        "ok": True,
        "output": {
            "type": "table",
            "source": "frequency_table",
            "statistic": "count",
            "row_vars": ["sex"],
            "col_vars": [],
            "row_labels": [["F"]],
            "col_labels": [[]],
            "values": [[100.0]],
            "facts": {"cells": {"counts": [[100]]}, "n_total": 100},
        },
    }
    body = json.dumps(fake).encode()
    # Framed exactly as the runner frames its own reply (the layout is public: see backend.py).
    payload = REPLY_MAGIC + len(body).to_bytes(4, "big") + body + (0).to_bytes(4, "big")
    return (
        "import os\n"
        f"payload = {payload!r}\n"
        "for fd in range(3, 20):\n"
        "    try:\n"
        "        os.write(fd, payload)\n"
        "    except OSError:\n"
        "        pass\n"
        "os._exit(0)\n"
    )


CLI_CHECKER_PASSWORD = "checker passphrase for the CLI"


@pytest.fixture()
def cli_checkers(monkeypatch: pytest.MonkeyPatch) -> Callable[[Any, str], str]:
    """Enrol output checkers (`enrol(store, name)`) and answer the review CLI's password and
    TOTP prompts for them with a fresh code each time (a code works once); any other name gets
    a wrong code."""
    import getpass

    import pyotp

    from safeaccess.server.web import accounts
    from totp_codes import OneTimeCodes

    codes: dict[str, OneTimeCodes] = {}

    def fresh(name: str) -> str:
        return codes[name].code()

    def answer(prompt: str = "") -> str:
        if prompt.startswith("password"):
            return CLI_CHECKER_PASSWORD
        name = prompt.removeprefix("current code from ").split("'s authenticator")[0]
        return fresh(name) if name in codes else "000000"

    def enrol(store: Any, name: str) -> str:
        enrolment = accounts.add_checker(store, name)
        found = accounts.enrolment_for(store, enrolment.token)
        assert found is not None
        codes[name] = OneTimeCodes(pyotp.TOTP(found[1]))
        pw = CLI_CHECKER_PASSWORD
        accounts.enrol(store, enrolment.token, pw, pw, fresh(name))
        return name

    monkeypatch.setattr(getpass, "getpass", answer)
    return enrol

