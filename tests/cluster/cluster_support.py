"""The pieces of the loopback cluster: HAProxy run with deploy/haproxy/10-safeaccess.cfg, its
runtime API, and the processes under a replica."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import ssl
import subprocess
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]
HAPROXY_CONFIG = REPO / "deploy" / "haproxy" / "10-safeaccess.cfg"
BACKEND = "safeaccess_api"


class HAProxy:
    """HAProxy in the foreground with the deployment's configuration, its values from the
    environment (as /etc/default/haproxy gives them on a host), and a global section of the
    test's own: no chroot or user switch, the log to a file, the runtime API on a socket."""

    def __init__(self, folder: Path, port: int, cert: Path, replicas: list[str], check_inter: str):
        self.folder = folder
        self.socket = folder / "haproxy.sock"
        self.log = folder / "haproxy.log"
        self.url = f"https://127.0.0.1:{port}"
        self.glob = folder / "global.cfg"
        self.glob.write_text(
            "global\n"
            "    log stderr format raw local0\n"
            f"    stats socket {self.socket} mode 600 level admin\n"
        )
        self.env = {
            **os.environ,
            "SAFEACCESS_BIND": f"127.0.0.1:{port}",
            "SAFEACCESS_TLS_CERT": str(cert),
            "SAFEACCESS_API1": replicas[0],
            "SAFEACCESS_API2": replicas[1],
            "SAFEACCESS_CHECK_INTER": check_inter,
            "SAFEACCESS_REPLICA_HEADER": "1",
        }
        self.proc: subprocess.Popen[bytes] | None = None

    def command(self, *extra: str) -> list[str]:
        """haproxy with the test's global section and the deployment's file."""
        return ["haproxy", "-f", str(self.glob), "-f", str(HAPROXY_CONFIG), *extra]

    def check(self) -> subprocess.CompletedProcess[str]:
        """`haproxy -c`: the configuration as this cluster fills it in."""
        return subprocess.run(
            self.command("-c"), env=self.env, capture_output=True, text=True, check=False
        )

    def start(self, ca_file: Path, timeout: float = 60) -> None:
        """Start, and wait until a request through it reaches a replica."""
        self.proc = subprocess.Popen(
            self.command("-db"),
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=self.log.open("wb"),
        )
        verify = ssl.create_default_context(cafile=str(ca_file))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                answer = httpx.get(self.url + "/v1/health", verify=verify, timeout=2)
                if answer.status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if self.proc.poll() is not None:
                break
            time.sleep(0.2)
        raise RuntimeError(f"haproxy did not start: {self.log.read_text()[-2000:]}")

    def stop(self) -> None:
        """Stop it (SIGTERM, then SIGKILL)."""
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def runtime(self, command: str) -> str:
        """One command of HAProxy's runtime API (the stats socket)."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(10)
            s.connect(str(self.socket))
            s.sendall(command.encode() + b"\n")
            chunks = []
            while chunk := s.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks).decode()

    def states(self) -> dict[str, str]:
        """Each replica's state as HAProxy sees it (UP, DOWN, MAINT, "DOWN 1/3"...)."""
        lines = self.runtime("show stat").splitlines()
        header = lines[0].lstrip("# ").split(",")
        rows = [dict(zip(header, line.split(","), strict=False)) for line in lines[1:] if line]
        return {
            r["svname"]: r["status"]
            for r in rows
            if r.get("pxname") == BACKEND and r["svname"] not in ("FRONTEND", "BACKEND")
        }

    def wait_for(self, server: str, state: str, timeout: float = 60) -> float:
        """Wait until `server` is in `state`; the seconds it took."""
        started = time.monotonic()
        while (seen := self.states().get(server)) != state:
            assert time.monotonic() - started < timeout, f"{server} is {seen}, not {state}"
            time.sleep(0.1)
        return time.monotonic() - started


def descendants(pid: int) -> list[int]:
    """Every process under `pid` (children first), from /proc."""
    found: list[int] = []
    queue = [pid]
    while queue:
        parent = queue.pop()
        for task in Path(f"/proc/{parent}/task").glob("*"):
            try:
                children = (task / "children").read_text().split()
            except OSError:
                continue
            for child in map(int, children):
                found.append(child)
                queue.append(child)
    return found


def signal_all(pids: list[int], sig: signal.Signals) -> None:
    """Send `sig` to each of `pids` that still exists."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
