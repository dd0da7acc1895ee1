"""deploy/postgresql/ for real: render.py fills the templates from HAProxy's variables,
make-cert.sh makes the certificate, and a PostgreSQL started with the rendered settings takes
a SCRAM login over verified TLS from a listed host, with max_connections from the doc's
arithmetic, and refuses a connection without TLS."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

import pytest
from sqlalchemy import create_engine, text

from pg_throwaway import ThrowawayPostgres, available

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy" / "postgresql"


def test_render_refuses_a_name_where_an_address_belongs(tmp_path: Path) -> None:
    env = {**os.environ, "SAFEACCESS_API1": "api.example:8001", "SAFEACCESS_DB_LISTEN": "::1"}
    done = subprocess.run(
        [sys.executable, str(DEPLOY / "render.py"), str(tmp_path / "a"), str(tmp_path / "b")],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2, done
    assert "SAFEACCESS_API1='api.example:8001' is not an IP address" in done.stderr
    assert not (tmp_path / "a").exists()


def test_the_rendered_postgresql_files_serve_a_verified_tls_scram_login(
    tmp_path: Path, missing_postgres: Callable[[str], NoReturn]
) -> None:
    psycopg = pytest.importorskip("psycopg")
    if not available() or shutil.which("openssl") is None:
        missing_postgres("no initdb/pg_ctl or openssl")
    postgres = ThrowawayPostgres()
    postgres.start()
    try:
        admin = create_engine(postgres.url, isolation_level="AUTOCOMMIT")
        with admin.connect() as connection:
            connection.execute(text("CREATE ROLE safeaccess LOGIN PASSWORD 'pw-43'"))
            connection.execute(text('CREATE DATABASE "safeaccess" OWNER safeaccess'))
        admin.dispose()
        postgres.stop()
        tls = Path(postgres.folder) / "tls"
        env = {
            **os.environ,
            # as /etc/default/haproxy and db.env give them (docs/deploy.md, step 2)
            "SAFEACCESS_API1": "127.0.0.1:8001",
            "SAFEACCESS_API2": "127.0.0.2:8001",
            "SAFEACCESS_WORKER_HOSTS": "127.0.0.3, 127.0.0.4",
            "SAFEACCESS_DB_LISTEN": "127.0.0.1",
            "SAFEACCESS_DB_NAME": "localhost",
            "SAFEACCESS_DB_TLS_DIR": str(tls),
        }
        made = subprocess.run(
            ["sh", str(DEPLOY / "make-cert.sh"), str(tls)],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        assert made.returncode == 0, made.stderr
        conf, hba = Path(postgres.data) / "safeaccess.conf", tmp_path / "hba-lines.conf"
        rendered = subprocess.run(
            [sys.executable, str(DEPLOY / "render.py"), str(conf), str(hba)],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        assert rendered.returncode == 0, rendered.stderr
        lines = hba.read_text()
        for host in ("127.0.0.1/32", "127.0.0.2/32", "127.0.0.3/32", "127.0.0.4/32"):
            assert f"hostssl  safeaccess  safeaccess  {host}" in lines, lines
        assert "10.0.0." not in conf.read_text()
        # The rendered lines, then initdb's local (socket) ones for `sa`: no other network rule.
        pg_hba = Path(postgres.data) / "pg_hba.conf"
        local = [line for line in pg_hba.read_text().splitlines() if line.startswith("local")]
        pg_hba.write_text(lines + "\n" + "\n".join(local) + "\n")
        with (Path(postgres.data) / "postgresql.conf").open("a") as fh:
            fh.write("include 'safeaccess.conf'\n")
        if os.geteuid() == 0:
            shutil.chown(conf, "postgres", "postgres")
        # This machine's memory, not a database host's: only shared_buffers is overridden.
        options = f"-k {postgres.folder} -p {postgres.port} -c shared_buffers=32MB"
        started = subprocess.run(
            [
                *postgres._prefix,
                postgres._pg_ctl,
                "-D",
                postgres.data,
                "-w",
                "-o",
                options,
                "-l",
                str(Path(postgres.folder) / "pg.log"),
                "start",
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        log = Path(postgres.folder) / "pg.log"
        assert started.returncode == 0, log.read_text()[-2000:] if log.exists() else started
        login = {
            "host": "127.0.0.1",
            "port": postgres.port,
            "user": "safeaccess",
            "password": "pw-43",
            "dbname": "safeaccess",
        }
        with psycopg.connect(
            **login, sslmode="verify-full", sslrootcert=str(tls / "ca.crt")
        ) as connection:
            assert connection.execute("SHOW max_connections").fetchone() == (
                "100",
            )  # 2 x 16 + 2 x 19 + 13 = 83
            assert connection.execute("SHOW ssl").fetchone() == ("on",)
            assert connection.execute("SHOW listen_addresses").fetchone() == (
                "localhost,127.0.0.1",
            )
        with pytest.raises(psycopg.OperationalError, match=r"no pg_hba\.conf entry"):
            psycopg.connect(**login, sslmode="disable").close()
    finally:
        postgres.remove()
