"""The R package `safeaccess` (r/) against a real centre: `R CMD INSTALL` into a temporary
library, then its testthat suite (r/tests/testthat, which starts one demo centre for the whole
suite) with this interpreter, the project's .venv, as reticulate's Python. Any R test failure
fails this test. Skipped when R or its packages are missing, unless SAFEACCESS_REQUIRE_R is set
(.ci/run sets it and installs Debian's r-base-core, r-cran-reticulate, r-cran-testthat and
r-cran-processx)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

# installs the R package and drives a centre through reticulate: handed out first
# (tests/conftest.py), so it does not start when the other worker is almost done
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
R_PACKAGES = ("reticulate", "testthat", "processx", "withr")
DEBIAN = "r-base-core r-cran-reticulate r-cran-testthat r-cran-processx"


def _missing(what: str) -> None:
    message = f"{what} (Debian: apt-get install {DEBIAN})"
    if os.environ.get("SAFEACCESS_REQUIRE_R"):
        pytest.fail(f"SAFEACCESS_REQUIRE_R is set but {message}")
    pytest.skip(message)


def _tail(process: subprocess.CompletedProcess[str], lines: int = 80) -> str:
    return "\n".join((process.stdout + process.stderr).splitlines()[-lines:])


def test_r_package_suite(tmp_path: Path) -> None:
    if shutil.which("R") is None or shutil.which("Rscript") is None:
        _missing("R is not installed")
    check = "\n".join(
        f'if (!requireNamespace("{p}", quietly = TRUE)) cat("{p}\\n")' for p in R_PACKAGES
    )
    absent = subprocess.run(
        ["Rscript", "-e", check], capture_output=True, text=True, check=True
    ).stdout.split()
    if absent:
        _missing(f"the R packages {', '.join(absent)} are not installed")

    library = tmp_path / "library"
    library.mkdir()
    installed = subprocess.run(
        # No test load or byte compilation: the suite loads the package itself, in seconds less.
        ["R", "CMD", "INSTALL", "--no-test-load", "--no-byte-compile", f"--library={library}", str(REPO / "r")],
        capture_output=True,
        text=True,
    )
    assert installed.returncode == 0, _tail(installed)

    env = {
        **os.environ,
        "RETICULATE_PYTHON": sys.executable,
        "R_LIBS": os.pathsep.join(filter(None, [str(library), os.environ.get("R_LIBS")])),
        "TMPDIR": str(tmp_path),
    }
    suite = subprocess.run(
        [
            "Rscript",
            "-e",
            'testthat::test_dir("r/tests/testthat", reporter = "summary", stop_on_failure = TRUE)',
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert suite.returncode == 0, _tail(suite)
    assert "Skipped" not in suite.stdout, _tail(suite)  # every R test ran
