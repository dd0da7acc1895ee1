#!/usr/bin/env python3
"""Write safeaccess.conf and pg_hba.conf for the database host from the deployment's
environment: the variables HAProxy's configuration uses (/etc/default/haproxy) plus the
database's own.

    SAFEACCESS_API1, SAFEACCESS_API2, ...  each replica's address:port (as for HAProxy)
    SAFEACCESS_WORKER_HOSTS                the worker hosts' addresses (space or comma separated)
    SAFEACCESS_DB_LISTEN                   the database host's private address
    SAFEACCESS_DB_TLS_DIR                  where make-cert.sh put server.crt and server.key
                                           (default /etc/postgresql/safeaccess-tls)

    set -a && . /etc/default/haproxy && . ./db.env && set +a
    python3 deploy/postgresql/render.py /etc/postgresql/15/main/conf.d/safeaccess.conf \\
        safeaccess-hba.conf     # then paste safeaccess-hba.conf's lines into pg_hba.conf

max_connections follows docs/deploy.md: replicas * 16 + workers * 19 + 10 + 3, rounded up to a
multiple of 50. Standard library only: it runs on a database host without the server.
"""

from __future__ import annotations

import ipaddress
import math
import os
import re
import sys
from pathlib import Path
from string import Template

HERE = Path(__file__).resolve().parent
DEFAULT_TLS_DIR = "/etc/postgresql/safeaccess-tls"


def fail(message: str) -> None:
    print(f"render.py: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def address(value: str, variable: str) -> str:
    """The host part of `address` or `address:port`, checked to be an IP address."""
    host = value.strip()
    if host.count(":") == 1:
        host = host.split(":")[0]
    try:
        return str(ipaddress.ip_address(host.strip("[]")))
    except ValueError:
        fail(f"{variable}={value!r} is not an IP address (or address:port)")
        raise


def max_connections(replicas: int, workers: int) -> int:
    needed = replicas * 16 + workers * 19 + 10 + 3
    return int(math.ceil(needed / 50) * 50)


def hba_line(host: str) -> str:
    suffix = "/128" if ":" in host else "/32"
    return f"hostssl  safeaccess  safeaccess  {host + suffix:<16} scram-sha-256"


def render(env: dict[str, str]) -> tuple[str, str]:
    replicas = [
        address(env[name], name)
        for name in sorted(
            (n for n in env if re.fullmatch(r"SAFEACCESS_API\d+", n)), key=lambda n: int(n[14:])
        )
    ]
    if not replicas:
        fail("no replica: set SAFEACCESS_API1 (and SAFEACCESS_API2...) as for HAProxy")
    workers = [
        address(w, "SAFEACCESS_WORKER_HOSTS")
        for w in re.split(r"[\s,]+", env.get("SAFEACCESS_WORKER_HOSTS", "").strip())
        if w
    ]
    listen = env.get("SAFEACCESS_DB_LISTEN")
    if not listen:
        fail("set SAFEACCESS_DB_LISTEN to the database host's private address")
    hosts = list(dict.fromkeys([*replicas, *workers]))  # a host running both: one line
    values = {
        "SAFEACCESS_DB_MAX_CONNECTIONS": str(max_connections(len(replicas), len(workers))),
        "SAFEACCESS_DB_LISTEN": address(str(listen), "SAFEACCESS_DB_LISTEN"),
        "SAFEACCESS_DB_TLS_DIR": env.get("SAFEACCESS_DB_TLS_DIR", DEFAULT_TLS_DIR),
        "SAFEACCESS_DB_HOSTS": "\n".join(hba_line(h) for h in hosts),
    }
    conf = Template((HERE / "safeaccess.conf").read_text()).substitute(values)
    hba = Template((HERE / "pg_hba.conf").read_text()).substitute(values)
    return conf, hba


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        fail("usage: render.py SAFEACCESS_CONF_OUT PG_HBA_LINES_OUT")
    conf, hba = render(dict(os.environ))
    Path(argv[0]).write_text(conf)
    Path(argv[1]).write_text(hba)
    print(f"wrote {argv[0]} and {argv[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
