"""docs/deploy.md followed end to end, as its unprivileged service user, on loopback.

The test reads the doc's `sh` blocks (steps 1 to 8 and "Operations") and runs every command in
the doc's order. Each command is matched by a rule below that says how it runs here: as written,
with the doc's hosts and paths replaced by loopback and a scratch directory (`SUBSTITUTIONS`);
as the test's service user where the doc says `sudo -u safeaccess`; emulated where this machine
has no systemd (`systemctl enable --now` starts the unit's `ExecStart` as its `User=` with its
`EnvironmentFile=`), or skipped with the reason. A command the rules do not know fails the test,
so the doc and the test cannot drift apart. The prose steps between blocks (editing `api.env`,
turning the queue on, registering people and a dataset) run where the doc places them.

It ends as the doc does: PostgreSQL with the rendered files (TLS, SCRAM), two replicas and two
workers as the service user, HAProxy terminating TLS; a researcher's step through the real client
over HTTPS, and the auditor's `safeaccess audit verify`. Run as root (it creates the user); it
skips elsewhere, and fails in CI (SAFEACCESS_REQUIRE_POSTGRES=1) if it cannot run.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

import httpx
import pytest
import yaml
from cluster_support import HAProxy
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sqlalchemy import create_engine, text

from pg_throwaway import ThrowawayPostgres, available, free_port
from safeaccess.client.analyses import FrequencyTable, to_body
from safeaccess.client.keys import public_key_text
from safeaccess.client.protocol import seal
from safeaccess.client.session import connect
from safeaccess.server.demo.data import generate_census
from service_user import as_user
from tls_certs import make_tls

# one test that follows docs/deploy.md for minutes: handed out first (tests/conftest.py), so it
# does not start when the other worker is almost done
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "deploy.md"
USER = "safeaccess-doctest"
PASSWORD = "doc-43-pw"
BIN = Path(sys.prefix) / "bin"


def doc_commands(markdown: str) -> list[str]:
    """The commands of the doc's `sh` blocks, steps 1 to 8 and "Operations", in order: comment
    lines dropped, continuation lines joined, a here-document kept whole with its body."""
    body = markdown[markdown.index("## 1. ") : markdown.index("## Sizing")]
    commands: list[str] = []
    for block in re.findall(r"```sh\n(.*?)```", body, re.S):
        lines = block.splitlines()
        i = 0
        while i < len(lines):
            line = lines[i]
            i += 1
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            heredoc = re.search(r"<<'(\w+)'", line)
            if heredoc:
                end = lines.index(heredoc.group(1), i)
                commands.append("\n".join([line, *lines[i : end + 1]]))
                i = end + 1
                continue
            command = line
            while command.rstrip().endswith("\\"):
                command = command.rstrip()[:-1] + " " + lines[i].strip()
                i += 1
            commands.append(re.sub(r"\s{2,}#.*$", "", command).strip())
    return commands


@dataclass
class Site:
    """The loopback "hosts" the doc's commands run on, and what they started."""

    work: Path  # the working directory of the doc's commands (`deploy/` is the repo's)
    postgres: ThrowawayPostgres
    ports: list[int]  # the two replicas (the doc's 10.0.0.11:8001 and 10.0.0.12:8001)
    haproxy_port: int
    env: dict[str, str] = field(default_factory=lambda: dict(os.environ))
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    haproxy: HAProxy | None = None
    ca_file: Path | None = None
    researcher: Ed25519PrivateKey = field(default_factory=Ed25519PrivateKey.generate)
    auditor: Ed25519PrivateKey = field(default_factory=Ed25519PrivateKey.generate)
    done: list[str] = field(default_factory=list)  # what each command did, for the report

    def path(self, name: str) -> Path:
        return self.work / name

    @property
    def data(self) -> Path:
        return self.path("srv/data")

    def substitutions(self) -> list[tuple[str, str]]:
        """The doc's hosts and paths, in order, as they are here."""
        db = f"127.0.0.1:{self.postgres.port}"
        return [
            ("10.0.0.11:8001", f"127.0.0.1:{self.ports[0]}"),
            ("10.0.0.12:8001", f"127.0.0.1:{self.ports[1]}"),
            ('"10.0.0.21 10.0.0.22"', '"127.0.0.1"'),
            ("SAFEACCESS_DB_LISTEN=10.0.0.10", "SAFEACCESS_DB_LISTEN=127.0.0.1"),
            ("SAFEACCESS_DB_NAME=db.sac.internal", "SAFEACCESS_DB_NAME=localhost"),
            ("db.sac.internal:5432", db),
            ("db.sac.internal", db),
            ("/etc/postgresql/safeaccess-tls", str(self.path("pg-tls"))),
            ("/etc/postgresql/15/main/conf.d/", f"{self.postgres.data}/"),
            ("/srv/safeaccess", str(self.path("srv"))),
            ("/etc/safeaccess", str(self.path("etc"))),
            ("/opt/safeaccess/venv", sys.prefix),
            ("/etc/systemd/system/", str(self.path("systemd")) + "/"),
            ("/etc/default/haproxy", str(self.path("default-haproxy"))),
            ("/etc/haproxy", str(self.path("haproxy"))),
            ("https://sac.example.org", f"https://127.0.0.1:{self.haproxy_port}"),
            ("PASSWORD", PASSWORD),
        ]

    def here(self, command: str) -> str:
        """`command` with the doc's hosts, paths and service user replaced by this site's."""
        for doc, local in self.substitutions():
            command = command.replace(doc, local)
        command = re.sub(r"(-[ugo]) safeaccess\b", rf"\1 {USER}", command)
        command = re.sub(r"~safeaccess\b", str(self.path("srv")), command)
        command = re.sub(r"--no-create-home safeaccess$", f"--no-create-home {USER}", command)
        return re.sub(r"^python3 ", f"{sys.executable} ", command)

    def sh(self, command: str) -> str:
        """Run `command` with sh as root, in the work directory; its output."""
        done = subprocess.run(
            ["sh", "-c", command],
            cwd=self.work,
            env=self.env,
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )
        assert done.returncode == 0, f"{command}\n{done.stdout}\n{done.stderr}"
        return done.stdout

    def as_user(
        self, argv: list[str], env: dict[str, str] | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """`argv` as the service user with `env` on top of its own."""
        pairs = [f"{k}={v}" for k, v in (env or {}).items()]
        done = subprocess.run(
            as_user(USER, ["env", *pairs, *argv]),
            cwd=self.work,
            capture_output=True,
            text=True,
            check=False,
            timeout=180,
        )
        if check:
            assert done.returncode == 0, f"{argv}\n{done.stdout}\n{done.stderr}"
        return done

    def sudo(self, command: str, *, check: bool = True) -> subprocess.CompletedProcess[str]:
        """The doc's `sudo -u safeaccess [-H] [VAR=value ...] command`, as the service user."""
        words = shlex.split(command)
        assert words[:3] == ["sudo", "-u", USER], words
        words = [w for w in words[3:] if w != "-H"]
        env: dict[str, str] = {}
        while "=" in words[0] and not words[0].startswith("/"):
            key, value = words.pop(0).split("=", 1)
            env[key] = value
        return self.as_user(words, env, check=check)

    def admin(self, *argv: str) -> str:
        """`safeaccess-server ARGV --data-dir DATA` as the service user, with the pgpass file."""
        return self.as_user(
            [str(BIN / "safeaccess-server"), *argv, "--data-dir", str(self.data)],
            {"PGPASSFILE": str(self.path("etc/pgpass"))},
        ).stdout


# -- the rules: how each of the doc's commands runs here ----------------------------------------

Action = Callable[[Site, str], None]


def run(site: Site, command: str) -> None:
    site.sh(command)


def skip(reason: str) -> Action:
    def skipped(site: Site, command: str) -> None:
        site.done.append(f"skipped ({reason}): {command}")

    return skipped


def add_user(site: Site, command: str) -> None:
    """Debian's `adduser --system --group --home H --no-create-home NAME`; where adduser is not
    installed (a minimal image), the same with useradd."""
    if shutil.which("adduser") is None:
        home = command.split("--home ")[1].split()[0]
        command = (
            "useradd --system --user-group --no-create-home --shell /usr/sbin/nologin "
            f"--home-dir {home} {USER}"
        )
    site.sh(command)


def need(site: Site, command: str) -> None:
    """`apt-get install X`: the package must be here (the test installs nothing)."""
    for package in command.split()[2:]:
        probe = {"postgresql": "initdb", "bubblewrap": "bwrap"}.get(package, package)
        assert shutil.which(probe), f"{package} is not installed ({command})"
    if "postgresql" in command:  # the package's cluster: made now, configured in step 2
        site.postgres.start()
        site.postgres.stop()


def load_env(site: Site, command: str) -> None:
    """`set -a && . FILE && set +a`: the file's variables in the environment of what follows."""
    out = site.sh(f"{command.split(' && set +a')[0]} && set +a && env -0")
    site.env.update(dict(item.split("=", 1) for item in out.split("\0") if "=" in item))


def restart_postgresql(site: Site, command: str) -> None:
    """The doc's prose before it: the hba lines in pg_hba.conf (above initdb's local socket
    ones, the test's superuser), conf.d included; then PostgreSQL starts on the site's port."""
    postgres = site.postgres
    data = Path(postgres.data)
    local = [
        line for line in (data / "pg_hba.conf").read_text().splitlines() if line[:5] == "local"
    ]
    hba = site.path("hba-lines.conf").read_text()
    (data / "pg_hba.conf").write_text(hba + "\n" + "\n".join(local) + "\n")
    with (data / "postgresql.conf").open("a") as fh:
        fh.write("include_if_exists 'safeaccess.conf'\n")
    if os.geteuid() == 0:
        shutil.chown(data / "safeaccess.conf", "postgres", "postgres")
    log = Path(postgres.folder) / "pg.log"
    options = f"-k {postgres.folder} -p {postgres.port} -c shared_buffers=32MB"
    started = subprocess.run(
        [
            *postgres._prefix,
            *(postgres._pg_ctl, "-D", postgres.data, "-w", "-o", options),
            *("-l", str(log), "start"),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert started.returncode == 0, log.read_text()[-2000:] if log.exists() else started


def postgres_sql(statement: str) -> Action:
    """`sudo -u postgres createuser/createdb`: the same, in SQL over the local socket (the
    password given here, where the doc prompts for it)."""

    def execute(site: Site, command: str) -> None:
        admin = create_engine(site.postgres.url, isolation_level="AUTOCOMMIT")
        with admin.connect() as connection:
            connection.execute(text(statement))
        admin.dispose()

    return execute


def give_ca(site: Site, command: str) -> None:
    """Step 3 installs `ca.crt` "from step 2": carry it to this host first."""
    shutil.copy(site.path("pg-tls/ca.crt"), site.path("ca.crt"))
    site.sh(command)


def init_as_user(site: Site, command: str) -> None:
    """`init` as the user, first without PGPASSFILE (issue 43: one line, nothing left), then
    as the doc says; then the prose after it: the queue on, people and a dataset."""
    failed = site.sudo(command.replace(f"PGPASSFILE={site.path('etc/pgpass')} ", ""), check=False)
    assert failed.returncode != 0
    assert "fe_sendauth: no password supplied" in failed.stderr, failed.stderr
    assert "PGPASSFILE" in failed.stderr and "Traceback" not in failed.stderr, failed.stderr
    assert len(failed.stderr.strip().splitlines()) == 1, failed.stderr
    assert not site.data.exists() or not any(site.data.iterdir()), list(site.data.iterdir())
    site.sudo(command)


def as_service_user(site: Site, command: str) -> None:
    site.sudo(command)


def check_listing(site: Site, command: str) -> None:
    """`ls -l DATA`: the key and config.yaml are the user's, mode 0600. Then the prose of step
    3: the job queue on before any replica starts, and people and a dataset registered."""
    listing = site.sh(command)
    for name in ("server_key.pem", "config.yaml"):
        line = next(x for x in listing.splitlines() if x.endswith(name))
        assert line.startswith("-rw------- ") and f" {USER} " in line, listing
    config = site.data / "config.yaml"
    settings = yaml.safe_load(config.read_text())
    queue = yaml.safe_load(re.search(r"```yaml\n(.*?)```", DOC.read_text(), re.S).group(1))
    settings.update(queue)
    tmp = site.path("config.yaml")
    tmp.write_text(yaml.safe_dump(settings))
    site.as_user(["sh", "-c", f"cat '{tmp}' > '{config}'"])
    register(site)


def register(site: Site) -> None:
    """docs/server.md's "A first week": a project, a researcher, an auditor, a dataset."""
    for name, key in (("ada", site.researcher), ("eve", site.auditor)):
        site.path(f"{name}.pub").write_text(public_key_text(key.public_key()))
        pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        site.path(f"{name}.key").write_bytes(pem)
        site.path(f"{name}.key").chmod(0o600)
    generate_census(2000, seed=7).to_parquet(site.path("census.parquet"))
    shutil.copy(REPO / "docs" / "examples" / "census.yaml", site.path("census.yaml"))
    for name in ("ada.pub", "eve.pub", "census.parquet", "census.yaml"):
        site.path(name).chmod(0o644)
    site.admin("project", "add", "health")
    site.admin(
        "researcher", "add", "ada", "--public-key", str(site.path("ada.pub")), "--project", "health"
    )
    site.admin("auditor", "add", "eve", "--public-key", str(site.path("eve.pub")))
    site.admin(
        "dataset",
        "add",
        "census",
        "--data",
        str(site.path("census.parquet")),
        "--metadata",
        str(site.path("census.yaml")),
        "--project",
        "health",
    )
    site.path("centre.pub").write_text(site.admin("key", "show"))


def unit(site: Site, name: str, instance: str, env_file: Path, extra: dict[str, str]) -> None:
    """`systemctl enable --now NAME@INSTANCE` without systemd: the unit's ExecStart, %i and
    ${VARS} filled from its EnvironmentFile (and `extra`), as its User with its UMask."""
    text_ = site.path(f"systemd/{name}@.service").read_text().replace("\\\n", " ")
    fields = dict(
        line.split("=", 1) for line in text_.splitlines() if re.match(r"^[A-Z]\w+=", line)
    )
    assert fields["User"] == "safeaccess" and fields["EnvironmentFile"] == "/etc/safeaccess/" + (
        env_file.name
    ), fields
    env = {
        key: value
        for key, value in (
            line.split("=", 1)
            for line in env_file.read_text().splitlines()
            if re.match(r"^[A-Z][A-Z0-9_]*=", line)
        )
    }
    env.update(extra)
    start = re.sub(r"\$\{(\w+)\}", lambda m: env[m.group(1)], fields["ExecStart"])
    argv = shlex.split(site.here(start.replace("%i", instance)))
    log = site.path(f"{name}-{instance}.log")
    pairs = [f"{k}={v}" for k, v in env.items()]
    proc = subprocess.Popen(
        as_user(USER, ["env", *pairs, *argv], umask=fields["UMask"]),
        cwd=site.work,
        stdout=subprocess.PIPE,
        stderr=log.open("wb"),
    )
    site.processes.append(proc)
    if name == "safeaccess-worker":
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert b"ready" in line, log.read_text()[-3000:]
        return
    deadline = time.monotonic() + 180
    while True:
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(f"http://127.0.0.1:{instance}/v1/health", timeout=5).status_code == 200:
                return
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.2)


def edit(site: Site, path: Path, values: dict[str, str]) -> None:
    """The prose's edits of an installed env file: its paths as here, then `values`."""
    lines = site.here(path.read_text()).splitlines()
    lines = [line for line in lines if line.split("=", 1)[0] not in values]
    path.write_text("\n".join([*lines, *(f"{k}={v}" for k, v in values.items())]) + "\n")


def start_replicas(site: Site, command: str) -> None:
    """Step 5 on each of the two API hosts: api.env edited as the doc says, the unit started."""
    env_file = site.path("etc/api.env")
    edit(site, env_file, {"PGPASSFILE": str(site.path("etc/pgpass"))})
    for port in site.ports:
        unit(site, "safeaccess-api", str(port), env_file, {})


def curl(site: Site, command: str) -> None:
    """The doc's `curl` checks, answered as its comments say."""
    if shutil.which("curl") is None:  # (a minimal image): the same GET with httpx
        url = site.here(command).split()[-1]
        out = httpx.get(url, verify=str(site.ca_file) if site.ca_file else True, timeout=30).text
    else:
        cafile = f"--cacert {site.ca_file} " if site.ca_file is not None else ""
        out = site.sh(site.here(command).replace("curl -s ", f"curl -s {cafile}"))
    if command.endswith("/v1/health"):
        assert '"status":"ok"' in out and '"sandbox_mode":"forkserver"' in out.replace(" ", ""), out
    else:  # /v1/ready before any worker runs (the doc's next paragraph)
        assert "no worker is registered with the job queue" in out, out


def start_workers(site: Site, command: str) -> None:
    """Step 6 on each worker host (`w2 on the second host`): worker.env as the doc says."""
    env_file = site.path("etc/worker.env")
    edit(
        site, env_file, {"PGPASSFILE": str(site.path("etc/pgpass")), "SAFEACCESS_WORKER_SLOTS": "1"}
    )
    for name in ("w1", "w2"):
        unit(
            site,
            "safeaccess-worker",
            name,
            env_file,
            {"SAFEACCESS_WORKER_METRICS_PORT": str(free_port())},
        )


def journal(site: Site, command: str) -> None:
    log = site.path("safeaccess-worker-w1.log").read_text()
    assert re.search(r"worker w1: \d+ slot\(s\) on steps, \d+ script slot\(s\)", log), log


def haproxy_pem(site: Site, command: str) -> None:
    """The centre's certificate, chain and key: from a CA of the test's own."""
    site.ca_file, pem = make_tls(site.work)
    blocks = re.findall(r"-----BEGIN [^-]+-----.*?-----END [^-]+-----\n", pem.read_text(), re.S)
    site.path("sac.crt").write_text("".join(b for b in blocks if "CERTIFICATE" in b))
    site.path("chain.crt").write_text("")
    site.path("sac.key").write_text("".join(b for b in blocks if "PRIVATE KEY" in b))
    site.sh(site.here(command))


def check_haproxy(site: Site, command: str) -> None:
    """`set -a && . /etc/default/haproxy ... haproxy -c`, once its values are this site's."""
    edit(
        site,
        site.path("default-haproxy"),
        {
            "SAFEACCESS_BIND": f"127.0.0.1:{site.haproxy_port}",
            "SAFEACCESS_API1": f"127.0.0.1:{site.ports[0]}",
            "SAFEACCESS_API2": f"127.0.0.1:{site.ports[1]}",
            "SAFEACCESS_CHECK_INTER": "200ms",  # the test does not wait production's 2 s
        },
    )
    out = subprocess.run(
        ["sh", "-c", site.here(command)], cwd=site.work, capture_output=True, text=True, check=False
    )
    assert out.returncode == 0 and "Configuration file is valid" in out.stdout + out.stderr, out


def restart_haproxy(site: Site, command: str) -> None:
    """HAProxy with the installed 10-safeaccess.cfg and /etc/default/haproxy's values; its
    global section is the test's (00-global.cfg's chroot, user and socket are a host's)."""
    values = dict(
        line.split("=", 1)
        for line in site.path("default-haproxy").read_text().splitlines()
        if re.match(r"^[A-Z][A-Z0-9_]*=", line)
    )
    assert site.ca_file is not None
    site.haproxy = HAProxy(
        site.work,
        site.haproxy_port,
        Path(values["SAFEACCESS_TLS_CERT"]),
        [values["SAFEACCESS_API1"], values["SAFEACCESS_API2"]],
        values["SAFEACCESS_CHECK_INTER"],
    )
    site.haproxy.start(site.ca_file)


def show_stat(site: Site, command: str) -> None:
    assert site.haproxy is not None
    site.haproxy.wait_for("api1", "UP")
    site.haproxy.wait_for("api2", "UP")


def audit_verify(site: Site, command: str) -> None:
    """The auditor's check through HAProxy (with the centre's CA, as the doc says after)."""
    verify = site.here(command).replace(
        "safeaccess audit verify ", f"{BIN / 'safeaccess'} audit verify --ca-bundle {site.ca_file} "
    )
    site.sh(verify)
    # "Then a researcher runs the README's sequence against https://sac.example.org"
    sealed = seal(
        [to_body(FrequencyTable(rows=["region"]))],
        site.researcher,
        researcher="ada",
        project="health",
        dataset="census",
        server="my-centre",
    )
    with connect(
        f"https://127.0.0.1:{site.haproxy_port}", site.researcher, "ada", ca_bundle=site.ca_file
    ) as ada:
        step = ada.open(sealed)
    assert step.released and step.output is not None, step
    site.done.append(f"released through HAProxy: {step.output}")


def queue_command(site: Site, command: str) -> None:
    """Operations: the queue's commands as the service user (`on any host with PGPASSFILE`)."""
    words = shlex.split(site.here(command))
    out = site.as_user(
        [str(BIN / words[0]), *words[1:]], {"PGPASSFILE": str(site.path("etc/pgpass"))}
    ).stdout
    if words[2] == "status":
        # the step served through HAProxy; w1 and w2, each a steps and a scripts loop
        assert "succeeded 1" in out and "(4 claim loops registered)" in out, out


RULES: list[tuple[str, Action]] = [  # the first that matches
    (r"^install -m 0644 ca\.crt ", lambda site, c: give_ca(site, site.here(c))),
    (r"^adduser --system ", lambda site, c: add_user(site, site.here(c))),
    (r"^install ", lambda site, c: site.sh(site.here(c))),
    (r"^python3 -m venv ", skip("the test's own virtual environment")),
    (r"/bin/pip install ", skip("scripts/setup; tests/server/test_plain_install.py installs them")),
    (r"^apt-get install ", need),
    (r"^cat > db.env <<'END'", lambda site, c: site.sh(site.here(c))),
    (r"^set -a && \. \./db\.env && set \+a$", lambda site, c: load_env(site, site.here(c))),
    (r"^sh deploy/postgresql/make-cert\.sh ", lambda site, c: site.sh(site.here(c))),
    (r"^python3 deploy/postgresql/render\.py ", lambda site, c: site.sh(site.here(c))),
    (r"^systemctl restart postgresql$", restart_postgresql),
    (
        r"^sudo -u postgres createuser --pwprompt safeaccess$",
        postgres_sql(f"CREATE ROLE safeaccess LOGIN PASSWORD '{PASSWORD}'"),
    ),
    (
        r"^sudo -u postgres createdb --owner safeaccess safeaccess$",
        postgres_sql('CREATE DATABASE "safeaccess" OWNER safeaccess'),
    ),
    (r"^echo '.*' > /etc/safeaccess/pgpass$", lambda site, c: site.sh(site.here(c))),
    (r"^sudo -u safeaccess .* init ", lambda site, c: init_as_user(site, site.here(c))),
    (r"^ls -l ", lambda site, c: check_listing(site, site.here(c))),
    (r"^sudo -u safeaccess ", lambda site, c: as_service_user(site, site.here(c))),
    (r"^systemctl daemon-reload$", skip("no systemd here: the units are started as it would")),
    (r"^systemctl enable --now safeaccess-api@8001$", start_replicas),
    (r"^curl -s ", curl),
    (r"^systemctl enable --now safeaccess-worker@w1$", start_workers),
    (r"^journalctl -u safeaccess-worker@w1$", journal),
    (r"^cat sac\.crt chain\.crt sac\.key > ", haproxy_pem),
    (r"^(chmod|cp) ", lambda site, c: site.sh(site.here(c))),
    (r"^set -a && \. /etc/default/haproxy && set \+a && haproxy -c ", check_haproxy),
    (r"^systemctl restart haproxy$", restart_haproxy),
    (r"^echo \"show stat\" \| socat ", show_stat),
    (r"^safeaccess audit verify ", audit_verify),
    (r"^safeaccess-server queue (status|failed) ", queue_command),
    (r"^safeaccess-server queue (retry|fail) ", skip("tests/cluster/test_queue_workers.py")),
]


@pytest.fixture
def site(missing_postgres: Callable[[str], NoReturn]) -> Iterator[Site]:
    if os.geteuid() != 0:
        missing_postgres("following docs/deploy.md creates its service user: run as root")
    for tool in ("useradd", "setpriv", "haproxy", "openssl", "bwrap"):
        if shutil.which(tool) is None:
            missing_postgres(f"following docs/deploy.md needs {tool}")
    if not available():
        missing_postgres("no initdb/pg_ctl")
    with contextlib.suppress(KeyError):
        pwd.getpwnam(USER)
        subprocess.run(["userdel", USER], check=False)
    work = Path(tempfile.mkdtemp(prefix="deploy-doc-"))
    work.chmod(0o755)
    (work / "deploy").symlink_to(REPO / "deploy")
    (work / "systemd").mkdir()  # a host's /etc/systemd/system
    site = Site(work, ThrowawayPostgres(), [free_port(), free_port()], free_port())
    site.env["PATH"] = f"{BIN}:{site.env.get('PATH', '')}"
    try:
        yield site
    finally:
        if site.haproxy is not None:
            site.haproxy.stop()
        for proc in site.processes:
            proc.terminate()
        for proc in site.processes:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
        site.postgres.remove()
        subprocess.run(["userdel", USER], check=False, capture_output=True)
        shutil.rmtree(work, ignore_errors=True)


def test_docs_deploy_md_followed_end_to_end_as_its_service_user(site: Site) -> None:
    commands = doc_commands(DOC.read_text())
    unknown = [c for c in commands if not any(re.search(rule, c) for rule, _ in RULES)]
    assert not unknown, f"docs/deploy.md has commands this test does not follow: {unknown}"
    for command in commands:
        action = next(action for rule, action in RULES if re.search(rule, command))
        action(site, command)
        site.done.append(command)
    # The replicas and workers ran as the service user, each worker with the fork server.
    uid = pwd.getpwnam(USER).pw_uid
    for proc in site.processes:
        assert Path(f"/proc/{proc.pid}").stat().st_uid == uid
    assert all(proc.poll() is None for proc in site.processes)
