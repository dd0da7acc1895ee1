"""A plain install (no extras) serves on SQLite: psycopg and procrastinate, which only the
`postgresql` extra installs, are imported only where PostgreSQL is configured.

A centre on SQLite is served by `safeaccess-server serve` in a child process, and a
researcher's step is released through the real client:

- always, in this environment with psycopg and procrastinate made unimportable (a
  `sitecustomize` on the child's path refuses them, as their absence would);
- with SAFEACCESS_PACKAGING_TEST=1, also in a fresh virtual environment where pip installed
  client/ rules/ sandbox/ server/ from the repository without extras (about 90 s, most of it
  fetching the dependencies' wheels; pip's configured index or find-links serve them offline).

The distributions' metadata is checked too: psycopg and procrastinate are required only by the
`postgresql` extra.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import venv
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import httpx
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from packaging.requirements import Requirement

from safeaccess.client.keys import fingerprint, public_key_text
from safeaccess.client.session import connect
from safeaccess.server.config import DataDir, initialise
from safeaccess.server.datasets import register_dataset
from safeaccess.server.demo.data import census_metadata, generate_census
from safeaccess.server.store import Store

# pip-installs the four distributions into a fresh venv in CI (SAFEACCESS_PACKAGING_TEST=1):
# handed out first (tests/conftest.py), so it does not start when the other worker is almost done
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
POSTGRESQL_ONLY = ("psycopg", "procrastinate")
BLOCKER = """
import importlib.abc, sys

class _Absent(importlib.abc.MetaPathFinder):
    # What a plain install lacks: the `postgresql` extra's packages.
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {blocked!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None

sys.meta_path.insert(0, _Absent())
"""


def test_psycopg_and_procrastinate_are_required_only_by_the_postgresql_extra() -> None:
    requires = [Requirement(r) for r in metadata.requires("safeaccess-server") or []]
    for name in POSTGRESQL_ONLY:
        found = [r for r in requires if r.name == name]
        assert found, f"{name} is not among the server's requirements: {requires}"
        for requirement in found:
            marker = requirement.marker
            assert marker is not None, requirement  # required by every install
            assert marker.evaluate({"extra": "postgresql"}), requirement
            assert not marker.evaluate({"extra": ""}), requirement


def _centre(root: Path, key: Ed25519PrivateKey) -> None:
    """A centre on SQLite with a project, a researcher and a dataset (made here: only `serve`
    runs in the environment under test)."""
    config = initialise(root, server_id="plain")
    data = DataDir(root)
    store = Store(data.database_url(config))
    try:
        store.add_project("p1")
        public = key.public_key()
        store.add_researcher("ada", public_key_text(public), fingerprint(public), ["p1"])
        register_dataset(
            data,
            store,
            name="census",
            frame=generate_census(2000, seed=3),
            metadata=census_metadata("census"),
            project="p1",
        )
    finally:
        store.close()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _serve_and_release(
    python: Path, root: Path, env: dict[str, str], log: Path, start_seconds: float = 120
) -> None:
    """Serve the centre, release one step through the real client, and check the log."""
    key = Ed25519PrivateKey.generate()
    _centre(root, key)
    port = _free_port()
    command = ["serve", "--data-dir", str(root), "--port", str(port)]
    proc = subprocess.Popen(
        [str(python), "-m", "safeaccess.server.admin.cli", *command],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=log.open("wb"),
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + start_seconds
        while True:
            try:
                if httpx.get(url + "/v1/ready", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "the server did not become ready"
            time.sleep(0.1)
        with connect(url, key, "ada") as session:
            plan = session.plan("census").frequency_table(rows="region")
            result = session.open(session.seal(plan))
        assert result.released, result
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    text = log.read_text()
    assert "Traceback" not in text, text[-3000:]


def test_without_the_postgresql_packages_the_server_serves_on_sqlite(tmp_path: Path) -> None:
    blocker = tmp_path / "blocker"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text(BLOCKER.format(blocked=set(POSTGRESQL_ONLY)))
    env = {**os.environ, "PYTHONPATH": str(blocker)}
    # The blocker works: the child cannot import them.
    probe = subprocess.run(
        [sys.executable, "-c", "import psycopg"], env=env, capture_output=True, check=False
    )
    assert probe.returncode != 0 and b"No module named 'psycopg'" in probe.stderr
    _serve_and_release(Path(sys.executable), tmp_path / "data" / "centre", env, tmp_path / "log")


@pytest.fixture
def plain_venv(tmp_path: Path) -> Iterator[Path]:
    if os.environ.get("SAFEACCESS_PACKAGING_TEST") != "1":
        pytest.skip("set SAFEACCESS_PACKAGING_TEST=1 to pip-install the four distributions")
    target = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(target)
    python = target / "bin" / "python"
    # This environment's pip installs into the new one (--python): no pip to bootstrap there.
    done = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-compile", "-q"]
        + [str(REPO / d) for d in ("client", "rules", "sandbox", "server")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    yield python


def test_a_plain_pip_install_of_the_four_distributions_serves_on_sqlite(
    plain_venv: Path, tmp_path: Path
) -> None:
    check = subprocess.run(
        [str(plain_venv), "-c", "import psycopg"], capture_output=True, check=False
    )
    assert check.returncode != 0, "psycopg was installed without the postgresql extra"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    # The first start compiles every module of the new environment (installed --no-compile).
    _serve_and_release(plain_venv, tmp_path / "data" / "centre", env, tmp_path / "log", 600)
